"""A cgroup root of our own in every hierarchy of the machine, made first and removed bottom-up.

The kubelet's ``cgroupRoot`` and the image tests' containers sit under one; those directories are
the machine's, so whatever makes one removes it (``remove``), and a test can check that none is left.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


class CgroupRoot:
    """``/<name>`` in every cgroup hierarchy of the machine, v1 and the unified v2 one: the parent
    of a node's or the sandbox's containers (the kubelet's ``cgroupRoot``), made first and removed
    bottom-up."""

    def __init__(self, name: str) -> None:
        self.name = name

    @staticmethod
    def hierarchy(name: str) -> Path:
        """One hierarchy's mount (``pids``, ``freezer``, ...)."""
        return CGROUP_ROOT / name

    def hierarchies(self) -> list[Path]:
        # "unified" too: in this hybrid layout runc also makes each container's cgroup there.
        return sorted(path for path in CGROUP_ROOT.iterdir() if path.is_dir() and not path.is_symlink())

    def directories(self) -> list[Path]:
        """The root's directory in each hierarchy that has one."""
        return [hierarchy / self.name for hierarchy in self.hierarchies() if (hierarchy / self.name).is_dir()]

    def create(self) -> None:
        for hierarchy in self.hierarchies():
            directory = hierarchy / self.name
            directory.mkdir(exist_ok=True)
            if hierarchy.name == "cpuset":  # a cpuset without cpus or mems takes no process
                for key in ("cpuset.cpus", "cpuset.mems"):
                    (directory / key).write_text((hierarchy / key).read_text())

    def remove(self, within: float = 10) -> list[Path]:
        """rmdir bottom-up, retried while the kernel is still reaping the processes that were in
        them (bounded); returns what could not be removed."""
        deadline = time.monotonic() + within
        while True:
            left = self._remove_once()
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.2)

    def _remove_once(self) -> list[Path]:
        left: list[Path] = []
        for hierarchy in self.hierarchies():
            top = hierarchy / self.name
            if not top.exists():
                continue
            for directory in sorted(
                (p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
            ):
                with contextlib.suppress(OSError):
                    directory.rmdir()
            try:
                top.rmdir()
            except OSError:
                left.append(top)
        return left
