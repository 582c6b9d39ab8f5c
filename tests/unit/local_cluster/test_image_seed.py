"""Planting the image seed into a node's containerd root: links where containerd only reads,
copies where it writes, and nothing left behind when links cannot be made.

The seed here is a directory of files laid out as containerd's root is; making a real one
(containerd importing the archives) is what every cluster start in tests/e2e does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from local_cluster.image_seed import IMAGES_FILE, MUTABLE_FILES, plant_seed

BLOB = "io.containerd.content.v1.content/blobs/sha256/ab12"
LAYER_FILE = "io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs/usr/bin/tool"


def make_seed(directory: Path) -> Path:
    seed = directory / "seeds" / "k1"
    for name in (BLOB, LAYER_FILE, *MUTABLE_FILES):
        path = seed / "root" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"contents of {name}")
    (seed / IMAGES_FILE).write_text(json.dumps(["broker-failover/broker"]))
    return seed


def test_files_are_linked_and_the_databases_copied(tmp_path: Path) -> None:
    seed = make_seed(tmp_path)
    root = tmp_path / "node" / "containerd" / "root"

    assert plant_seed(seed, root) == ["broker-failover/broker"]

    for name in (BLOB, LAYER_FILE):
        assert os.path.samefile(root / name, seed / "root" / name), name
    for name in MUTABLE_FILES:
        assert not os.path.samefile(root / name, seed / "root" / name), name
        assert (root / name).read_text() == f"contents of {name}"
    (root / MUTABLE_FILES[0]).write_text("written by this node's containerd")
    assert (seed / "root" / MUTABLE_FILES[0]).read_text() == f"contents of {MUTABLE_FILES[0]}"


def test_a_root_on_another_file_system_is_refused_and_removed(tmp_path: Path) -> None:
    other = Path("/dev/shm")
    if not other.is_dir() or os.stat(other).st_dev == os.stat(tmp_path).st_dev:
        pytest.fail("this test needs /dev/shm on a file system of its own (a tmpfs)")
    seed = make_seed(tmp_path)
    root = other / f"image-seed-test-{os.getpid()}" / "root"
    try:
        with pytest.raises(OSError, match="Invalid cross-device link"):
            plant_seed(seed, root)
        assert not root.exists()
    finally:
        if root.parent.exists():
            for path in sorted(root.parent.rglob("*"), reverse=True):
                path.rmdir() if path.is_dir() else path.unlink()
            root.parent.rmdir()
