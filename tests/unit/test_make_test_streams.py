"""make test's two pytest streams share the modules that need a prerequisite (tests/conftest.py).

Real pytest processes, side by side as hack/test-behind-prerequisites.sh starts them, run the real
``tests/conftest.py`` and ``tests/prerequisites.py`` (copied into a scratch project) over modules
that record which stream ran each test. What must hold: every shared module runs exactly once, the
main stream's from the front and the second's from the back, and each stream still runs what only it
runs (the quiet tests the main one, ``second_stream`` modules the second).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED_MODULES = 8
SECONDS_PER_TEST = 0.75  # 2 tests a module: long enough that the second stream gets some

RECORDING_TEST = """
import os, time
import pytest
{mark}

def record(name):
    with open(os.environ["RAN_LOG"], "a") as log:
        log.write(os.environ.get("BROKER_FAILOVER_TEST_STREAM", "main") + " " + name + "\\n")

def test_one():
    record(__name__ + "::test_one")
    time.sleep({seconds})

def test_two():
    record(__name__ + "::test_two")
    time.sleep({seconds})
"""


def make_project(root: Path) -> None:
    tests = root / "tests"
    (tests / "e2e").mkdir(parents=True)
    for name in ("__init__.py", "conftest.py", "prerequisites.py"):
        shutil.copy(ROOT / "tests" / name, tests / name)
    (tests / "e2e" / "__init__.py").touch()
    (tests / "test_quiet.py").write_text(RECORDING_TEST.format(mark="", seconds=0))
    second = "pytestmark = pytest.mark.second_stream"
    (tests / "e2e" / "test_own.py").write_text(RECORDING_TEST.format(mark=second, seconds=0))
    for number in range(SHARED_MODULES):
        module = RECORDING_TEST.format(mark="", seconds=SECONDS_PER_TEST)
        (tests / "e2e" / f"test_shared_{number}.py").write_text(module)
    # A module of a group built after the cluster (as skaffold is), first in file order.
    later = RECORDING_TEST.format(mark='pytestmark = pytest.mark.needs("later")', seconds=0)
    (tests / "e2e" / "test_a_later_group.py").write_text(later)


def prerequisites_built(folder: Path) -> None:
    """What the runner script leaves once the groups are built: ``cluster`` (e2e tests need it)
    and ``later``."""
    folder.mkdir()
    (folder / "order").write_text("cluster later\n")
    for group in ("cluster", "later"):
        (folder / f"{group}.rc").write_text("0\n")
    (folder / "builder.pid").write_text(f"{os.getpid()}\n")


PYTEST = [sys.executable, "-m", "pytest", "tests", "-p", "no:cacheprovider", "-q"]


def run_pytest(project: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PYTEST, *args], check=False, cwd=project, env=env, capture_output=True, text=True, timeout=120
    )


def test_each_shared_module_runs_once_the_main_stream_from_the_front(tmp_path: Path) -> None:
    project, prereqs, ran = tmp_path / "project", tmp_path / "prereqs", tmp_path / "ran.log"
    make_project(project)
    prerequisites_built(prereqs)
    env = {**os.environ, "BROKER_FAILOVER_PREREQS_DIR": str(prereqs), "RAN_LOG": str(ran)}
    env.pop("BROKER_FAILOVER_TEST_STREAM", None)
    second = subprocess.Popen(
        PYTEST,
        cwd=project,
        env={**env, "BROKER_FAILOVER_TEST_STREAM": "second"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        main = run_pytest(project, env, "-m", "not second_stream")
        second_output, _ = second.communicate(timeout=120)
    finally:
        second.kill()
    assert main.returncode == 0, main.stdout + main.stderr
    assert second.returncode == 0, second_output

    runs = [line.split() for line in ran.read_text().splitlines()]
    tests = [test for _, test in runs]
    assert len(tests) == len(set(tests)), f"a test ran twice: {runs}"
    shared = [f"tests.e2e.test_shared_{n}" for n in range(SHARED_MODULES)]
    modules = [*shared, "tests.test_quiet", "tests.e2e.test_own", "tests.e2e.test_a_later_group"]
    expected = {f"{module}::{test}" for module in modules for test in ("test_one", "test_two")}
    assert set(tests) == expected

    stream_of = {test.split("::")[0]: stream for stream, test in runs}
    assert stream_of["tests.test_quiet"] == "main"
    assert stream_of["tests.e2e.test_own"] == "second"
    order = [stream_of[module] for module in shared]
    taken_by_main = order.count("main")
    assert order == ["main"] * taken_by_main + ["second"] * (SHARED_MODULES - taken_by_main), order
    assert 0 < taken_by_main < SHARED_MODULES, f"one stream ran every shared module: {order}"
    # The later group's module comes after every module of the cluster's, in either stream.
    later_by = stream_of["tests.e2e.test_a_later_group"]
    in_that_stream = [test.split("::")[0] for stream, test in runs if stream == later_by]
    assert in_that_stream[-2:] == ["tests.e2e.test_a_later_group"] * 2, in_that_stream
    # Each stream names the modules the other ran, and counts their tests as deselected.
    by_second = SHARED_MODULES - taken_by_main + (later_by == "second")
    assert f"ran {by_second} shared module" in main.stdout, main.stdout
    by_main = taken_by_main + (later_by == "main")
    assert f"ran {by_main} shared module" in second_output, second_output


@pytest.mark.parametrize("stream", ["main", "second"])
def test_outside_make_test_nothing_is_claimed_or_left_out(tmp_path: Path, stream: str) -> None:
    project, ran = tmp_path / "project", tmp_path / "ran.log"
    make_project(project)
    env = {**os.environ, "RAN_LOG": str(ran), "BROKER_FAILOVER_TEST_STREAM": stream}
    env.pop("BROKER_FAILOVER_PREREQS_DIR", None)
    run = run_pytest(project, env, "-k", "shared_0 or own")
    assert run.returncode == 0, run.stdout + run.stderr
    assert len(ran.read_text().splitlines()) == 4
    assert "the other stream" not in run.stdout
