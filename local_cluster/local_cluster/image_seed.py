"""The images ``make images`` built, imported and unpacked once, then linked into each node.

Importing the images into a node's containerd (``ctr images import``: decompress, checksum, unpack
into overlay snapshots) was most of a node's start: about 30 CPU-seconds of the ~50 a one-node
cluster took, and ``make test`` starts about fourteen nodes. A real node keeps its images on its
disk across restarts; here every node of every cluster shares one copy:

* ``ensure_seed`` makes a containerd root (content store, metadata, overlay snapshots) with the
  images imported and unpacked, once per set of archives (the key: containerd's version and each
  archive's path, size and mtime), by a containerd of its own without the CRI, in a mount namespace
  of its own (unpacking mounts layers). It is kept under the image cache; older seeds are removed
  when a new one is made, and a lock keeps two clusters from making it at once.
* ``plant_seed`` fills a node's containerd root from it before containerd starts: every regular
  file a hard link, the two bolt databases copies, since containerd writes those. Sharing the
  snapshots' files is safe because overlayfs uses them as read-only lower layers: what a container
  writes goes to an upper layer of its own, and containerd only ever removes a snapshot's
  directory, which unlinks this node's names and nothing else.

The containerd that starts on a planted root finds the images in the CRI's namespace, as after an
import. Where a link cannot be made (the cluster's directory on another file system than the
cache), planting fails cleanly and the node imports the archives as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from local_cluster.containerd_sandbox import NAMESPACE, start_containerd
from local_cluster.control_plane import ControlPlaneStartError
from local_cluster.image_archives import archive_for
from local_cluster.image_build import CACHE_DIR, IMAGES, ImageBuildError, locked

SEED_DIR = CACHE_DIR / "containerd-seed"
# Written by containerd while it runs: copied into each node, never linked.
MUTABLE_FILES = (
    "io.containerd.metadata.v1.bolt/meta.db",
    "io.containerd.snapshotter.v1.overlayfs/metadata.db",
)
IMAGES_FILE = "images.json"


class ImageImportError(ControlPlaneStartError):
    """An archive could not be imported into a containerd."""


def import_images(
    socket: Path,
    names: Sequence[str],
    record: Path,
    stopping: threading.Event | None = None,
    unpack: bool = True,
) -> None:
    """``ctr images import`` of each image's archive, in order, adding it to ``record`` when done.

    ``unpack=False`` (``--no-unpack``) stores the image's blobs only; containerd's CRI unpacks an
    image into its snapshotter when a container of it is first created on that node."""
    for name in names:
        if stopping is not None and stopping.is_set():
            return
        archive = archive_for(name)
        flags = [] if unpack else ["--no-unpack"]
        command = ["ctr", "--address", str(socket), "-n", NAMESPACE, "images", "import", *flags, str(archive)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
        if result.returncode != 0:
            raise ImageImportError(f"importing {archive} failed: {result.stderr.strip()}")
        done = json.loads(record.read_text()) if record.exists() else []
        staged = record.with_suffix(".tmp")
        staged.write_text(json.dumps([*done, name]))
        staged.replace(record)


def built_images() -> list[str]:
    """The images whose archives ``make images`` has written (the validator's may be missing)."""
    names = []
    for spec in IMAGES:
        with contextlib.suppress(ImageBuildError):
            archive_for(spec.name)
            names.append(spec.name)
    return names


def seed_key(names: Sequence[str]) -> str:
    """What a seed depends on: containerd's version and each archive as it is on disk."""
    version = subprocess.run(
        ["containerd", "--version"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    digest = hashlib.sha256(version.encode())
    for name in names:
        archive = archive_for(name)
        stat = archive.stat()
        digest.update(f"{name}\0{archive}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def _make_seed(names: Sequence[str], target: Path) -> None:
    """Import ``names`` into a fresh containerd root at ``target / "root"`` (under the lock)."""
    scratch = target.with_name(target.name + ".partial")
    shutil.rmtree(scratch, ignore_errors=True)
    # A short run directory: a socket's path has at most 107 bytes.
    with tempfile.TemporaryDirectory(prefix="seed-", dir="/tmp") as run_dir:
        containerd = start_containerd(
            scratch,
            cri=False,
            run_dir=Path(run_dir),
            prefix=("unshare", "--mount", "--propagation", "private", "--"),
        )
        try:
            import_images(Path(run_dir) / "containerd.sock", names, scratch / IMAGES_FILE)
        finally:
            containerd.terminate()
            try:
                containerd.wait(timeout=30)
            except subprocess.TimeoutExpired:
                containerd.kill()
                containerd.wait(timeout=30)
    for older in SEED_DIR.iterdir():
        if older.is_dir() and older != scratch:
            shutil.rmtree(older, ignore_errors=True)
    scratch.replace(target)


def ensure_seed(names: Sequence[str]) -> Path:
    """The seed for ``names`` (made now if there is none for these archives): its directory, whose
    ``root`` is a containerd root and whose ``images.json`` names what it holds."""
    target = SEED_DIR / seed_key(names)
    with locked(SEED_DIR):
        if not (target / IMAGES_FILE).exists():
            _make_seed(names, target)
    return target


def plant_seed(seed: Path, root: Path) -> list[str]:
    """Fill the (absent or empty) containerd ``root`` from ``seed``; the images it now holds.

    Raises ``OSError`` when the links cannot be made (``cp``'s own message in it); the partial
    root is removed first, so the caller can import instead."""
    root.mkdir(parents=True, exist_ok=True)
    with locked(seed.parent):  # not while a new seed replaces this one
        try:
            linked = subprocess.run(
                ["cp", "-a", "--link", f"{seed / 'root'}/.", str(root)],
                capture_output=True, text=True, timeout=300, check=False,
            )  # fmt: skip
            if linked.returncode != 0:
                raise OSError(f"cannot link {seed} into {root}: {linked.stderr.strip()[:500]}")
            for name in MUTABLE_FILES:
                copy = root / name
                copy.unlink()
                shutil.copy2(seed / "root" / name, copy)
        except OSError:
            shutil.rmtree(root, ignore_errors=True)
            raise
        names: list[str] = json.loads((seed / IMAGES_FILE).read_text())
    return names


def seeded_images(root: Path) -> list[str]:
    """Plant every built image into the containerd ``root`` (making the seed if needed); the names
    planted, or none when linking is not possible here (the node then imports the archives)."""
    try:
        return plant_seed(ensure_seed(built_images()), root)
    except OSError as error:
        print(f"image seed not used ({error}); importing the archives instead", flush=True)
        return []
