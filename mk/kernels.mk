# The service's ggml kernel (service/kernels/ggml_linear.*): ggml's CPU library from the same llama.cpp source as the
# bench's peer (mk/bench.mk), built for this CPU (-march=native) without OpenMP, since torch's thread pool calls it;
# then the torch op library over it. Part of `make setup`; a service without it says so and runs vLLM's kernels.
#   make kernels        build both (about a minute on 2 cores)
.PHONY: kernels

# One build per CPU flags set (-march=native): service/facts/software.py looks for the one of the CPU it runs on.
GGML_DIR := .cache/ggml/$(shell grep -m1 '^flags' /proc/cpuinfo | md5sum | cut -c1-12)
GGML_STAMP := $(GGML_DIR)/kernel/built.json

kernels: $(GGML_STAMP)

setup: kernels

$(GGML_STAMP): service/kernels/ggml_linear.cpp service/kernels/bf16_linear.cpp service/kernels/ggml_build.py mk/kernels.mk $(LLAMA_CPP_SOURCE) | $(STAMP)
	cmake -S $(LLAMA_CPP_TREE)/vendor/llama.cpp -B $(GGML_DIR)/build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
	  -DGGML_OPENMP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	  -DLLAMA_BUILD_SERVER=OFF >/dev/null
	cmake --build $(GGML_DIR)/build -j $$(nproc) --target ggml
	$(PY) -m service.kernels.ggml_build $(LLAMA_CPP_TREE)/vendor/llama.cpp $(GGML_DIR)/build \
	  "ggml from llama-cpp-python $(LLAMA_CPP_VERSION)"
