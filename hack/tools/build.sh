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
cache_root="${BROKER_FAILOVER_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/broker-failover/tools}"
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

complete=1
for tool in "${tools[@]}" "$second_tool"; do
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
build_flags=(-trimpath "-ldflags=$ldflags")
# local-path-provisioner's release builds set its main.VERSION (`--version` prints it). Only its
# own link gets this flag: the flags are recorded in each binary, and the others stay as they were.
second_build_flags=(-trimpath "-ldflags=$ldflags -X main.VERSION=$local_path_version")

# How many packages `go build -v` will name, at most: the non-main packages
# `go list` calls stale with these flags, i.e. not in Go's build cache (`go
# build -v` names only the packages it compiles). It is an upper bound: on a
# warm cache the build names a few percent fewer, so the last line may stop
# short of 100%. Commands get a line of their own and are not counted. If the
# count fails, progress is reported without a total.
commands=" $(go list "${build_flags[@]}" -f '{{.ImportPath}}' "${targets[@]}" | tr '\n' ' ')"
read -r all_packages to_compile < <(
  go list "${build_flags[@]}" -deps -f '{{if ne .Name "main"}}{{.Stale}}{{end}}' "${targets[@]}" |
    awk '$1 != "" { all++ } $1 == "true" { stale++ } END { print all + 0, stale + 0 }'
) || true
echo ">> [$((SECONDS - start))s] compiling at most ${to_compile:=0} of ${all_packages:-?} packages (the rest are in Go's build cache) and linking ${#tools[@]} commands" >&2

# `go build -v` names every package as it is compiled; turn that stream into a
# progress line every 100 packages plus one whenever a command (tool) is
# compiled and linked, with the share done and a linear estimate of the time
# left. Anything else (compile errors) is passed through unchanged.
report_build_progress() {
  local line count=0 total="$1" compile_start=$SECONDS elapsed
  while IFS= read -r line; do
    elapsed=$((SECONDS - compile_start))
    case "$line" in
      *[!a-zA-Z0-9._~/-]* | "")
        echo "$line" ;;
      *)
        if [[ "$commands" == *" $line "* ]]; then
          echo ">>   [$((SECONDS - start))s] $(progress) compiling and linking command $line"
        else
          count=$((count + 1))
          if ((count % 100 == 0)); then
            echo ">>   [$((SECONDS - start))s] $(progress) (now $line)"
          fi
        fi ;;
    esac
  done
}
# "1200/3100 packages (39%), about 190s left"; uses report_build_progress's
# count, total and elapsed. Without a usable total (count failed, or more
# packages than counted) it says only how many were compiled.
progress() {
  if ((total > 0 && count <= total)); then
    local left=0
    ((count > 0)) && left=$((elapsed * (total - count) / count))
    echo "$count/$total packages ($((100 * count / total))%), about ${left}s left"
  else
    echo "$count packages compiled"
  fi
}

nice -n 10 go build -v "${build_flags[@]}" -o "$scratch/" "${targets[@]}" 2>&1 |
  report_build_progress "$to_compile" >&2

echo ">> [$((SECONDS - start))s] compiling and linking $second_target (a go build of its own, same module)" >&2
nice -n 10 go build -v "${second_build_flags[@]}" -o "$scratch/" "$second_target" 2>&1 |
  report_build_progress 0 >&2

for tool in "${tools[@]}" "$second_tool"; do
  if [[ ! -x "$scratch/$tool" ]]; then
    echo ">> build did not produce $tool; see the errors above" >&2
    exit 1
  fi
done
rm -rf "$bin_dir"
mv "$scratch" "$bin_dir"
trap - EXIT
echo ">> [$((SECONDS - start))s] built ${tools[*]} $second_tool into $bin_dir" >&2
echo "$bin_dir"
