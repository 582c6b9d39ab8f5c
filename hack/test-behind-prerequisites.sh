#!/usr/bin/env bash
# `make test`'s runner. The slow prerequisites (the Go tools, the images, skaffold: about 20 minutes
# of two cores on a fresh machine, a no-op once cached) build behind the tests at the lowest CPU and
# I/O priority, so the tests that need none of them run meanwhile, and a test that needs a group
# waits for that group (tests/conftest.py, tests/prerequisites.py).
#
# Usage: hack/test-behind-prerequisites.sh "PREREQS" GROUP=TARGET,TARGET ... -- PYTEST [ARGS...]
#   PREREQS  every make target of TEST_PREREQS; the groups must name each exactly once (they may
#            name others too), so that a prerequisite added in mk/ is not left out of `make test`.
#   GROUP    make -j inside a group. The first group starts at once, before the venv exists, so it
#            must not need it (the Go tools). The second starts once lint passed, beside the first
#            (what needs no tool: the image bases). Each later one starts when all before it are
#            done (one Go build at a time: two would only slow each other down).
#
# Steps: the first group starts; `make lint venv` runs (a lint failure ends make test there); the
# second group starts beside the first, the others follow; then two pytest processes run side by
# side: the second stream (output to a file printed at the end) runs the tests marked
# `second_stream` (each starts a cluster of its own and mostly waits on it: the soak, the demo, the
# three-node module, two benchmark smokes), the main one all the others; the modules that need a
# prerequisite are shared, each run by the stream that reaches it first (the main one from the
# front, the second from the back: tests/conftest.py), so that the two end together. The second
# stream starts its tests once the main one has finished those that need no prerequisite (their
# sub-second timeouts would not like clusters beside them; the main stream touches
# quiet-tests-done, tests/prerequisites.py). Each group's log, make command and
# exit status go to $BROKER_FAILOVER_PREREQS_DIR.
set -euo pipefail

dir="${BROKER_FAILOVER_PREREQS_DIR:-$PWD/.cache/prereqs}"
export BROKER_FAILOVER_PREREQS_DIR="$dir"

read -r -a prereqs <<<"$1"
shift
groups=()
while [[ $# -gt 0 && $1 != -- ]]; do
  groups+=("$1")
  shift
done
[[ ${1:-} == -- ]] && shift
[[ $# -gt 0 ]] || { echo "test-behind-prerequisites: no pytest command after --" >&2; exit 2; }

grouped=()
for group in "${groups[@]}"; do
  IFS=, read -r -a targets <<<"${group#*=}"
  grouped+=("${targets[@]}")
done
for prereq in "${prereqs[@]}"; do
  if [[ "$(printf '%s\n' "${grouped[@]}" | grep -cx -- "$prereq")" != 1 ]]; then
    echo "test-behind-prerequisites: the groups (${grouped[*]}) must name each of TEST_PREREQS (${prereqs[*]}) exactly once, $prereq too; see TEST_PREREQ_GROUPS in the Makefile" >&2
    exit 2
  fi
done

rm -rf "$dir"
mkdir -p "$dir"
printf '%s\n' "${groups[@]%%=*}" >"$dir/order"

build_group() {
  local name=${1%%=*} rc=0
  IFS=, read -r -a targets <<<"${1#*=}"
  echo "make ${targets[*]}" >"$dir/$name.targets"
  nice -n 19 ionice -c 3 make --no-print-directory -j3 "${targets[@]}" >"$dir/$name.log" 2>&1 || rc=$?
  echo "$rc" >"$dir/$name.rc"
}

build_groups() {
  set +m # everything it starts stays in its process group, which stop_all kills
  build_group "${groups[0]}" &
  local first=$! waited=0 group
  until [[ -e $dir/venv.ready ]]; do # written below once lint passed; bounded like the tests' wait
    sleep 1
    ((++waited < 3600)) || return 1
  done
  [[ ${#groups[@]} -lt 2 ]] || build_group "${groups[1]}"
  wait "$first"
  for group in "${groups[@]:2}"; do
    build_group "$group"
  done
}

set -m # background jobs get process groups of their own, so stopping one stops what it started
build_groups &
builder=$!
second_stream=""
set +m
echo "$builder" >"$dir/builder.pid"
stop_all() {
  kill -- -"$builder" 2>/dev/null || true
  [[ -z $second_stream ]] || kill -- -"$second_stream" 2>/dev/null || true
}
trap stop_all EXIT
echo ">> prerequisites build behind the tests (${groups[*]%%=*}); logs in $dir"

make --no-print-directory -j2 lint venv
touch "$dir/venv.ready"

set -m
BROKER_FAILOVER_TEST_STREAM=second "$@" -p no:cacheprovider >"$dir/second-stream.log" 2>&1 &
second_stream=$!
set +m
echo ">> a second stream of tests (second_stream, then shared modules) runs beside; its output: $dir/second-stream.log"

main_rc=0
"$@" -m "not second_stream" || main_rc=$?
touch "$dir/quiet-tests-done" # in case the main stream had no test that needs a prerequisite
second_rc=0
wait "$second_stream" || second_rc=$?
second_stream=""
((second_rc != 5)) || second_rc=0 # pytest's "no tests collected": nothing marked second_stream or shared was selected
echo
echo ">> the second stream (exit status $second_rc):"
cat "$dir/second-stream.log"
((main_rc == 0 && second_rc == 0))
