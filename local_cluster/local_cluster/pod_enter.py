"""Start one container process inside its pod: the pod's network namespace and a mount namespace of its own.

Run by the node agent as
``python pod_enter.py --netns PATH [--bind SOURCE:TARGET ...] [--bind-ro SOURCE:TARGET ...]
[--workdir DIR] -- ARGV`` (as a file, not ``-m``: a container's environment has no PYTHONPATH).
It joins the pod's network namespace, unshares the mount namespace (private propagation, so
nothing it mounts reaches the node or the cluster), bind-mounts each SOURCE over TARGET
(recursively; ``--bind-ro`` mounts are then remounted read-only), changes to DIR, and
``exec``s ARGV, so the container keeps this process's pid and process group and the node
agent's bookkeeping stays exact.

The binds are every volumeMount of the container at its mountPath (emptyDir, PVC, Secret,
ConfigMap, service account, ...) plus the pod's ``/etc/resolv.conf`` and ``/etc/hosts``, as on a
real node: a program that hard-codes ``/var/lib/app/data`` finds its volume there. Shorter
targets are mounted first, so nested mounts land inside their parents, and every source is
opened before anything is mounted, so a volume at ``/tmp`` cannot hide the next one's source;
nor the container's program: the repository and the Python environment that every image maps to
are bound back on top of any volume mounted over one of their ancestors.

A missing mount point (or workdir) is made without touching the machine's filesystem:

- under ``/run`` (the sealed cluster's own tmpfs), inside a volume already mounted, or inside
  a directory this process created, it is simply created there;
- otherwise the deepest existing ancestor A (``/var/lib`` for ``/var/lib/app/data``) is
  *shadowed*: a fresh tmpfs is mounted over A in the private namespace and each entry of the
  original A is put back (directories and files bind-mounted recursively from file
  descriptors opened before, symlinks re-created), so A keeps its contents while the missing
  directories are created in the tmpfs;
- if A is ``/`` itself (``/data``), the same shadow is built on a tmpfs mounted on a scratch
  directory under ``/run`` and becomes the root with ``pivot_root``; the old root is
  detached and the scratch directory removed.

Everything lives in the private mount namespace and its tmpfs mounts, which the kernel frees
with the container's last process: nothing is left on the machine. The cost of a shadow: a
new entry created directly in A (not inside one of its sub-directories) lands in the tmpfs,
and a rename between two entries of A fails with EXDEV (they are separate mounts).

Standard library only: it runs before the container's program, on every container start
and every exec probe.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import platform
import stat
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
# statvfs ST_* flags with the same value as the MS_* flag; kept on a read-only remount.
KEPT_FLAGS = os.ST_NOSUID | os.ST_NODEV | os.ST_NOEXEC | os.ST_NOATIME | os.ST_NODIRATIME | os.ST_RELATIME
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
WRITABLE_ROOT = Path("/run")
SCRATCH = WRITABLE_ROOT / "pod-enter"


def _image_paths() -> list[Path]:
    """The containers' "image": this repository and the Python environment running it (the node
    agent maps every image to a command of theirs). Topmost only: one bind covers what is inside."""
    paths = sorted(
        {Path(__file__).resolve().parents[2], Path(sys.prefix).resolve()}, key=lambda p: len(p.parts)
    )
    return [p for i, p in enumerate(paths) if not any(p.is_relative_to(q) for q in paths[:i])]


libc = ctypes.CDLL(None, use_errno=True)


class Bind(NamedTuple):
    source: Path
    target: Path
    read_only: bool = False


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(
    source: str | None, target: str, flags: int, fstype: str | None = None, data: str | None = None
) -> None:
    _check(
        libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {source or fstype} on {target}",
    )


def _detach(target: str) -> None:
    _check(libc.umount2(target.encode(), MNT_DETACH), f"umount {target}")


class _Entry(NamedTuple):
    name: str
    link: str | None  # a symlink's target; else the entry is reopened through ``fd``
    fd: int
    is_dir: bool


class MountTree:
    """The container's private mount tree as it is built: which directories are ours to write."""

    def __init__(self) -> None:
        # Creating inside these is harmless: the cluster's tmpfs, mounted volumes, our own dirs.
        self.own_trees: list[Path] = [WRITABLE_ROOT] if os.path.ismount(WRITABLE_ROOT) else []
        self.shadows: set[Path] = set()  # shadowed directories: their top level is a tmpfs of ours

    def _writable(self, directory: Path) -> bool:
        return directory in self.shadows or any(directory.is_relative_to(tree) for tree in self.own_trees)

    @staticmethod
    def _missing(target: Path) -> list[Path]:
        """The missing part of ``target`` (resolved), itself first: empty if it exists."""
        target = Path(os.path.realpath(target))  # /var/run is a link to /run on most distributions
        if os.path.lexists(target):
            return []
        missing = [target]
        while not missing[-1].parent.exists():
            missing.append(missing[-1].parent)
        return missing

    def needs_new_root(self, target: Path) -> bool:
        missing = self._missing(target)
        return bool(missing) and missing[-1].parent == Path("/") and not self._writable(Path("/"))

    def make_path(self, target: Path, directory: bool) -> Path:
        """``target`` resolved, created (a directory or an empty file) if missing, never on the machine."""
        missing = self._missing(target)
        if not missing:
            return Path(os.path.realpath(target))
        target = missing[0]
        parent = missing[-1].parent
        if not parent.is_dir():
            raise OSError(f"mount point {target}: {parent} is not a directory")
        if not self._writable(parent):
            self.shadow(parent)
        for path in reversed(missing[1:]):
            path.mkdir()
        if directory:
            target.mkdir()
        else:
            target.touch()
        self.own_trees.append(missing[-1])
        return target

    def bind(self, source_fd: int, target: Path) -> Path:
        """Bind the source opened as ``source_fd`` at ``target``, making the mount point if missing."""
        target = self.make_path(target, directory=stat.S_ISDIR(os.fstat(source_fd).st_mode))
        _mount(f"/proc/self/fd/{source_fd}", str(target), MS_BIND | MS_REC)
        self.own_trees.append(target)  # nested mount points are made inside the volume, as the kubelet does
        return target

    @staticmethod
    def _entries(directory: Path) -> list[_Entry]:
        entries = []
        for entry in os.scandir(directory):
            if entry.is_symlink():
                entries.append(_Entry(entry.name, os.readlink(entry.path), -1, False))
                continue
            fd = os.open(entry.path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
            entries.append(_Entry(entry.name, None, fd, stat.S_ISDIR(os.fstat(fd).st_mode)))
        return entries

    @staticmethod
    def _restore(into: Path, entries: list[_Entry]) -> None:
        """Put the original entries back into a fresh tmpfs: binds from the fds, symlinks as they were."""
        for entry in entries:
            path = into / entry.name
            if entry.link is not None:
                os.symlink(entry.link, path)
                continue
            try:
                path.mkdir() if entry.is_dir else path.touch()
                _mount(f"/proc/self/fd/{entry.fd}", str(path), MS_BIND | MS_REC)
            finally:
                os.close(entry.fd)

    def shadow(self, directory: Path) -> None:
        """Cover ``directory`` with a tmpfs holding its original entries, so new ones can be made."""
        mode = f"mode={stat.S_IMODE(directory.stat().st_mode):o}"
        if directory == Path("/"):
            self._new_root(mode)
        else:
            entries = self._entries(directory)
            _mount("tmpfs", str(directory), 0, "tmpfs", mode)
            self._restore(directory, entries)
        self.shadows.add(directory)

    def _new_root(self, mode: str) -> None:
        """The shadow of ``/``: built on a scratch tmpfs under /run, then made the root."""
        if not os.path.ismount(WRITABLE_ROOT):
            raise OSError(f"a mount point at / needs a scratch directory, and {WRITABLE_ROOT} is not a tmpfs")
        SCRATCH.mkdir(exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix="root-", dir=SCRATCH))
        entries = self._entries(Path("/"))
        _mount("tmpfs", str(scratch), 0, "tmpfs", mode)
        self._restore(scratch, entries)
        number = SYS_PIVOT_ROOT.get(platform.machine())
        if number is None:
            raise OSError(f"pivot_root: unknown syscall number on {platform.machine()}")
        os.chdir(scratch)
        # pivot_root(".", "."): the old root ends up stacked on the new one, then goes.
        _check(libc.syscall(number, b".", b"."), "pivot_root")
        _detach(".")
        os.chdir("/")
        # /run came back as a copy that still holds the scratch mount: drop it and its directory.
        copy = str(scratch)
        with contextlib.suppress(OSError):
            _detach(copy)
            os.rmdir(copy)

    def remount_read_only(self, target: Path) -> None:
        kept = os.statvfs(target).f_flag & KEPT_FLAGS
        _mount(None, str(target), MS_REMOUNT | MS_BIND | MS_RDONLY | kept)


