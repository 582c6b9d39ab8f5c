# Container images (issue 20): every image the chart and the local cluster run, built from the
# repository's Dockerfiles with Debian's buildah and mmdebstrap, no daemon, no registry, nothing
# pulled. See docs/images.md. Included by the top Makefile before its test targets.

# What the build and the image tests run, and the Debian packages that have them.
IMAGE_PACKAGES := buildah=buildah mmdebstrap=mmdebstrap containerd=containerd ctr=containerd runc=runc \
  /usr/lib/cni/bridge=containernetworking-plugins

TEST_PREREQS += images

##@ Images

.PHONY: image-packages
image-packages: ## Install buildah, mmdebstrap, containerd, runc and the CNI plugins (Debian) with apt-get; no-op when there.
	@hack/host-packages.sh $(IMAGE_PACKAGES)

.PHONY: images
images: image-packages venv tools images-without-tools ## Build every image from its Dockerfile without a daemon into OCI archives under ~/.cache/broker-failover/images (cached by content).
	@$(BIN)/python -m local_cluster.image_build

# The images that need no Go tool, so that under `make -j` they build while the tools compile
# (only the CoreDNS image packs a tool). `make test` runs its prerequisites that way.
.PHONY: images-without-tools
images-without-tools: image-packages venv
	@$(BIN)/python -m local_cluster.image_build --without-tools >/dev/null

# uv compiles the images' hash locks (hack/images/lock.py says why uv); pinned so a refresh is
# repeatable, and installed into the project's virtualenv only when a refresh asks for it.
UV_VERSION := 0.13.8

.PHONY: images-lock
images-lock: venv ## Recompile the images' Python locks with hashes (hack/images/locks/) from pyproject.toml.
	@$(BIN)/uv --version 2>/dev/null | grep -qx "uv $(UV_VERSION)" || $(BIN)/pip install --quiet --disable-pip-version-check "uv==$(UV_VERSION)"
	UV=$(BIN)/uv $(BIN)/python hack/images/lock.py

.PHONY: images-base-lock
images-base-lock: image-packages venv ## Record the Debian base's packages and versions (hack/images/debian-base-<arch>.lock) after reviewing a change.
	@$(BIN)/python -m local_cluster.image_build --lock-base
