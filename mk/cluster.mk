# Local Kubernetes control plane for the e2e tests (issue 5): the Go-built
# tools and a kind-like cluster-up/cluster-down. See docs/local-cluster.md.
# Included by the top Makefile before its test targets, so the tools are built
# before `make test` and `make e2e` run.

TOOLS_BUILD := hack/tools/build.sh
CLUSTER_DIR ?= .cache/cluster

# Programs kube-proxy runs (nftables mode, conntrack cleanup) and the Debian
# packages that have them.
HOST_PROGRAMS := nft conntrack
HOST_PACKAGES := nftables conntrack

TEST_PREREQS += tools host-packages

##@ Local cluster

.PHONY: tools
tools: ## Build kube-apiserver, kube-controller-manager, kube-proxy, etcd, coredns (minimal CoreDNS) and helm from the Go pins (cached outside git; no-op when built).
	@$(TOOLS_BUILD) >/dev/null

# apt-get update only when the install fails (a stale or empty package index),
# so the usual case makes no network round trip for the index.
.PHONY: host-packages
host-packages: ## Install nft and conntrack (Debian nftables, conntrack) for kube-proxy with apt-get; no-op when both are on PATH.
	@missing=""; for p in $(HOST_PROGRAMS); do command -v $$p >/dev/null || missing+=" $$p"; done; \
	if [[ -z "$$missing" ]]; then exit 0; fi; \
	if [[ "$$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then \
	  echo "host-packages: kube-proxy needs$$missing, not on PATH; installing the Debian packages $(HOST_PACKAGES) needs root and apt-get" \
	    "(running as $$(id -un), apt-get $$(command -v apt-get || echo 'not found')). Install them by hand, or add their directory (often /usr/sbin) to PATH." >&2; \
	  exit 1; \
	fi; \
	echo ">> installing $(HOST_PACKAGES) (kube-proxy needs$$missing)" >&2; \
	export DEBIAN_FRONTEND=noninteractive; \
	apt-get install -y --no-install-recommends $(HOST_PACKAGES) \
	  || { apt-get update && apt-get install -y --no-install-recommends $(HOST_PACKAGES); } \
	  || { echo "host-packages: apt-get could not install $(HOST_PACKAGES); see its output above" >&2; exit 1; }; \
	for p in $(HOST_PROGRAMS); do command -v $$p >/dev/null \
	  || { echo "host-packages: $$p still not on PATH after installing $(HOST_PACKAGES)" >&2; exit 1; }; done

.PHONY: cluster-up
cluster-up: venv tools host-packages ## Start the cluster in the background: control plane, node agent, kube-proxy, CoreDNS, a real pod network in a sealed namespace. Prints the export KUBECONFIG line.
	@$(BIN)/python -m local_cluster.cluster up --pod-network --workdir $(CLUSTER_DIR) --tools-dir "$$($(TOOLS_BUILD) --print)"

.PHONY: shell
shell: venv ## A shell inside the running cluster's network (pod IPs, ClusterIPs, service DNS), KUBECONFIG set.
	@$(BIN)/python -m local_cluster.cluster shell --workdir $(CLUSTER_DIR)

.PHONY: cluster-down
cluster-down: venv ## Stop the cluster started by cluster-up and every process it started.
	@$(BIN)/python -m local_cluster.cluster down --workdir $(CLUSTER_DIR)
