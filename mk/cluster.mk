# Local Kubernetes control plane for the e2e tests (issue 5): the Go-built
# tools and a kind-like cluster-up/cluster-down. See docs/local-cluster.md.
# Included by the top Makefile before its test targets, so the tools are built
# before `make test` and `make e2e` run.

TOOLS_BUILD := hack/tools/build.sh
CLUSTER_DIR ?= .cache/cluster

TEST_PREREQS += tools

##@ Local cluster

.PHONY: tools
tools: ## Build kube-apiserver, kube-controller-manager, etcd and helm from the Go pins (cached outside git; no-op when built).
	@$(TOOLS_BUILD) >/dev/null

.PHONY: cluster-up
cluster-up: venv tools ## Start etcd, kube-apiserver, kube-controller-manager and the node agent in the background; prints the export KUBECONFIG line.
	@$(BIN)/python -m local_cluster.cluster up --workdir $(CLUSTER_DIR) --tools-dir "$$($(TOOLS_BUILD) --print)"

.PHONY: cluster-down
cluster-down: venv ## Stop the cluster started by cluster-up and every process it started.
	@$(BIN)/python -m local_cluster.cluster down --workdir $(CLUSTER_DIR)