def enter(netns: str, binds: list[Bind], workdir: str | None = None) -> None:
    fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(libc.setns(fd, CLONE_NEWNET), f"setns {netns}")
    finally:
        os.close(fd)
    _check(libc.unshare(CLONE_NEWNS), "unshare mount namespace")
    _mount(None, "/", MS_REC | MS_PRIVATE)
    start_dir = os.getcwd()
    tree = MountTree()
    if any(tree.needs_new_root(path) for path in [*(bind.target for bind in binds), Path(workdir or "/")]):
        # Before the sources are opened: a bind from a mount of the old, detached root fails.
        tree.shadow(Path("/"))
    # Every source is opened first: a volume mounted at /tmp must not hide the next one's source.
    sources = {}
    for bind in binds:
        try:
            sources[bind] = os.open(bind.source, os.O_PATH | os.O_CLOEXEC)
        except OSError as error:
            raise OSError(f"volume source {bind.source} for {bind.target}: {error.strerror}") from error
    # A volume over an ancestor of the image (an emptyDir at /tmp, with this repository cloned
    # under /tmp) would hide the program itself, as no volume can hide a real container's image:
    # such image paths are bound back on top, inside the volume.
    targets = [Path(os.path.normpath(bind.target)) for bind in binds]
    hidden = {
        path: os.open(path, os.O_PATH | os.O_CLOEXEC)
        for path in _image_paths()
        if any(path.is_relative_to(target) for target in targets)
    }
    read_only = []
    # Parents before children: a nested mount lands inside the volume mounted above it.
    for bind in sorted(binds, key=lambda b: len(Path(os.path.normpath(b.target)).parts)):
        target = tree.bind(sources[bind], bind.target)
        if bind.read_only:
            read_only.append(target)
    for path, fd in hidden.items():
        tree.bind(fd, path)
    for target in read_only:  # last, so mount points of nested mounts could still be made
        tree.remount_read_only(target)
    if workdir:
        os.chdir(tree.make_path(Path(workdir), directory=True))
    else:
        try:
            os.chdir(start_dir)  # the node agent's choice, seen through the new mounts
        except OSError:
            os.chdir("/")


def _binds(specs: list[str], read_only: bool) -> list[Bind]:
    return [Bind(Path(a), Path(b), read_only) for a, _, b in (spec.partition(":") for spec in specs)]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--netns", required=True)
    parser.add_argument("--bind", action="append", default=[], metavar="SOURCE:TARGET")
    parser.add_argument("--bind-ro", action="append", default=[], metavar="SOURCE:TARGET")
    parser.add_argument("--workdir", default=None, help="working directory, made if missing")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    command = options.command[1:] if options.command[:1] == ["--"] else options.command
    if not command:
        parser.error("no command after --")
    binds = _binds(options.bind, False) + _binds(options.bind_ro, True)
    try:
        enter(options.netns, binds, options.workdir)
        os.execvp(command[0], command)
    except OSError as error:
        # The node agent reports the exit code; this line lands in the container's log.
        print(f"pod_enter: {error}", file=sys.stderr, flush=True)
        sys.exit(128)


if __name__ == "__main__":
    main(sys.argv[1:])
