# Local Kubernetes control plane for the e2e tests (issue 5): the Go-built
# tools and a kind-like cluster-up/cluster-down. See docs/local-cluster.md.
# Included by the top Makefile before its test targets, so the tools are built
# before `make test` and `make e2e` run.

TOOLS_BUILD := hack/tools/build.sh
CLUSTER_DIR ?= .cache/cluster
# `make cluster-up NODES=3`: that many nodes (node-1 ... node-N), each a kubelet, containerd and
# kube-proxy in a network namespace of its own; 1 (the default) is the single `local-node`.
NODES ?= 1

# Programs kube-proxy runs (nftables mode, conntrack cleanup) and the Debian packages that have them.
HOST_PACKAGES := nft=nftables conntrack=conntrack

TEST_PREREQS += tools host-packages

# What every target that starts the local cluster needs, in the order make takes them: the checks
# and the Debian packages first, so that a machine without root or apt-get stops within a second
# with one line that names what is missing, not minutes later inside kube-proxy's log. `cluster-up`,
# `demo`, `soak` and the cluster benchmarks take exactly this list (tests/unit/test_make_prereqs.py).
CLUSTER_PREREQS := preflight-cluster host-packages image-packages venv tools images

##@ Local cluster

.PHONY: tools
tools: ## Build kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, kubelet, etcd, coredns (minimal CoreDNS), helm and local-path-provisioner from the Go pins (cached outside git; no-op when built).
	@hack/preflight.sh go
	@$(TOOLS_BUILD) >/dev/null

.PHONY: preflight-cluster
preflight-cluster: ## Check what the project does not install itself (Python with venv, Go, kubectl, root and apt-get), one line each.
	@hack/preflight.sh python go kubectl root

.PHONY: host-packages
host-packages: ## Install nft and conntrack (Debian nftables, conntrack) for kube-proxy with apt-get; no-op when both are there.
	@hack/host-packages.sh $(HOST_PACKAGES)

.PHONY: cluster-up
cluster-up: $(CLUSTER_PREREQS) ## Start the cluster in the background: control plane, a real kubelet on containerd running our images, kube-proxy, CoreDNS, in a sealed namespace (NODES=3: three nodes). Prints the export KUBECONFIG line.
	@$(BIN)/python -m local_cluster.cluster up --workdir $(CLUSTER_DIR) --tools-dir "$$($(TOOLS_BUILD) --print)" --nodes $(NODES)

.PHONY: shell
shell: venv ## A shell inside the running cluster's network (pod IPs, ClusterIPs, service DNS), KUBECONFIG set.
	@$(BIN)/python -m local_cluster.cluster shell --workdir $(CLUSTER_DIR)

.PHONY: cluster-down
cluster-down: venv ## Stop the cluster started by cluster-up and every process it started.
	@$(BIN)/python -m local_cluster.cluster down --workdir $(CLUSTER_DIR)
