#!/usr/bin/env bash
# Build the pinned Kubernetes control-plane tools (kube-apiserver,
# kube-controller-manager, etcd, helm) into a cache outside git.
#
# Why one `go build` for all four: they share most of their dependency graph
# (apimachinery, client-go, grpc, etcd client, ...), and a single invocation
# compiles each shared package once. The cache directory is keyed by a hash of
# go.mod, go.sum, cmd/ and this script, so a change of pin builds a new
# directory and an unchanged pin is a no-op (just prints the bin directory).
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
cache_root="${BROKER_FAILOVER_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/broker-failover/tools}"
pin_hash="$(cd "$here" && cat go.mod go.sum build.sh cmd/etcd/main.go | sha256sum | cut -c1-16)"
bin_dir="$cache_root/$pin_hash/bin"
tools=(kube-apiserver kube-controller-manager etcd helm)

if [[ "${1:-}" == "--print" ]]; then
  echo "$bin_dir"
  exit 0
fi

complete=1
for tool in "${tools[@]}"; do
  [[ -x "$bin_dir/$tool" ]] || complete=0
done
if [[ $complete == 1 ]]; then
  echo ">> tools up to date (pins $pin_hash)" >&2
  echo "$bin_dir"
  exit 0
fi

# Build into a scratch directory next to the final one and rename at the end,
# so an interrupted build never leaves a half-filled bin directory that a later
# run would take as complete.
mkdir -p "$cache_root/$pin_hash"
scratch="$(mktemp -d "$cache_root/$pin_hash/build.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT

export CGO_ENABLED=0
# The pinned go directive is satisfied by the installed Go; never download a
# toolchain in CI.
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export GOFLAGS="-mod=readonly"

start=$SECONDS
echo ">> building ${tools[*]} (pins $pin_hash) into $bin_dir" >&2
echo ">> the first build downloads modules and compiles ~3000 packages; expect many minutes" >&2

cd "$here"
echo ">> [$((SECONDS - start))s] downloading modules" >&2
nice -n 10 go mod download
echo ">> [$((SECONDS - start))s] modules ready; compiling" >&2

# `go build -v` names every package as it is compiled; turn that stream into a
# progress line every 100 packages plus one whenever a command (tool) is linked.
# Anything else (compile errors) is passed through unchanged.
report_build_progress() {
  local line count=0
  while IFS= read -r line; do
    case "$line" in
      k8s.io/kubernetes/cmd/kube-apiserver | k8s.io/kubernetes/cmd/kube-controller-manager | \
        broker-failover/hack/tools/cmd/etcd | helm.sh/helm/v3/cmd/helm)
        echo ">>   [$((SECONDS - start))s] compiling and linking command $line" ;;
      *[!a-zA-Z0-9._~/-]* | "")
        echo "$line" ;;
      *)
        count=$((count + 1))
        if ((count % 100 == 0)); then
          echo ">>   [$((SECONDS - start))s] $count packages compiled (now $line)"
        fi ;;
    esac
  done
}
# Stamp versions as the projects' own release builds do; unstamped, kube-apiserver
# reports v0.0.0-master on /version, and helm then refuses charts with a kubeVersion.
kube_version="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
helm_version="$(go list -m -f '{{.Version}}' helm.sh/helm/v3)"
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

nice -n 10 go build -v -trimpath -ldflags="$ldflags" -o "$scratch/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  ./cmd/etcd \
  helm.sh/helm/v3/cmd/helm 2>&1 | report_build_progress >&2

for tool in "${tools[@]}"; do
  if [[ ! -x "$scratch/$tool" ]]; then
    echo ">> build did not produce $tool; see the errors above" >&2
    exit 1
  fi
done
rm -rf "$bin_dir"
mv "$scratch" "$bin_dir"
trap - EXIT
echo ">> [$((SECONDS - start))s] built ${tools[*]} into $bin_dir" >&2
echo "$bin_dir"
