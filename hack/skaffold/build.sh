#!/usr/bin/env bash
# Build skaffold from its Go module (the pin in this folder's go.mod) into a cache outside git,
# for the test that runs `skaffold build` and `skaffold render` against skaffold.yaml
# (tests/images/test_skaffold.py). Neither Debian, PyPI nor npm ships skaffold, so it is built like
# the Kubernetes tools (hack/tools/build.sh), in a module of its own: its dependency graph (cloud
# SDKs, docker, buildpacks) pins versions the Kubernetes pin does not take, so the two share no
# compiled package. The first build compiles ~2,300 packages, about 5 minutes on 2 cores.
#
# Usage: hack/skaffold/build.sh            build if needed; the LAST line is the binary's path
#        hack/skaffold/build.sh --print    print the binary's path, build nothing
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib/go-build.sh
source "$here/../lib/go-build.sh"
pin_hash="$(cd "$here" && cat go.mod go.sum tools.go build.sh | sha256sum | cut -c1-16)"
bin_dir="$go_tools_cache_root/skaffold-$pin_hash/bin"

if [[ "${1:-}" == "--print" ]]; then
  echo "$bin_dir/skaffold"
  exit 0
fi
if all_present "$bin_dir" skaffold; then
  echo ">> skaffold up to date (pin $pin_hash)" >&2
  echo "$bin_dir/skaffold"
  exit 0
fi

new_scratch "$go_tools_cache_root/skaffold-$pin_hash"
start=$SECONDS
cd "$here"
version="$(go list -m -f '{{.Version}}' github.com/GoogleContainerTools/skaffold/v2)"
echo ">> building skaffold $version (pin $pin_hash) into $bin_dir; the first build takes about 5 minutes" >&2
echo ">> [$((SECONDS - start))s] downloading modules" >&2
nice -n 10 go mod download
echo ">> [$((SECONDS - start))s] modules ready" >&2
# Stamped as skaffold's own release builds do (its Makefile's GO_LDFLAGS): `skaffold version`.
# Compiled without optimizations or inlining (-N -l): the test runs it for seconds, and on a fresh
# machine the compile is on make test's critical path. Measured 2026-11-26, empty build cache:
# 699 CPU-s (6m08s) optimized, 535 CPU-s (4m50s) with -N -l. The standard library keeps the
# tools' flags (the later -gcflags pattern wins: no DWARF, hack/tools/build.sh), so its compiled
# packages are the ones the Kubernetes tools' build already put in Go's cache; of skaffold's 2,311
# packages, 242 are the standard library's and 256 more are the same module versions as the tools'
# (these lose that sharing: an unoptimized build is a different build).
build_flags=(-trimpath "-gcflags=all=-N -l -dwarf=false" "-gcflags=std=-dwarf=false"
  "-ldflags=-s -w -X github.com/GoogleContainerTools/skaffold/v2/pkg/skaffold/version.version=$version")
go_build_with_progress github.com/GoogleContainerTools/skaffold/v2/cmd/skaffold
install_scratch "$bin_dir" skaffold
echo ">> [$((SECONDS - start))s] built skaffold into $bin_dir" >&2
echo "$bin_dir/skaffold"
