"""The images install Python packages only from the hash-locked lists, and those lists are in step
with pyproject.toml (issue 39). No network: the locks are read, not resolved again."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = (
    "broker_image/Dockerfile",
    "operator/Dockerfile",
    "validator/Dockerfile",
    "simulators/Dockerfile",
)
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^ ;\\]+)")


def load_lock_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("image_lock", ROOT / "hack/images/lock.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("image_lock", module)
    spec.loader.exec_module(module)
    return module


lock = load_lock_module()


def pins(text: str) -> dict[str, tuple[str, int]]:
    """``{name: (version, hashes)}`` of a lock's entries (an entry's hashes follow on its own lines)."""
    found: dict[str, tuple[str, int]] = {}
    name = ""
    for line in text.splitlines():
        match = PIN.match(line)
        if match:
            name = canonicalize_name(match.group(1))
            found[name] = (match.group(2), 0)
        elif line.strip().startswith("--hash=sha256:") and name:
            version, hashes = found[name]
            found[name] = (version, hashes + 1)
    return found


def pip_commands(dockerfile: str) -> list[str]:
    """Every pip install in a Dockerfile's instructions (comments left out), continuation lines joined."""
    lines = [
        line for line in (ROOT / dockerfile).read_text().splitlines() if not line.lstrip().startswith("#")
    ]
    text = "\n".join(lines).replace("\\\n", " ")
    return [m.group(0) for m in re.finditer(r"pip install[^&\n]*", text)]


@pytest.mark.parametrize("selection", sorted(lock.SELECTIONS))
def test_each_lock_was_compiled_from_what_pyproject_says_now(selection: str) -> None:
    text = (lock.LOCKS / f"{selection}.txt").read_text()
    inputs = lock.requirements(lock.PYPROJECT, selection)
    first = text.splitlines()[0]
    assert first == lock.DIGEST_PREFIX + lock.inputs_digest(inputs), (
        f"hack/images/locks/{selection}.txt is not in step with pyproject.toml: run `{lock.REFRESH}`"
    )
    pinned = pins(text)
    for line in inputs:
        requirement = Requirement(line.split("#")[0])
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement.name} is not in the {selection} lock: run `{lock.REFRESH}`"
        assert requirement.specifier.contains(pinned[name][0], prereleases=True), (
            f"the {selection} lock pins {name}=={pinned[name][0]}, outside pyproject's {requirement}"
        )
    assert all(hashes for _, hashes in pinned.values()), f"an entry of the {selection} lock has no hash"


def test_the_digest_catches_a_changed_bound_and_ignores_order() -> None:
    inputs = ["kopf>=1.45", "zeep>=4.3"]
    assert lock.inputs_digest(inputs) == lock.inputs_digest(["zeep >= 4.3", "kopf>=1.45"])
    assert lock.inputs_digest(inputs) != lock.inputs_digest(["kopf>=1.46", "zeep>=4.3"])


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_every_pip_install_in_an_image_is_hash_checked_or_offline(dockerfile: str) -> None:
    commands = pip_commands(dockerfile)
    assert commands, f"{dockerfile} installs no Python package? the test reads the wrong file"
    for command in commands:
        locked = "--require-hashes" in command and "--no-deps" in command and "-r " in command
        offline = "--no-index" in command and "--no-deps" in command and "--no-build-isolation" in command
        assert locked or offline, f"{dockerfile}: `{command.strip()}` may fetch packages unchecked"


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_each_image_copies_the_locks_it_installs(dockerfile: str) -> None:
    text = (ROOT / dockerfile).read_text()
    copied = set(re.findall(r"hack/images/locks/(\w+)\.txt", text))
    assert copied, f"{dockerfile} installs from no lock"
    assert copied <= set(lock.SELECTIONS)
    if "--no-build-isolation" in text:  # it builds a wheel: the build backend comes from its lock
        assert "build" in copied
