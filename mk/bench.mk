# Benchmarks of issue 5 (docs/bench.md): results, table and plots under bench/results/<stamp>/.
#   make bench         full run: front end vs vLLM's server at c=1,4,16 x3, policy vs defaults, decode vs bandwidth
#   make bench-quick   one repetition at c=4, front end only (< 5 min); last line: the front-end throughput ratio
BENCH_STAMP := $(VENV)/.bench-installed

.PHONY: bench bench-quick

$(BENCH_STAMP): pyproject.toml | $(STAMP)
	$(PY) -m pip install -q -e '.[bench]'
	touch $@

bench: setup $(BENCH_STAMP)
	$(PY) -m service bench $(BENCH_ARGS)

bench-quick: setup $(BENCH_STAMP)
	$(PY) -m service bench --quick $(BENCH_ARGS)
