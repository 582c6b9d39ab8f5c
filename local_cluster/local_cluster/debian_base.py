"""The Debian base of our images: how mmdebstrap makes it, and its pin: every package and version
it holds, recorded in ``hack/images/debian-base-<arch>.lock`` and checked on every build of it.

The base is not pulled from a registry (no tag or digest to pin): ``make images`` makes it from
Debian's packages with mmdebstrap, and apt checks them against Debian's signed archive. What the
tag left open is which versions went in: the mirror serves the newest of each, so two builds a month
apart differ unseen. Debian's snapshot archive (a date instead of a mirror) would make the build
itself repeatable, but this project's machines do not reach it; so the lock records the package
set, and a base whose packages differ from it is reported with the differences (a one-line diff
per package) until someone reviews them and records the new set (``make images-base-lock``).
``BROKER_FAILOVER_BASE_LOCK=strict`` refuses such a base: for release builds. The default only
warns, because Debian's mirror serves nothing but the newest versions: a strict default would stop
every fresh ``make demo`` and CI run on the day of a Debian security update.

Not here: the packages the Dockerfiles add with apt (python3.11, the JRE); those come from the
same signed archive, unpinned (docs/images.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

# Debian's image recipe (debuerreotype's "slim"): minbase, merged /usr without the usrmerge package
# (which would pull in perl), no docs, man pages, info or locales, and apt told to keep no
# package files or caches, so a Dockerfile's `rm -rf /var/lib/apt/lists/*` leaves nothing behind.
DEBIAN_MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
APT_CLEAN = (
    'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb'
    ' /var/cache/apt/*.bin || true"; };\n'
    'APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb'
    ' /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };\n'
    'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n'
)
MMDEBSTRAP_OPTIONS = (
    "--variant=minbase",
    "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    "--dpkgopt=path-include=/usr/share/locale/locale.alias",
    "--dpkgopt=path-exclude=/usr/share/info/*",
    "--customize-hook=printf '%s' '" + APT_CLEAN + '\' > "$1/etc/apt/apt.conf.d/docker-clean"',
    '--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/log/*.log',
)
# buildah mounts layers (overlay) while it works and can leave some mounted; in a mount namespace
# of its own, every mount it makes goes when it exits, and the machine's mount table stays as it was.
PRIVATE_MOUNTS = ("unshare", "--mount", "--propagation", "private", "--")

LOCK_DIR = Path(__file__).resolve().parents[2] / "hack" / "images"
STATUS_MEMBERS = ("./var/lib/dpkg/status", "var/lib/dpkg/status")
MODE_VARIABLE = "BROKER_FAILOVER_BASE_LOCK"


class BaseLockError(RuntimeError):
    """The base's packages differ from the lock (the message lists them and says what to do)."""


def architecture() -> str:
    result = subprocess.run(
        ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True, timeout=30
    )
    return result.stdout.strip()


def lock_path(arch: str, directory: Path = LOCK_DIR) -> Path:
    return directory / f"debian-base-{arch}.lock"


def parse_status(text: str) -> list[str]:
    """``name version arch`` of every installed package in a dpkg status file, sorted."""
    found = []
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line[:1] not in (" ", "\t") and ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            found.append(
                f"{fields['Package']} {fields.get('Version', '?')} {fields.get('Architecture', '?')}"
            )
    return sorted(found)


def installed_packages(rootfs_tar: Path) -> list[str]:
    """The packages of a root file system tarball, as its dpkg status says."""
    with tarfile.open(rootfs_tar) as tar:
        for name in STATUS_MEMBERS:
            try:
                member = tar.extractfile(name)
            except KeyError:
                continue
            if member is not None:
                return parse_status(member.read().decode("utf-8", "replace"))
    raise BaseLockError(f"{rootfs_tar} has no var/lib/dpkg/status: not a Debian root file system")


def read_lock(path: Path) -> list[str]:
    return sorted(line for line in path.read_text().splitlines() if line and not line.startswith("#"))


def render_lock(packages: list[str], arch: str) -> str:
    header = (
        f"# The packages of the images' Debian bookworm base ({arch}), as mmdebstrap made it:\n"
        "# name version architecture. Checked on every build of the base (local_cluster/debian_base.py);\n"
        "# `make images-base-lock` records a new set after you have reviewed the difference.\n"
    )
    return header + "".join(f"{line}\n" for line in packages)


def differences(actual: list[str], locked: list[str]) -> list[str]:
    """One line per package added, removed or at another version."""

    def by_name(lines: list[str]) -> dict[str, str]:
        return {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in lines}

    now, then = by_name(actual), by_name(locked)
    changes = []
    for name in sorted(set(now) | set(then)):
        if name not in then:
            changes.append(f"+ {name} {now[name]}")
        elif name not in now:
            changes.append(f"- {name} {then[name]}")
        elif now[name] != then[name]:
            changes.append(f"~ {name} {then[name]} -> {now[name]}")
    return changes


def check(actual: list[str], path: Path, *, mode: str | None = None) -> None:
    """Refuse a base whose packages differ from the lock at ``path`` (or only warn, in ``warn`` mode)."""
    mode = mode if mode is not None else os.environ.get(MODE_VARIABLE, "warn")
    if not path.exists():
        problem = f"no lock of the Debian base for this architecture ({path} is missing)"
    else:
        changes = differences(actual, read_lock(path))
        if not changes:
            return
        shown = "\n".join(f"  {line}" for line in changes[:40])
        more = f"\n  ... and {len(changes) - 40} more" if len(changes) > 40 else ""
        problem = f"the Debian base differs from {path.name} in {len(changes)} packages:\n{shown}{more}"
    message = (
        f"{problem}\nReview the difference, then record it with `make images-base-lock` and commit the "
        f"lock; {MODE_VARIABLE}=warn builds anyway"
    )
    if mode == "warn":
        print(f">> warning: {message}", file=sys.stderr, flush=True)
        return
    raise BaseLockError(message)


def mmdebstrap_command(target: Path) -> list[str]:
    return [*PRIVATE_MOUNTS, "mmdebstrap", *MMDEBSTRAP_OPTIONS, "bookworm", str(target), *DEBIAN_MIRRORS]


def lock_base() -> Path:
    """`make images-base-lock`: make the base as a build would (no buildah) and record its packages."""
    arch = architecture()
    with tempfile.TemporaryDirectory(prefix="base-lock-") as scratch_dir:
        scratch = Path(scratch_dir) / "rootfs.tar"
        result = subprocess.run(mmdebstrap_command(scratch), capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise BaseLockError(f"mmdebstrap failed:\n{result.stderr.strip()[-4000:]}")
        packages = installed_packages(scratch)
    path = lock_path(arch)
    if path.exists():
        for line in differences(packages, read_lock(path)):
            print(f"   {line}", file=sys.stderr)
    path.write_text(render_lock(packages, arch))
    return path


def lock_base_main() -> int:
    try:
        print(f"recorded {lock_base()}")
    except BaseLockError as error:
        print(f"make images-base-lock: {error}", file=sys.stderr)
        return 1
    return 0
