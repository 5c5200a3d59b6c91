# Ebbflow — `make help` lists every target.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST := $(PY) -m pytest
TOOLS_BIN := $(CURDIR)/.tools/bin
# `make tools` builds these (hack/build-tools.sh's names); empty: its default set.
TOOLS ?=
# What `make demo` needs of that set (not SeaweedFS, which only the trainer tier's tests use).
DEMO_TOOLS := kubernetes etcd kwok helm kind prometheus kueue
KUBECONFIG_LOCAL := $(CURDIR)/.cluster/kubeconfig
export PATH := $(TOOLS_BIN):$(PATH)
# Go's caches for the tools and images built here live in the project's cache, not the user's own,
# so hack/free-build-caches.sh may remove them when the kind nodes need the disk.
EBBFLOW_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/ebbflow
export GOMODCACHE ?= $(EBBFLOW_CACHE)/go/mod
export GOCACHE ?= $(EBBFLOW_CACHE)/go/build
# Sources that decide whether the editable install is current.
INSTALL_STAMP := $(VENV)/.installed
# uv installs: it unpacks each wheel once into its per-machine cache and hard-links the files into the
# venv, so a warm machine's install takes seconds and the 4.5 GB of torch wheels take no second copy
# on disk (docs/ci.md, "The virtualenv").
UV_VERSION := 0.13.9
UV := $(VENV)/bin/uv
export UV_CACHE_DIR ?= $(EBBFLOW_CACHE)/uv
export UV_LINK_MODE ?= hardlink
PYPROJECTS := pyproject.toml api/pyproject.toml operator/pyproject.toml trainer-image/pyproject.toml \
	sim/pyproject.toml devtools/pyproject.toml

.PHONY: help demo install tools cluster-up cluster-down lint typecheck test test-unit test-trainer \
	test-gpu test-integration test-e2e crds base-image images images-test kind-images kind-up \
	kind-smoke kind-down bench-operator bench-trainer bench-peers bench-vs-kubeflow sim-native clean

help: ## List every target with one line.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# The shipped distributions' dependencies (torch and its CUDA libraries: 5 GB) come from the
# per-machine wheelhouse the images install from too, so a machine downloads them once; everything is
# pinned as in the images (hack/images/constraints.txt). The development tools come from PyPI.
$(INSTALL_STAMP): $(PYPROJECTS) hack/images/constraints.txt hack/images/wheelhouse.sh
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@test -x $(UV) || $(PY) -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	wheelhouse=$$(PYTHON=$(PYTHON) bash hack/images/wheelhouse.sh) && \
	$(UV) pip install --quiet --python $(PY) --no-index --find-links "$$wheelhouse" \
		--constraint hack/images/constraints.txt -e ./api -e ./operator -e './trainer-image[hf]' && \
	$(UV) pip install --quiet --python $(PY) --find-links "$$wheelhouse" \
		--constraint hack/images/constraints.txt -e './sim[plot]' -e './devtools[testing]' -e '.[dev]'
	@touch $@

install: $(INSTALL_STAMP) ## Virtualenv in .venv with an editable install and all extras.

tools: ## Build the pinned tools (default: control plane, kubectl, etcd, KWOK, Helm, kind, Prometheus, Kueue, SeaweedFS; or TOOLS="...") into .tools/bin (cached per machine).
	@bash hack/build-tools.sh $(TOOLS)

cluster-up: install tools ## Start a local control plane with fake GPU nodes; kubeconfig in .cluster/kubeconfig.
	@$(PY) -m ebbflow_devtools up
	@$(TOOLS_BIN)/kubectl --kubeconfig $(KUBECONFIG_LOCAL) get nodes \
		-o custom-columns='NAME:.metadata.name,READY:.status.conditions[?(@.type=="Ready")].status,GPUS:.status.capacity.nvidia\.com/gpu,PRODUCT:.metadata.labels.nvidia\.com/gpu\.product,CAPACITY:.metadata.labels.karpenter\.sh/capacity-type'

demo: install ## The main job (the README's first command): kind cluster, operator by helm, digits trained through a node lost and regained.
	@bash hack/build-tools.sh $(DEMO_TOOLS)
	$(PY) -m ebbflow_devtools.demo

cluster-down: ## Stop the local control plane; leaves no process behind.
	@if [ -x $(PY) ]; then $(PY) -m ebbflow_devtools down; else echo "not running"; fi

lint: ## ruff check and format check.
	@$(VENV)/bin/ruff check .
	@$(VENV)/bin/ruff format --check .

typecheck: ## mypy (strict) over both packages.
	@$(VENV)/bin/mypy

test: install tools ## Everything CI runs: lint, typecheck, unit, trainer and integration tiers; under CI=true also e2e.
ifeq ($(CI),true)
	@bash hack/ci-test.sh
