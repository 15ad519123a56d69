# The service's kernels (service/kernels/ggml_build.py): ggml's CPU library and llama.cpp's (libllama) from the same
# llama.cpp source as the bench's peer (mk/bench.mk), built for this CPU (-march=native), then the torch op library
# over ggml, each library's sha256 recorded in the stamp, which every load checks. Part of `make setup`; the images
# build them at their first start on a CPU instead. Without them the service says so and runs vLLM's kernels.
#   make kernels        build them all, afresh (about two minutes on 2 cores)
.PHONY: kernels

# One build per CPU flags set (-march=native): service/facts/software.py looks for the one of the CPU it runs on.
GGML_DIR := .cache/ggml/$(shell grep -m1 '^flags' /proc/cpuinfo | md5sum | cut -c1-12)
GGML_STAMP := $(GGML_DIR)/kernel/built.json

kernels: $(GGML_STAMP)

setup: kernels

$(GGML_STAMP): service/kernels/ggml_linear.cpp service/kernels/bf16_linear.cpp service/kernels/ggml_build.py mk/kernels.mk $(LLAMA_CPP_SOURCE) | $(STAMP)
	$(PY) -m service.kernels.ggml_build $(LLAMA_CPP_TREE)/vendor/llama.cpp "ggml from llama-cpp-python $(LLAMA_CPP_VERSION)"

# llama.cpp's own library (libllama) is built with them, from the same tree, and recorded with them: the reference the
# GGUF architecture tests check the service's answers against (tests/support/llama_cpp.py), and the service's GGUF
# check at start (service/models/llama_cpp_reference.py), which never builds it: running the build tree's build.ninja
# would run what the cache holds.
#   make llama-lib      the same as make kernels
.PHONY: llama-lib

llama-lib: kernels

# The AVX2-only code paths on a CPU with AVX-512 (tests/support/avx2_emulation: vLLM's _C_AVX2 build, torch and
# oneDNN at AVX2, the service's kernels built for haswell and the CPU read as AVX2-only), for the integration tests
# whose paths differ there. Not part of `make test`: on an AVX2-only CPU that is these paths already.
#   make test-avx2-emulated [AVX2_TESTS="tests/integration/test_x.py ..."]
.PHONY: test-avx2-emulated
AVX2_TESTS ?= tests/integration/test_quantized.py tests/integration/test_platform.py tests/integration/test_real_model.py

test-avx2-emulated: setup test-tools $(LLAMA_CPP_SOURCE)
	AVX2_EMULATION_LLAMA_CPP=$(LLAMA_CPP_TREE)/vendor/llama.cpp $(PY) -m tests.support.avx2_emulation -q $(AVX2_TESTS)
