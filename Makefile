# agentrun developer entry points. `make demo` and `make test` do all set-up on a fresh machine.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEVCLUSTER := PYTHONPATH=hack $(PY) -m devcluster

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@# the distribution was called agentrun before it became agentrun-k8s: drop that install of this checkout
	$(PY) -m pip uninstall --quiet --yes agentrun 2>/dev/null || true
	rm -rf operator/agentrun.egg-info
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

.PHONY: venv
venv: $(VENV)/.installed ## create .venv with agentrun and the test tools

.PHONY: chromium
chromium: ## Chromium from the distribution's packages, for the console's browser tests (apt-get, as root)
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" != 0 ]; then echo "chromium is missing: as root, apt-get install chromium" >&2; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; }

.PHONY: binaries
binaries: ## build (or reuse) etcd, kube-apiserver, controller-manager, scheduler, kubectl, helm, otelcol, versitygw
	bash hack/build-control-plane.sh all
	bash hack/build-otelcol.sh
	bash hack/build-versitygw.sh

.PHONY: helm
helm: ## build (or reuse) helm alone: what the unit tests (chart rendering) and manifests need
	bash hack/build-control-plane.sh helm

.PHONY: crds
crds: venv ## regenerate crds/ from the pydantic models (then `make manifests` for the chart's copy)
	$(PY) -m agentrun.api.crdgen

.PHONY: docs
docs: venv ## regenerate docs/state-machine.md from the Run's table (core/runs/table.py)
	$(PY) hack/state_machine_doc.py

.PHONY: manifests
manifests: venv helm ## regenerate the chart's generated parts and manifests/ (CRDs, RBAC, values schema)
	$(PY) -m agentrun.deploy.generate

.PHONY: e2e
e2e: venv binaries ## Helm chart end to end on its own local control plane (AGENTRUN_E2E_KUBECONFIG: any cluster)
	$(PY) -m pytest tests/e2e

# The images' tag is the chart's appVersion: the chart, examples/ and the README name them so.
VERSION := $(shell sed -n 's/^appVersion: *"\(.*\)"/\1/p' charts/agentrun/Chart.yaml)
IMAGES := agentrun/operator:$(VERSION) agentrun/agent:$(VERSION)
.PHONY: images
images: ## docker build the operator image (Dockerfile) and the agent image (Dockerfile.agent, runs examples/)
	docker build -t agentrun/operator:$(VERSION) .
	docker build -f Dockerfile.agent -t agentrun/agent:$(VERSION) .

.PHONY: kind
kind: venv binaries ## a kind cluster with the chart installed from images built here (then: source .devcluster/kind.env)
	bash hack/kind/up.sh

.PHONY: kind-down
kind-down: ## delete the cluster of `make kind`, and stop the Docker Engine if `make kind` started it
	bash hack/kind/down.sh

# A fresh cluster of its own (agentrun-e2e), deleted afterwards: the tests install the chart themselves.
E2E_KIND := KIND_CLUSTER=agentrun-e2e AGENTRUN_KIND_KUBECONFIG=$(CURDIR)/.devcluster/kind-e2e.kubeconfig
.PHONY: e2e-kind
e2e-kind: venv binaries ## the Helm e2e tests in real Pods, on a fresh kind cluster built like `make kind`'s (make test's last stage)
	$(E2E_KIND) bash hack/kind/up.sh fresh
	status=0; AGENTRUN_E2E_KUBECONFIG=.devcluster/kind-e2e.kubeconfig AGENTRUN_E2E_OPERATOR_IMAGE=agentrun/operator:$(VERSION) \
		AGENTRUN_E2E_AGENT_IMAGE=agentrun/agent:$(VERSION) \
		AGENTRUN_E2E_STORE_IMAGE=agentrun/versitygw:$$(bash hack/build-versitygw.sh print-version) \
		AGENTRUN_E2E_PREVIOUS_OPERATOR_IMAGE=agentrun/operator:previous AGENTRUN_E2E_PREVIOUS_AGENT_IMAGE=agentrun/agent:previous \
		$(PY) -m pytest tests/e2e $(E2E_ARGS) || status=$$?; \
	if [ -z "$(KEEP_E2E_CLUSTER)" ]; then $(E2E_KIND) bash hack/kind/up.sh delete; fi; exit $$status

.PHONY: lint
lint: venv ## ruff (lint + format), mypy strict (package, tests, hack, bench), import-linter contracts
	$(VENV)/bin/ruff check operator hack tests bench
	$(VENV)/bin/ruff format --check operator hack tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

.PHONY: fmt
fmt: venv ## apply ruff fixes and formatting
	$(VENV)/bin/ruff check --fix operator hack tests bench
	$(VENV)/bin/ruff format operator hack tests bench

.PHONY: unit
unit: venv helm lint ## lint and the unit tests; builds no control plane (of the binaries, helm only)
	$(PY) -m pytest tests/unit

# Test files run in parallel, one control plane per worker (tests/support/schedule.py orders them); the
# durations of the slowest tests are printed at the end. Then the kind stage: the Helm e2e tests and the
# README's Helm quickstart in real Pods (make e2e-kind).
TEST_WORKERS ?= 2
.PHONY: test
test: venv binaries chromium lint ## everything: lint, unit, integration (local control plane), e2e (Helm chart), and on kind
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=40 --durations-min=5 -m "not kind" tests
	$(MAKE) e2e-kind

.PHONY: screenshots
screenshots: venv binaries chromium ## the console's browser tests, writing their screenshots into docs/console/
	AGENTRUN_SCREENSHOTS=$(CURDIR)/docs/console $(PY) -m pytest tests/integration/test_console.py tests/integration/test_console_decisions.py

.PHONY: bench
bench: venv binaries ## benchmarks on local control planes (~25 min; not part of test): bench/REPORT.md
	PYTHONPATH=hack:tests $(PY) bench/run_all.py $(BENCH_ARGS)

.PHONY: chaos
chaos: venv binaries ## 2,000 faults against ticket Runs, then the invariants (~80 min, bounded; not in test)
	PYTHONPATH=hack:tests $(PY) bench/chaos.py --profile full --report bench/chaos.json --summary bench/CHAOS.md $(CHAOS_ARGS)

.PHONY: cluster
cluster: venv binaries ## start the local control plane + node agent (then: source .devcluster/env)
	$(DEVCLUSTER) up

.PHONY: operator
operator: venv binaries ## on `make cluster`: CRDs, admission policies, and the operator from this checkout (again: restart)
	$(DEVCLUSTER) install

.PHONY: cluster-down
cluster-down: venv ## stop the local control plane started by `make cluster` (and the operator of `make operator`)
	$(DEVCLUSTER) down

.PHONY: demo
demo: venv binaries ## the main job, narrated, on the local control plane
	$(DEVCLUSTER) demo

.PHONY: clean
clean: ## remove the venv and local cluster state (the binary cache stays)
	-$(DEVCLUSTER) down 2>/dev/null
	rm -rf $(VENV) .devcluster .mypy_cache .ruff_cache .pytest_cache
