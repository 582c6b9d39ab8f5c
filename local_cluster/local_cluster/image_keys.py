"""What goes into an image, as ``make images`` keys it: a Dockerfile's ``COPY``/``ADD`` sources, the
context files under them that ``.dockerignore`` lets through, and a hash over all of it.

Standard library only. The ignore rules are the subset this repository's ``.dockerignore`` uses
(a name at the top, ``**/name`` and ``**/*.ext`` anywhere); a source a Dockerfile names that does
not exist is an error here, before buildah would say so.
"""

from __future__ import annotations

import fnmatch
import hashlib
from collections.abc import Sequence
from pathlib import Path


def ignored(relative: str, patterns: Sequence[str]) -> bool:
    """Whether ``.dockerignore`` ``patterns`` leave out the context path ``relative``."""
    parts = relative.split("/")
    return any(
        fnmatch.fnmatch(relative, p) or fnmatch.fnmatch(parts[-1], p.removeprefix("**/")) or parts[0] == p
        for p in patterns
    )


def dockerignore_patterns(root: Path) -> list[str]:
    path = root / ".dockerignore"
    if not path.exists():
        return []
    return [
        line.strip()
        for line in path.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def copy_sources(dockerfile: str) -> list[str]:
    """The context paths a Dockerfile's ``COPY``/``ADD`` lines take (not those ``--from`` a stage)."""
    sources: list[str] = []
    logical = dockerfile.replace("\\\n", " ")
    for line in logical.splitlines():
        words = line.split()
        if len(words) < 3 or words[0].upper() not in ("COPY", "ADD"):
            continue
        if any(w.startswith("--from") for w in words[1:]):
            continue
        arguments = [w for w in words[1:] if not w.startswith("--")]
        sources += arguments[:-1]
    return sources


def context_files(sources: Sequence[str], root: Path) -> list[Path]:
    """Every file under ``sources`` that the build context holds; raises naming a missing source."""
    ignore = dockerignore_patterns(root)
    files: set[Path] = set()
    for source in sources:
        path = root / source
        if not path.exists():
            raise FileNotFoundError(f"a COPY source {source!r} does not exist under {root}")
        candidates = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        files.update(p for p in candidates if not ignored(p.relative_to(root).as_posix(), ignore))
    return sorted(files)


def content_key(dockerfile: Path, identity: Sequence[str], root: Path) -> str:
    """A hash of ``identity`` (base key, reference, target), the Dockerfile, the ignore rules, and
    the path and content of every file its ``COPY`` lines take."""
    text = dockerfile.read_text()
    digest = hashlib.sha256()
    for part in (*identity, text, "\n".join(dockerignore_patterns(root))):
        digest.update(part.encode() + b"\0")
    for path in context_files(copy_sources(text), root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:20]
