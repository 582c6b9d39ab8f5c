"""Every make target a person runs installs what it needs (issue 38).

`make demo` once lacked `host-packages` that `make cluster-up` had, so on a fresh machine it built
for twelve minutes and then died inside kube-proxy ("could not find nftables binary"). These tests
read make's own prerequisite graph (`make -pq`) and sort the targets by what their recipes run,
found from the imports of the Python module each recipe starts: a target that starts the sealed
cluster of kubelets, one that starts only a control plane, one that builds images. Targets of one
kind must reach the same installing prerequisites, so a target added later without them fails here.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# The targets a person runs that start something of the local cluster, by kind. Targets of one kind
# must reach the same installing prerequisites. A new target whose program imports local_cluster
# must be named here (test_every_cluster_program_is_classified), so none is added unchecked.
KINDS = {
    "sealed cluster (kubelets, containerd, kube-proxy, images)": {
        "demo",
        "cluster-up",
        "soak",
        "bench-failover-k8s",
        "bench-operator-upgrade-k8s",
        "bench-drain",
    },
    "control plane only (Go tools)": {"bench-operator-k8s"},
    "image build (buildah, mmdebstrap, Go tools for CoreDNS)": {"images"},
    "the Debian base's package lock (mmdebstrap only)": {"images-base-lock"},
}
# Programs that import local_cluster but start nothing that needs an install: they act on a cluster
# already up (cluster-down, shell), are a step of another target (images-without-tools), or start
# brokers and simulators on loopback with one run's certificates (local_cluster.run_pki and
# loopback_relay: the openssl CLI, nothing of the cluster): bench-broker, bench-tls-handshake.
STARTS_NOTHING = {"cluster-down", "shell", "images-without-tools", "bench-broker", "bench-tls-handshake"}
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
FIRST_STEPS = ["preflight-cluster", "host-packages", "image-packages"]


def make_database() -> str:
    result = subprocess.run(
        ["make", "-pRrq", "-f", "Makefile"], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert "# Files" in result.stdout, result.stderr
    return result.stdout


@cache
def rules() -> dict[str, tuple[list[str], list[str]]]:
    """target -> (prerequisites, recipe lines), from make's printed database."""
    found: dict[str, tuple[list[str], list[str]]] = {}
    current: str | None = None
    for line in make_database().split("# Files", 1)[1].splitlines():
        if line.startswith("\t") and current is not None:
            found[current][1].append(line.strip())
            continue
        match = re.match(r"^([A-Za-z0-9_.\-/]+):(?!=)\s*(.*)$", line)
        if match:
            current = match.group(1)
            found.setdefault(current, ([], []))[0].extend(match.group(2).split("|")[0].split())
        elif line.startswith("# Not a target"):
            current = None
    return found


def closure(target: str) -> set[str]:
    seen: set[str] = set()
    stack = [target]
    while stack:
        for prereq in rules().get(stack.pop(), ([], []))[0]:
            if prereq not in seen:
                seen.add(prereq)
                stack.append(prereq)
    return seen


