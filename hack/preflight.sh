#!/usr/bin/env bash
# Check, before any minute-long build starts, the programs the project does not install itself
# (README.md, "Before the two commands"): each missing one is named on one line with what to
# install, and the exit status is 1. Arguments: the checks to run, any of
#   python   Python 3.11 to 3.13 with its venv module (Debian: python3 python3-venv)
#   go       Go at least as new as hack/tools/go.mod asks (the Go tools build from it)
#   kubectl  kubectl on PATH (the demo and the e2e tests drive the cluster with it)
#   java     Java 17 or newer (Spark in the validator's tests)
#   root     root and apt-get (Debian packages: nft, conntrack, buildah, containerd, runc, ...)
#   hack/preflight.sh python go kubectl root
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-$(command -v python3.11 || command -v python3 || true)}"
failed=0
fail() {
  echo "preflight: $*" >&2
  failed=1
}

# version_at_least HAVE WANT: dotted versions, numerically.
version_at_least() { [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n 1)" == "$2" ]]; }

for check in "$@"; do
  case "$check" in
    python)
      if [[ -z "$python" ]]; then
        fail "no python3 on PATH; install Python 3.11 (Debian bookworm: apt-get install python3 python3-venv)"
      elif ! "$python" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 14))'; then
        fail "$python is Python $("$python" -c 'import platform; print(platform.python_version())'), the project needs 3.11 to 3.13 (set PYTHON=/path/to/python3.11)"
      elif ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
        fail "$python has no venv module; install it (Debian: apt-get install python3-venv)"
      fi
      ;;
    go)
      want="$(awk '$1 == "go" {print $2; exit}' "$here/tools/go.mod")"
      if ! command -v go >/dev/null; then
        fail "no go on PATH; install Go $want or newer (Debian bookworm's golang is too old: take it from bookworm-backports or go.dev)"
      else
        have="$(go env GOVERSION)"
        have="${have#go}"
        version_at_least "$have" "$want" || fail "go is $have, the Go tools need $want or newer (hack/tools/go.mod)"
      fi
      ;;
    kubectl)
      command -v kubectl >/dev/null || fail "no kubectl on PATH; install kubectl (any version within one minor of Kubernetes 1.33)"
      ;;
    java)
      if ! command -v java >/dev/null && [[ -z "${JAVA_HOME:-}" ]]; then
        fail "no java on PATH and JAVA_HOME is not set; install Java 17 (Debian: apt-get install openjdk-17-jre-headless)"
      else
        java_bin="${JAVA_HOME:+$JAVA_HOME/bin/}java"
        major="$("$java_bin" -XshowSettings:properties -version 2>&1 | awk -F' = ' '/java.specification.version/ {print $2}')"
        [[ -n "$major" ]] && ((major >= 17)) || fail "java is ${major:-unknown}, Spark needs Java 17 or newer (Debian: apt-get install openjdk-17-jre-headless)"
      fi
      ;;
    root)
      if [[ "$(id -u)" != 0 ]]; then
        fail "running as $(id -un): the local cluster needs root (unshare of network, mount and PID namespaces, containerd) and apt-get installs Debian packages; run as root"
      elif ! command -v apt-get >/dev/null; then
        fail "no apt-get: the Debian packages (nftables conntrack buildah mmdebstrap containerd runc containernetworking-plugins) must be installed by hand"
      fi
      ;;
    *)
      fail "unknown check '$check' (python, go, kubectl, java, root)"
      ;;
  esac
done
exit "$failed"