else
	@$(MAKE) --no-print-directory lint typecheck
	$(PYTEST) -m "unit or trainer or integration" tests
endif

test-unit: install ## Unit tier: pure logic and trainer maths, no API.
	$(PYTEST) -m unit tests

test-trainer: install ## Trainer tier: real trainer processes, gloo, torch elastic rendezvous (and SeaweedFS's S3 gateway).
	@bash hack/build-tools.sh seaweedfs
	$(PYTEST) -m trainer tests

test-gpu: install ## GPU tier: the CUDA tests (one GPU; nccl on two) and the unit tests' CUDA parameters, via hack/gpu-check.sh.
	PYTHON=$(PY) GPU_CHECK_INSTALL=0 bash hack/gpu-check.sh

test-integration: install tools ## Integration tier: real control plane with KWOK GPU nodes.
	$(PYTEST) -m integration tests

test-e2e: install tools ## End-to-end tier: real pods on the kind cluster (builds and loads images; minutes cold). See e2e/.
	$(PYTEST) e2e

crds: install ## Regenerate crds/ from the API models (api/ebbflow_api/models.py).
	$(PY) -m ebbflow_api.crd > crds/ebbflow.dev_elastictrainingjobs.yaml

base-image: ## Python base image (ebbflow/python:dev) from Debian packages, without a registry; cached per machine.
	@bash hack/images/build-images.sh base

images: ## Base, operator and trainer images (ebbflow/*:dev, trainer also :dev-cpu); cached, rebuilt when inputs change. See docs/images.md.
	@bash hack/images/build-images.sh

images-test: images ## Smoke-test the images: read-only root, non-root, offline, a two-node training run.
	@bash hack/images/smoke-test.sh

kind-images: tools ## kind base and node images built offline from Debian packages and the Go module proxy (cached); see hack/kind/README.md.
	@bash hack/kind/build-node-image.sh

kind-up: tools ## kind cluster "ebbflow" (1 control plane, 3 workers, flannel, CoreDNS); kubeconfig in .cluster/kind-kubeconfig.
	@bash hack/kind/up.sh

kind-smoke: ## Check the kind cluster: DNS and Service IPs from a pod on every worker, a PVC write.
	@bash hack/kind/smoke.sh

kind-down: ## Delete the kind cluster (cached images stay).
	@bash hack/kind/down.sh

bench-operator: install tools ## Operator benchmark: 100 jobs on 500 fake GPU nodes (about 12 min); see bench/README.md.
	$(PY) bench/operator_bench.py

bench-trainer: install ## Trainer rescale-pause benchmark against stock torchrun; see bench/README.md.
	$(PY) bench/trainer_rescale.py

# DLRover imports protobuf without declaring it: 5.29 runs its generated code (made with 4.25) and
# satisfies OpenTelemetry's protobuf >= 5. TorchFT comes without its dependencies, which would bring
# a second torch.
bench-peers: install ## TorchFT 0.2.0 and DLRover 0.6.1 for bench/trainer_rescale.py, in .tools/bench-peers (not project dependencies; the venv's torch serves them).
	$(VENV)/bin/pip install -q --target .tools/bench-peers --upgrade "dlrover[k8s]==0.6.1" protobuf==5.29.5 \
		opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2
	$(VENV)/bin/pip install -q --target .tools/bench-peers --upgrade --no-deps torchft==0.2.0

sim-native: install ## The simulator's hot modules compiled with mypyc into build/sim-native (checked to decide as the source does); use with PYTHONPATH=build/sim-native.
	@bash hack/sim-native.sh

bench-vs-kubeflow: install tools ## Ebbflow vs Kubeflow's elastic PyTorchJob on fresh kind clusters, same disruptions, each three times (2 h 15 min measured; Ebbflow alone 23 min); see bench/README.md.
	$(PY) bench/vs_kubeflow.py

clean: cluster-down ## Remove the venv, built tools in .tools and cluster state (the per-machine tool cache stays).
	rm -rf $(VENV) .tools .cluster .pytest_cache .mypy_cache .ruff_cache

.PHONY: chart-crds chart-lint

chart-crds: crds ## Regenerate crds/ and copy it into the Helm chart (charts/ebbflow/files/crds/, byte-identical).
	cp crds/ebbflow.dev_elastictrainingjobs.yaml charts/ebbflow/files/crds/ebbflow.dev_elastictrainingjobs.yaml

chart-lint: install tools ## helm lint the chart (defaults and every switch on) and run its unit tests.
	$(TOOLS_BIN)/helm lint --strict charts/ebbflow
	$(TOOLS_BIN)/helm lint --strict charts/ebbflow --set watchNamespaces='{team-a,team-b}' \
		--set metrics.serviceMonitor.enabled=true --set metrics.podMonitor.enabled=true \
		--set dashboard.enabled=true
	$(PYTEST) tests/unit/test_chart.py
