# skaffold (issue 20): `skaffold.yaml` builds the images through the same daemonless path as
# `make images` (a custom builder) and installs the chart. A test runs `skaffold build` against a
# registry on loopback (Debian's docker-registry, the CNCF distribution registry) and `skaffold
# render` of the result, so the file is validated. Included by the top Makefile before its test
# targets.

SKAFFOLD_BUILD := hack/skaffold/build.sh
# Debian's /usr/bin/docker-registry; its system service is not started (the test starts its own).
REGISTRY_PACKAGES := docker-registry=docker-registry

TEST_PREREQS += skaffold registry-package

##@ skaffold

.PHONY: skaffold
skaffold: ## Build skaffold from its Go module pin (hack/skaffold) into the tools' cache; no-op when built.
	@hack/preflight.sh go
	@$(SKAFFOLD_BUILD) >/dev/null

.PHONY: registry-package
registry-package: ## Install Debian's docker-registry with apt-get, its system service not started; no-op when there.
	@hack/without-service-start.sh hack/host-packages.sh $(REGISTRY_PACKAGES)
