"""The images' Python dependencies, locked with hashes: hack/images/locks/<selection>.txt.

pyproject.toml states what the project needs (`>=` bounds, for the developer's virtualenv); the
images install exact versions from these locks with `pip install --require-hashes --no-deps -r`,
so an image build takes the files that were locked or fails: a new release, a replaced file or a
look-alike on the index cannot enter an image unseen. Each lock is one image's selection:

    service    the `service` extra alone: the broker's and the simulators' images
    operator   [project] dependencies
    validator  [project] dependencies and the `validator` extra
    build      [build-system] requires (setuptools): installed first by the images that build the
               project's wheel or an sdist (pyspark), which then build without build isolation, so
               no build requirement is fetched unhashed

The locks are compiled by uv (`uv pip compile --generate-hashes --universal --python-version 3.11`:
Debian bookworm's Python, every platform's wheels hashed, so an arm64 build uses the same lock). Each
lock's first line is a digest of its inputs; tests/unit/test_image_locks.py recomputes it from
pyproject.toml, so changing a dependency without refreshing the locks fails a test (no network).

    python3 hack/images/lock.py                  # refresh every lock (`make images-lock`; UV= names uv)
    python3 hack/images/lock.py --print operator # the inputs of one lock, one requirement a line

Standard library only, and uv on PATH (or $UV) to refresh.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
PYPROJECT = HERE.parents[1] / "pyproject.toml"
LOCKS = HERE / "locks"
PYTHON_VERSION = "3.11"  # Debian bookworm's python3.11, which every image runs
DIGEST_PREFIX = "# inputs-sha256: "
REFRESH = "make images-lock"

# selection: (extras, whether the [project] dependencies come too, whether it is the build lock)
SELECTIONS: dict[str, tuple[tuple[str, ...], bool, bool]] = {
    "service": (("service",), False, False),
    "operator": ((), True, False),
    "validator": (("validator",), True, False),
    "build": ((), False, True),
}


def requirements(pyproject: Path, selection: str) -> list[str]:
    """The requirements a lock is compiled from, as pyproject.toml states them, comments stripped."""
    with pyproject.open("rb") as file:
        data = tomllib.load(file)
    extras, with_dependencies, build = SELECTIONS[selection]
    if build:
        return list(data["build-system"]["requires"])
    project = data["project"]
    chosen = list(project["dependencies"]) if with_dependencies else []
    for extra in extras:
        chosen += project["optional-dependencies"][extra]
    return chosen


def inputs_digest(inputs: list[str]) -> str:
    """Order and spacing do not matter; any change of a requirement does."""
    normal = sorted({"".join(line.split()).lower() for line in inputs})
    return hashlib.sha256("\n".join(normal).encode()).hexdigest()


def compile_lock(selection: str, uv: str) -> str:
    inputs = requirements(PYPROJECT, selection)
    command = [
        uv, "pip", "compile", "-", "--quiet", "--generate-hashes", "--universal",
        "--python-version", PYTHON_VERSION, "--custom-compile-command", REFRESH,
    ]  # fmt: skip
    if os.environ.get("PIP_INDEX_URL"):  # the machine's index, as its pip uses (a mirror or proxy)
        command += ["--index-url", os.environ["PIP_INDEX_URL"]]
    result = subprocess.run(
        command, input="\n".join(inputs) + "\n", capture_output=True, text=True, check=False, timeout=600
    )
    if result.returncode != 0:
        raise SystemExit(f"uv pip compile for the {selection} lock failed:\n{result.stderr.strip()}")
    # A pin with no "# via" annotation is one of the inputs (pyproject.toml's, read from stdin).
    return f"{DIGEST_PREFIX}{inputs_digest(inputs)}\n{result.stdout}"


def main(arguments: list[str]) -> int:
    if arguments[:1] == ["--print"]:
        print("\n".join(requirements(PYPROJECT, arguments[1])))
        return 0
    uv = os.environ.get("UV", "uv")
    LOCKS.mkdir(exist_ok=True)
    for selection in arguments or list(SELECTIONS):
        text = compile_lock(selection, uv)
        (LOCKS / f"{selection}.txt").write_text(text)
        pins = sum(1 for line in text.splitlines() if line[:1].isalnum())
        print(f"hack/images/locks/{selection}.txt: {pins} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
