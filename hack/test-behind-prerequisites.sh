#!/usr/bin/env bash
# `make test`'s runner: pytest starts as soon as the venv is ready, and the slow prerequisites (the
# Go tools, the images, skaffold: half an hour on a fresh 2-core machine, a no-op once cached) are
# built behind it at the lowest CPU and I/O priority, so the tests that need none of them run while
# they compile. Each test that needs a group waits for that group only (tests/conftest.py runs
# the tests in the groups' order, those that need nothing first).
#
# Usage: hack/test-behind-prerequisites.sh "PREREQS" GROUP=TARGET,TARGET ... -- PYTEST ARGS...
#   PREREQS  every make target of TEST_PREREQS; the groups must name each exactly once, so that a
#            prerequisite added in mk/ is not silently left out of `make test`.
#   GROUP    built one after another, in the order given (the Go builds would only slow each
#            other down); make -j inside a group.
# Each group's log, exit status and the builder's pid go to $BROKER_FAILOVER_PREREQS_DIR.
set -euo pipefail

dir="${BROKER_FAILOVER_PREREQS_DIR:-$PWD/.cache/prereqs}"
export BROKER_FAILOVER_PREREQS_DIR="$dir"

prereqs=($1)
shift
groups=()
while [[ $# -gt 0 && $1 != -- ]]; do
  groups+=("$1")
  shift
done
[[ ${1:-} == -- ]] && shift

# Every prerequisite in exactly one group.
grouped=()
for group in "${groups[@]}"; do
  IFS=, read -r -a targets <<<"${group#*=}"
  grouped+=("${targets[@]}")
done
if [[ "$(printf '%s\n' "${prereqs[@]}" | sort)" != "$(printf '%s\n' "${grouped[@]}" | sort)" ]]; then
  echo "test-behind-prerequisites: the groups (${grouped[*]}) must name each of TEST_PREREQS (${prereqs[*]}) exactly once; see TEST_PREREQ_GROUPS in the Makefile" >&2
  exit 2
fi

rm -rf "$dir"
mkdir -p "$dir"
printf '%s\n' "${groups[@]%%=*}" >"$dir/order"

build_groups() {
  local group name rc
  for group in "${groups[@]}"; do
    name=${group%%=*}
    IFS=, read -r -a targets <<<"${group#*=}"
    echo "make ${targets[*]}" >"$dir/$name.targets"
    rc=0
    nice -n 19 ionice -c 3 make --no-print-directory -j3 "${targets[@]}" >"$dir/$name.log" 2>&1 || rc=$?
    echo "$rc" >"$dir/$name.rc"
  done
}

set -m # the builder gets a process group of its own, so that stopping it stops go build too
build_groups &
builder=$!
set +m
echo "$builder" >"$dir/builder.pid"
stop_builder() { kill -- -"$builder" 2>/dev/null || true; }
trap stop_builder EXIT
echo ">> prerequisites build behind the tests (${groups[*]%%=*}); logs in $dir"

"$@"
