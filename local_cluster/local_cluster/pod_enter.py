"""Start one container process inside its pod: the pod's network namespace and a mount namespace of its own.

Run by the node agent as ``python pod_enter.py --netns PATH [--bind SOURCE:TARGET ...] -- ARGV``
(as a file, not ``-m``: a container's environment has no PYTHONPATH). It joins the pod's
network namespace, unshares the mount namespace (private propagation, so nothing it mounts
reaches the node), bind-mounts each SOURCE over TARGET, and ``exec``s ARGV, so the container
keeps this process's pid and process group and the node agent's bookkeeping stays exact.

Bind mounts are how a pod gets its own ``/etc/resolv.conf`` and ``/etc/hosts`` and the
service-account files at ``/var/run/secrets/kubernetes.io/serviceaccount``, as on a real
node. A missing target directory is created only under ``/run`` (the cluster's own tmpfs);
anywhere else the mount is refused, so a pod never creates directories on the machine.

Standard library only: it runs before the container's program, on every container start.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
from pathlib import Path

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
WRITABLE_ROOT = Path("/run")

libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, flags: int) -> None:
    _check(
        libc.mount(source.encode() if source else None, target.encode(), None, ctypes.c_ulong(flags), None),
        f"mount {source} on {target}",
    )


def _prepare_target(source: Path, target: Path) -> None:
    target = target.resolve()  # /var/run is a link to /run on most distributions
    if target.exists():
        return
    if not target.is_relative_to(WRITABLE_ROOT):
        raise OSError(f"mount point {target} does not exist and is outside {WRITABLE_ROOT}")
    if source.is_dir():
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()


def enter(netns: str, binds: list[tuple[Path, Path]]) -> None:
    fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(libc.setns(fd, CLONE_NEWNET), f"setns {netns}")
    finally:
        os.close(fd)
    _check(libc.unshare(CLONE_NEWNS), "unshare mount namespace")
    _mount(None, "/", MS_REC | MS_PRIVATE)
    for source, target in binds:
        _prepare_target(source, target)
        _mount(str(source), str(target), MS_BIND | MS_REC)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--netns", required=True)
    parser.add_argument("--bind", action="append", default=[], metavar="SOURCE:TARGET")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    command = options.command[1:] if options.command[:1] == ["--"] else options.command
    if not command:
        parser.error("no command after --")
    binds = [(Path(a), Path(b)) for a, _, b in (spec.partition(":") for spec in options.bind)]
    try:
        enter(options.netns, binds)
        os.execvp(command[0], command)
    except OSError as error:
        # The node agent reports the exit code; this line lands in the container's log.
        print(f"pod_enter: {error}", file=sys.stderr, flush=True)
        sys.exit(128)


if __name__ == "__main__":
    main(sys.argv[1:])
