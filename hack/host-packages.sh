#!/usr/bin/env bash
# Install the Debian packages whose programs the tests, the demo and `make images` run, with
# apt-get, only when one is missing. Arguments: PROGRAM=PACKAGE pairs; a PROGRAM with a slash is a
# path (the CNI plugins live in /usr/lib/cni, not on PATH).
#   hack/host-packages.sh nft=nftables conntrack=conntrack
# apt-get update runs only when the install fails (a stale or empty package index), so the usual
# case makes no network round trip for the index.
set -euo pipefail

present() { if [[ $1 == */* ]]; then [[ -x $1 ]]; else command -v "$1" >/dev/null; fi; }

missing=() packages=()
for pair in "$@"; do
  program=${pair%%=*} package=${pair#*=}
  present "$program" && continue
  missing+=("$program")
  [[ " ${packages[*]} " == *" $package "* ]] || packages+=("$package")
done
[[ ${#missing[@]} == 0 ]] && exit 0

if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
  echo "host-packages: ${missing[*]} not found; installing the Debian packages ${packages[*]} needs root and apt-get" \
    "(running as $(id -un), apt-get $(command -v apt-get || echo 'not found')). Install them by hand, or add their directory (often /usr/sbin) to PATH." >&2
  exit 1
fi
echo ">> installing ${packages[*]} (missing: ${missing[*]})" >&2
export DEBIAN_FRONTEND=noninteractive
# `make -j` may run two of these at once (kube-proxy's and the image builder's packages): the
# second waits for dpkg's lock instead of failing on it.
apt_get() { apt-get -o DPkg::Lock::Timeout=600 "$@"; }
apt_get install -y --no-install-recommends "${packages[@]}" \
  || { apt_get update && apt_get install -y --no-install-recommends "${packages[@]}"; } \
  || { echo "host-packages: apt-get could not install ${packages[*]}; see its output above" >&2; exit 1; }
for program in "${missing[@]}"; do
  present "$program" || { echo "host-packages: $program still not found after installing ${packages[*]}" >&2; exit 1; }
done
