"""What ``make images`` keys an image by: a change to a file an image copies rebuilds it, a change
anywhere else does not (local_cluster/local_cluster/image_keys.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from local_cluster.image_keys import content_key, copy_sources, ignored

DOCKERFILE = """\
FROM debian:bookworm-slim AS build
COPY pyproject.toml hack/images/requirements.py ./
COPY --chown=10001:10001 contracts \\
     contracts
FROM debian:bookworm-slim
COPY --from=build /opt/venv /opt/venv
ADD app /app
RUN echo COPY nothing
"""


def test_copy_sources_are_the_context_paths_of_copy_and_add_lines() -> None:
    assert copy_sources(DOCKERFILE) == ["pyproject.toml", "hack/images/requirements.py", "contracts", "app"]


@pytest.mark.parametrize(
    ("path", "left_out"),
    [
        (".git/config", True),
        ("contracts/broker_contracts/__pycache__/x.cpython-311.pyc", True),
        ("contracts/x.pyc", True),
        ("tests/unit/test_x.py", True),
        ("contracts/broker_contracts/relay.py", False),
        ("docs_not_ignored/x.md", False),
    ],
)
def test_dockerignore_patterns(path: str, left_out: bool) -> None:
    patterns = [".git", "**/__pycache__", "**/*.pyc", "tests"]
    assert ignored(path, patterns) is left_out


def context(tmp_path: Path) -> Path:
    (tmp_path / ".dockerignore").write_text("# comment\n**/*.pyc\n")
    (tmp_path / "Dockerfile").write_text("FROM scratch\nCOPY src /src\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("a = 1\n")
    (tmp_path / "other.txt").write_text("not copied\n")
    return tmp_path


def key(root: Path) -> str:
    return content_key(root / "Dockerfile", ("base", "docker.io/x/y:1", ""), root)


def test_a_copied_file_changes_the_key_and_anything_else_does_not(tmp_path: Path) -> None:
    root = context(tmp_path)
    first = key(root)
    (root / "other.txt").write_text("changed, but no image copies it\n")
    (root / "src" / "a.cpython-311.pyc").write_bytes(b"ignored by .dockerignore")
    assert key(root) == first
    (root / "src" / "a.py").write_text("a = 2\n")
    assert key(root) != first
    (root / "src" / "a.py").write_text("a = 1\n")
    assert key(root) == first
    (root / "src" / "b.py").write_text("b = 1\n")
    assert key(root) != first


def test_the_base_and_the_target_are_part_of_the_key(tmp_path: Path) -> None:
    root = context(tmp_path)
    plain = key(root)
    assert content_key(root / "Dockerfile", ("other base", "docker.io/x/y:1", ""), root) != plain
    assert content_key(root / "Dockerfile", ("base", "docker.io/x/y:1", "target"), root) != plain


def test_a_missing_copy_source_is_named(tmp_path: Path) -> None:
    root = context(tmp_path)
    (root / "Dockerfile").write_text("FROM scratch\nCOPY missing /missing\n")
    with pytest.raises(FileNotFoundError, match="'missing'"):
        key(root)
