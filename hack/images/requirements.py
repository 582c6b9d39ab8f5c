"""Print the project's requirements from pyproject.toml, one per line, for `pip install -r`.

The Dockerfiles install the dependencies in a layer of their own, before the source is copied,
so a source change does not download them again; this keeps pyproject.toml their one list.
Standard library only: it runs in the image build, where nothing else is installed yet.

    python3 requirements.py pyproject.toml               # [project] dependencies
    python3 requirements.py pyproject.toml validator     # and the validator extra
    python3 requirements.py pyproject.toml --only broker # only the broker extra
"""

from __future__ import annotations

import sys
import tomllib


def requirements(pyproject: str, extras: list[str], only: bool) -> list[str]:
    with open(pyproject, "rb") as file:
        project = tomllib.load(file)["project"]
    chosen = [] if only else list(project["dependencies"])
    for extra in extras:
        chosen += project["optional-dependencies"][extra]
    return chosen


if __name__ == "__main__":
    arguments = sys.argv[1:]
    only = "--only" in arguments
    names = [a for a in arguments if a != "--only"]
    print("\n".join(requirements(names[0], names[1:], only)))
