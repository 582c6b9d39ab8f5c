# broker-failover: targets in the kubebuilder tradition. `make help` lists them.
# Every target installs what it needs itself: a virtualenv under .venv (ignored
# by git) and, for the Kubernetes tests, the Go-built control plane (make tools).

SHELL := /bin/bash
.DEFAULT_GOAL := help
.SHELLFLAGS := -eu -o pipefail -c

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
VENV_STAMP := $(VENV)/.installed
PYTEST := $(BIN)/pytest

# Fragments owned by the parts (Go tool builds, local cluster, ...). They may add
# to TEST_PREREQS, so they are read before the test targets below.
TEST_PREREQS :=
-include $(wildcard mk/*.mk)

##@ General

.PHONY: help
help: ## Show the targets.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

$(VENV_STAMP): pyproject.toml
	@echo ">> creating $(VENV) with $(PYTHON) and installing broker-failover (editable) with test and lint extras"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test,lint]'
	touch $@

.PHONY: venv
venv: $(VENV_STAMP) ## Create the virtualenv and install the project (re-runs when pyproject.toml changes).

##@ Development

.PHONY: lint
lint: venv ## ruff (lint and format check) and mypy; must be clean.
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

.PHONY: fmt
fmt: venv ## Format and auto-fix with ruff.
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The groups of TEST_PREREQS that `make test` builds behind the tests, each GROUP=TARGET,TARGET
# (hack/test-behind-prerequisites.sh): the Go tools at once (they need no venv, and most tests
# that need anything need them), with promtool (Debian's prometheus: the chart's rule tests need it
# and helm, tests/monitoring), the images that need no tool beside them once the venv is there,
# then one after another the rest; skaffold's compile last, behind the e2e tests. A test names its
# group with a `needs` marker or by its folder (tests/conftest.py).
TEST_PREREQ_GROUPS := tools=tools,monitoring-packages base-images=host-packages,images-without-tools cluster=images \
  bench=bench-packages,perf-test-jar skaffold=skaffold,registry-package

# On a fresh machine the prerequisites take about 20 minutes of two cores, so they build behind the
# tests at the lowest priority while lint and the tests that need none of them run; the tests
# marked second_stream run beside the others.
.PHONY: test
test: ## Everything CI runs: lint, then every test (unit, integration, e2e).
	@hack/preflight.sh python go kubectl java root
	@hack/test-behind-prerequisites.sh "$(TEST_PREREQS)" $(TEST_PREREQ_GROUPS) -- $(PYTEST) tests --durations=30

.PHONY: unit
unit: venv ## Unit and property tests only (fast, no processes).
	$(PYTEST) tests/unit

.PHONY: integration
integration: venv ## Real brokers, simulators and operator on loopback.
	$(PYTEST) tests/integration

.PHONY: validator
validator: venv ## The ordering validator's tests (real Spark local[2], real brokers for its log tests).
	$(PYTEST) tests/unit/validator tests/validator

.PHONY: e2e
e2e: venv $(TEST_PREREQS) ## Tests against a real kube-apiserver built from Go modules.
	$(PYTEST) tests/e2e

##@ Demo

.PHONY: demo
demo: $(CLUSTER_PREREQS) ## The user's path on the local cluster: helm install, kubectl apply, traffic, kill -9, failover, the validator's verdict.
	$(BIN)/python -m demo.kubernetes

.PHONY: demo-local
demo-local: venv ## The failover engine without Kubernetes (local runner, three brokers, kill -9, failback, ordering check).
	$(BIN)/python -m demo

##@ Benchmarks (each prints its headline as name=value on its last line)

.PHONY: bench
bench: bench-broker bench-tls-handshake bench-failover bench-failover-k8s bench-operator-upgrade-k8s bench-drain bench-operator bench-operator-k8s bench-validator ## Run every benchmark.

.PHONY: bench-smoke
bench-smoke: venv $(TEST_PREREQS) ## Every benchmark in small (one round, a few hundred messages, a small store), as make test runs them: tests/bench.
	$(PYTEST) tests/bench

.PHONY: bench-broker
bench-broker: venv ## Broker throughput: backend simulator to cloud simulator through one Active broker.
	$(BIN)/python bench/bench_broker.py

.PHONY: bench-failover
bench-failover: venv ## Failover latency: kill -9, SIGSTOP and planned switchover under traffic.
	$(BIN)/python bench/bench_failover.py

.PHONY: bench-failover-k8s
bench-failover-k8s: $(CLUSTER_PREREQS) ## Failover through the real -active Service on the sealed local cluster: 20 kill -9 and 20 partitions.
	$(BIN)/python bench/bench_failover_k8s.py

.PHONY: bench-operator-upgrade-k8s
bench-operator-upgrade-k8s: $(CLUSTER_PREREQS) ## helm upgrade of the operator alone, 5 times under 200 msg/s through the real -active Service, the chart's defaults: the longest pause in confirmed traffic against the normal gap.
	$(BIN)/python bench/bench_operator_upgrade_k8s.py

.PHONY: bench-drain
bench-drain: $(CLUSTER_PREREQS) ## kubectl drain of the active's node, 10 times under 200 msg/s, on three real nodes: the switchover's gap and the drain's duration.
	$(BIN)/python bench/bench_drain.py

.PHONY: soak
soak: $(CLUSTER_PREREQS) ## Chaos soak on a sealed cluster of three nodes: 200 pod, node and API server faults under traffic, checked by the simulators and the ordering validator.
	$(BIN)/python -m local_cluster.soak --faults 200

.PHONY: bench-operator
bench-operator: venv ## Operator scale: clusters heartbeated at 1 Hz by one operator process.
	$(BIN)/python bench/bench_operator.py

.PHONY: bench-operator-k8s
bench-operator-k8s: venv tools ## The real operator, as two shards, against a real API server holding 2,000 BrokerClusters: its API writes, reads and the watch events while steady; then its upgrade, restart and kill -9, read at the brokers' leases.
	$(BIN)/python bench/bench_operator_k8s.py --shards 2

.PHONY: bench-validator
bench-validator: venv ## Validator throughput: Spark local[2] vs DuckDB on a 10M-record store, full and incremental.
	$(BIN)/python bench/bench_validator.py

.PHONY: clean
clean: ## Remove the virtualenv and caches (not the Go tool cache).
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
