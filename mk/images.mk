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
images: venv image-packages tools ## Build every image from its Dockerfile without a daemon into OCI archives under ~/.cache/broker-failover/images (cached by content).
	@$(BIN)/python -m local_cluster.image_build
