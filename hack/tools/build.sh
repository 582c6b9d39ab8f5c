#!/usr/bin/env bash
# Build the pinned Kubernetes tools (kube-apiserver, kube-controller-manager,
# kube-scheduler, kube-proxy, kubelet, etcd, a minimal CoreDNS, helm, kind's
# local-path-provisioner) into a cache outside git.
#
# Why one `go build` for all of them: they share most of their dependency graph
# (apimachinery, client-go, grpc, prometheus, ...), and a single invocation
# compiles each shared package once. The cache directory is keyed by a hash of
# go.mod, go.sum, everything under cmd/ and this script, so a change of pin
# builds a new directory and an unchanged pin is a no-op (just prints the bin
# directory).
#
# kube-proxy needs `nft` and `conntrack` at run time; `make host-packages`
# installs them (they are Debian packages, not Go programs).
#
# What it does not do: it does not install the tools on PATH, and it never
# deletes older cache directories (remove ~/.cache/broker-failover/tools by
# hand to reclaim space).
#
# Usage: hack/tools/build.sh            build if needed; the LAST line of
#                                       output is the bin directory
#        hack/tools/build.sh --print    print the bin directory, build nothing
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib/go-build.sh
source "$here/../lib/go-build.sh"
cache_root="$go_tools_cache_root"
# The hash covers the names and contents of every file under cmd/, so a new
# command or a changed main.go builds a new directory.
pin_hash="$(
  cd "$here" && {
    cat go.mod go.sum build.sh
    find cmd -type f | LC_ALL=C sort
    find cmd -type f -print0 | LC_ALL=C sort -z | xargs -0 cat
  } | sha256sum | cut -c1-16
)"
bin_dir="$cache_root/$pin_hash/bin"
# The binaries and the packages they are built from, in the same order.
tools=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet etcd coredns helm)
targets=(
  k8s.io/kubernetes/cmd/kube-apiserver
  k8s.io/kubernetes/cmd/kube-controller-manager
  k8s.io/kubernetes/cmd/kube-scheduler
  k8s.io/kubernetes/cmd/kube-proxy
  k8s.io/kubernetes/cmd/kubelet
  ./cmd/etcd
  ./cmd/coredns
  helm.sh/helm/v3/cmd/helm
)
# kind's local-path-provisioner imports logrus under its old name, github.com/Sirupsen/logrus,
# while the others import github.com/sirupsen/logrus; one `go build` refuses both spellings in
# one load ("case-insensitive import collision"). So it gets a second `go build` in this same
# module, after the first: the same versions of client-go and the rest, whose compiled packages
# it takes from Go's build cache (about five packages of its own to compile, seconds).
second_tool=local-path-provisioner
second_target=github.com/rancher/local-path-provisioner

if [[ "${1:-}" == "--print" ]]; then
  echo "$bin_dir"
  exit 0
fi

if all_present "$bin_dir" "${tools[@]}" "$second_tool"; then
  echo ">> tools up to date (pins $pin_hash)" >&2
  echo "$bin_dir"
  exit 0
fi

new_scratch "$cache_root/$pin_hash"

start=$SECONDS
echo ">> building ${tools[*]} $second_tool (pins $pin_hash) into $bin_dir" >&2
echo ">> the first build downloads modules and compiles ~2800 packages; expect many minutes" >&2

cd "$here"
echo ">> [$((SECONDS - start))s] downloading modules" >&2
nice -n 10 go mod download
echo ">> [$((SECONDS - start))s] modules ready" >&2

# Stamp versions as the projects' own release builds do; unstamped, kube-apiserver
# reports v0.0.0-master on /version, and helm then refuses charts with a kubeVersion.
kube_version="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
helm_version="$(go list -m -f '{{.Version}}' helm.sh/helm/v3)"
coredns_version="$(go list -m -f '{{.Version}}' github.com/coredns/coredns)"
local_path_version="$(go list -m -f '{{.Version}}' github.com/rancher/local-path-provisioner)"
kube_minor="$(cut -d. -f2 <<<"$kube_version")"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$kube_minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit=$kube_version"
done
ldflags+=" -X helm.sh/helm/v3/internal/version.version=$helm_version -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$kube_minor"
done
# CoreDNS's own builds put the commit here; `coredns -version` prints it.
ldflags+=" -X github.com/coredns/coredns/coremain.GitCommit=$coredns_version"
# No DWARF from the compiler either: the linker drops it anyway (-w), and generating it is about a
# tenth of the compile (client-go's 566 packages, empty cache, 2026-11-26: 247 CPU-s, 223 without).
build_flags=(-trimpath "-gcflags=all=-dwarf=false" "-ldflags=$ldflags")
# local-path-provisioner's release builds set its main.VERSION (`--version` prints it). Only its
# own link gets this flag: the flags are recorded in each binary, and the others stay as they were.
second_build_flags=(-trimpath "-gcflags=all=-dwarf=false" "-ldflags=$ldflags -X main.VERSION=$local_path_version")

go_build_with_progress "${targets[@]}"

echo ">> [$((SECONDS - start))s] compiling and linking $second_target (a go build of its own, same module)" >&2
build_flags=("${second_build_flags[@]}")
go_build_with_progress "$second_target"

install_scratch "$bin_dir" "${tools[@]}" "$second_tool"
echo ">> [$((SECONDS - start))s] built ${tools[*]} $second_tool into $bin_dir" >&2
echo "$bin_dir"
