# Benchmarks of issue 5 (README.md, "Benchmarks"): results, table and plots under bench/results/<stamp>/.
#   make bench         full run: front end vs vLLM's server at c=1,4,16 x3, policy vs defaults, decode vs bandwidth
#   make bench-quick   one repetition at c=4, front end only (< 5 min); last line: the front-end throughput ratio
# The `bench` extra (matplotlib, py-spy) is installed by `make setup`.
.PHONY: bench bench-quick

bench: setup
	$(PY) -m service bench $(BENCH_ARGS)

bench-quick: setup
	$(PY) -m service bench --quick $(BENCH_ARGS)
