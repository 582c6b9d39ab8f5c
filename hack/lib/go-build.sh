# Sourced by the Go tool builds (hack/tools/build.sh, hack/skaffold/build.sh): the parts they
# share. Each build compiles pinned commands of its own Go module into a cache directory keyed by
# a hash of what goes into it, through a scratch directory renamed at the end, so an interrupted
# build never leaves a half-filled bin directory that a later run would take as complete.
#
# The caller sets `start=$SECONDS` and `build_flags` (an array: -trimpath, -ldflags=...) and runs
# from its module's directory.

# The environment every build shares: no cgo (static binaries), the installed Go (never download
# a toolchain in CI), and go.mod as committed.
export CGO_ENABLED=0
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export GOFLAGS="-mod=readonly"
# The compiler and linker are Go programs: with a garbage collector that runs a quarter as often
# they take about a tenth less CPU (client-go's 566 packages from an empty build cache, 2026-11-26:
# 257 CPU-s at the default GOGC=100, 225 at 400, twice each) for peaks of about 650 MB a compile
# instead of 380. Not part of Go's cache keys, so the compiled packages are the same.
export GOGC="${GOGC:-400}"

go_tools_cache_root="${BROKER_FAILOVER_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/broker-failover/tools}"

# all_present DIR TOOL...: whether every TOOL is an executable in DIR.
all_present() {
  local dir=$1 tool
  shift
  for tool in "$@"; do
    [[ -x "$dir/$tool" ]] || return 1
  done
}

# new_scratch DIR: a scratch directory inside DIR (made if needed), removed on exit unless
# install_scratch moved it into place.
new_scratch() {
  mkdir -p "$1"
  scratch="$(mktemp -d "$1/build.XXXXXX")"
  trap 'rm -rf "$scratch"' EXIT
}

# install_scratch BIN_DIR TOOL...: check the build made every TOOL, then rename the scratch
# directory to BIN_DIR.
install_scratch() {
  local bin_dir=$1 tool
  shift
  for tool in "$@"; do
    if [[ ! -x "$scratch/$tool" ]]; then
      echo ">> build did not produce $tool; see the errors above" >&2
      exit 1
    fi
  done
  rm -rf "$bin_dir"
  mv "$scratch" "$bin_dir"
  trap - EXIT
}

# go_build_with_progress TARGET...: `go build -v` of the targets into the scratch directory, its
# package stream turned into a progress line every 100 packages plus one per command, with the
# share done and a linear estimate of the time left. Anything else (compile errors) is passed
# through unchanged.
#
# The total is how many packages `go build -v` will name, at most: the non-main packages `go list`
# calls stale with these flags, i.e. not in Go's build cache (`go build -v` names only the packages
# it compiles). It is an upper bound: on a warm cache the build names a few percent fewer, so the
# last line may stop short of 100%. If the count fails, progress is reported without a total.
go_build_with_progress() {
  local all_packages to_compile
  commands=" $(go list "${build_flags[@]}" -f '{{.ImportPath}}' "$@" | tr '\n' ' ')"
  read -r all_packages to_compile < <(
    go list "${build_flags[@]}" -deps -f '{{if ne .Name "main"}}{{.Stale}}{{end}}' "$@" |
      awk '$1 != "" { all++ } $1 == "true" { stale++ } END { print all + 0, stale + 0 }'
  ) || true
  echo ">> [$((SECONDS - start))s] compiling at most ${to_compile:=0} of ${all_packages:-?} packages (the rest are in Go's build cache) and linking $# commands" >&2
  nice -n 10 go build -v "${build_flags[@]}" -o "$scratch/" "$@" 2>&1 |
    _report_build_progress "$to_compile" >&2
}

_report_build_progress() {
  local line count=0 total="$1" compile_start=$SECONDS elapsed
  while IFS= read -r line; do
    elapsed=$((SECONDS - compile_start))
    case "$line" in
      *[!a-zA-Z0-9._~/-]* | "")
        echo "$line" ;;
      *)
        if [[ "$commands" == *" $line "* ]]; then
          echo ">>   [$((SECONDS - start))s] $(_progress) compiling and linking command $line"
        else
          count=$((count + 1))
          if ((count % 100 == 0)); then
            echo ">>   [$((SECONDS - start))s] $(_progress) (now $line)"
          fi
        fi ;;
    esac
  done
}

# "1200/3100 packages (39%), about 190s left"; uses _report_build_progress's count, total and
# elapsed. Without a usable total (count failed, or more packages than counted) it says only how
# many were compiled.
_progress() {
  if ((total > 0 && count <= total)); then
    local left=0
    ((count > 0)) && left=$((elapsed * (total - count) / count))
    echo "$count/$total packages ($((100 * count / total))%), about ${left}s left"
  else
    echo "$count packages compiled"
  fi
}
