"""Volume contents swapped in one step, as the kubelet's AtomicWriter writes them.

Secret, ConfigMap, downwardAPI and projected volumes are written this way: the files in a
fresh ``..<timestamp>`` directory, ``..data`` a symlink to it, each top-level key a symlink
through ``..data``, and an update swaps ``..data`` in one rename, so a reader sees the old
files or the new ones, never a mix.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path


def _read_tree(directory: Path) -> dict[str, bytes]:
    files = {}
    for path in directory.rglob("*"):
        if path.is_file():
            files[str(path.relative_to(directory))] = path.read_bytes()
    return files


def write_atomically(target: Path, files: dict[str, bytes]) -> bool:
    """Make ``target`` hold exactly ``files`` (relative path: bytes) with one atomic swap; True if changed.

    The kubelet's AtomicWriter layout: a reader holding ``target/<key>`` opens the old file or
    the new one, never a half-written one, and a watcher sees the key's target change.
    """
    target.mkdir(parents=True, exist_ok=True)
    data_link = target / "..data"
    old_dir = target / os.readlink(data_link) if data_link.is_symlink() else None
    if old_dir is not None and old_dir.is_dir() and _read_tree(old_dir) == files:
        return False
    stamp = time.strftime("%Y_%m_%d_%H_%M_%S", time.gmtime())
    new_dir = target / f"..{stamp}.{uuid.uuid4().hex[:8]}"
    for relative, content in files.items():
        path = new_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    new_dir.mkdir(exist_ok=True)
    staged = target / "..data_tmp"
    staged.unlink(missing_ok=True)
    staged.symlink_to(new_dir.name)
    os.replace(staged, data_link)  # the one step that switches every key at once
    visible = {relative.split("/", 1)[0] for relative in files}
    for name in visible:
        link = target / name
        if not link.is_symlink():
            if link.is_dir():
                shutil.rmtree(link)
            else:
                link.unlink(missing_ok=True)
            link.symlink_to(f"..data/{name}")
    for entry in target.iterdir():
        if not entry.name.startswith("..") and entry.name not in visible:
            entry.unlink() if entry.is_symlink() or entry.is_file() else shutil.rmtree(entry)
    if old_dir is not None:
        shutil.rmtree(old_dir, ignore_errors=True)
    return True