def module_file(name: str) -> Path | None:
    relative = Path(*name.split("."))
    for root in [REPO, *(p for p in REPO.iterdir() if p.is_dir() and not p.name.startswith("."))]:
        for candidate in (root / relative.with_suffix(".py"), root / relative / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def imported_modules(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


@cache
def reached_modules(entry: Path) -> frozenset[str]:
    """The repository's modules that ``entry`` imports, directly or through others."""
    reached: set[str] = set()
    stack = [entry]
    visited: set[Path] = set()
    while stack:
        path = stack.pop()
        if path in visited:
            continue
        visited.add(path)
        for name in imported_modules(path):
            found = module_file(name)
            if found is not None:
                reached.add(name)
                stack.append(found)
    return frozenset(reached)


def recipe_programs(recipe: list[str]) -> Iterator[tuple[str, Path]]:
    """(module name or script path, its file) for each Python program a recipe runs."""
    for line in recipe:
        for module in re.findall(r"python\S*\s+-m\s+([\w.]+)", line):
            found = module_file(module)
            if found is not None:
                yield module, found.parent / "__main__.py" if found.name == "__init__.py" else found
        for script in re.findall(r"python\S*\s+([\w/]+\.py)", line):
            yield script, REPO / script


def imports_local_cluster(target: str) -> bool:
    return any(
        name.startswith("local_cluster") or any(m.startswith("local_cluster") for m in reached_modules(entry))
        for name, entry in recipe_programs(rules()[target][1])
    )


def installers() -> set[str]:
    """The targets that install or build something: TEST_PREREQS, their own prerequisites, preflights."""
    database = make_database()
    match = re.search(r"^TEST_PREREQS :?= (.*)$", database, re.MULTILINE)
    assert match, "TEST_PREREQS not in make's database"
    named = set(match.group(1).split())
    everything = set(named)
    for target in named:
        everything |= closure(target)
    return everything | {t for t in rules() if t.startswith("preflight")}


def test_every_cluster_program_is_classified() -> None:
    """The reading itself can fail: it finds the programs that use local_cluster, and each has a kind."""
    users = {target for target in rules() if imports_local_cluster(target)}
    classified = set().union(*KINDS.values())
    assert classified <= users, f"not found as local_cluster users: {classified - users}"
    assert not users - classified - STARTS_NOTHING, (
        f"targets {sorted(users - classified - STARTS_NOTHING)} run local_cluster: name them in KINDS"
    )
    assert {"host-packages", "image-packages", "tools", "images", "venv"} <= installers()


def test_targets_of_one_kind_reach_the_same_installers() -> None:
    needed = installers()
    lacking: list[str] = []
    for kind, targets in KINDS.items():
        reach = {target: closure(target) & needed for target in targets}
        union = set().union(*reach.values())
        lacking += [f"{t} ({kind}) lacks {sorted(union - have)}" for t, have in reach.items() if union - have]
    assert not lacking, "\n".join(lacking)


@pytest.mark.parametrize(
    "target",
    ["demo", "cluster-up", "soak", "bench-failover-k8s", "bench-operator-upgrade-k8s", "bench-drain"],
)
def test_cluster_targets_check_and_install_before_any_build(target: str) -> None:
    """The preflight and the Debian packages come before the venv and the 10-minute Go build."""
    prereqs = rules()[target][0]
    order = [p for p in prereqs if p in {*FIRST_STEPS, "venv", "tools"}]
    assert order[:3] == FIRST_STEPS, prereqs


def test_demo_without_root_stops_at_once_with_one_clear_line() -> None:
    """A user who is not root gets the reason before anything is built (the suite runs as root)."""
    with tempfile.TemporaryDirectory(prefix="demo-as-nobody-") as scratch:  # pytest's tmp is root-only
        os.chmod(scratch, 0o755)
        check_demo_as_nobody(Path(scratch))


def check_demo_as_nobody(home: Path) -> None:
    clone = home / "clone"
    subprocess.run(["git", "clone", "--quiet", "--shared", str(REPO), str(clone)], check=True, timeout=60)
    for name in ("Makefile", "mk", "hack"):  # the working tree's, as committed or not
        target = clone / name
        if target.is_dir():
            shutil.rmtree(target)
            shutil.copytree(REPO / name, target)
        else:
            shutil.copy2(REPO / name, target)
    subprocess.run(["chown", "-R", "65534:65534", str(clone)], check=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(home)}
    result = subprocess.run(
        [*AS_NOBODY, "make", "--no-print-directory", "demo"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    assert "running as nobody" in result.stderr and "run as root" in result.stderr, result.stderr
    assert not (clone / ".venv").exists(), "the venv was made before the preflight stopped the demo"
    assert ">> creating" not in result.stdout + result.stderr


def test_host_packages_without_root_names_the_package_and_the_command() -> None:
    result = subprocess.run(
        [*AS_NOBODY, str(REPO / "hack/host-packages.sh"), "no-such-program-38=no-such-package-38"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "no-such-program-38 not found" in lines[0] and "no-such-package-38" in lines[0]
    assert "needs root and apt-get" in lines[0]
