"""The Debian base's pin (local_cluster/debian_base.py): the packages of a root file system tarball,
read from its dpkg status, against the recorded lock."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from local_cluster import debian_base
from local_cluster.debian_base import BaseLockError

STATUS = """Package: libc6
Status: install ok installed
Architecture: amd64
Version: 2.36-9+deb12u10
Description: GNU C Library
 the continuation line: Version: 9.9

Package: apt
Status: install ok installed
Architecture: amd64
Version: 2.6.1

Package: removed-long-ago
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0
"""


def rootfs(tmp_path: Path, status: str = STATUS) -> Path:
    path = tmp_path / "rootfs.tar"
    with tarfile.open(path, "w") as tar:
        data = status.encode()
        member = tarfile.TarInfo("./var/lib/dpkg/status")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    return path


def test_the_installed_packages_are_read_from_the_tarballs_dpkg_status(tmp_path: Path) -> None:
    assert debian_base.installed_packages(rootfs(tmp_path)) == [
        "apt 2.6.1 amd64",
        "libc6 2.36-9+deb12u10 amd64",
    ]


def test_a_base_matching_its_lock_passes(tmp_path: Path) -> None:
    lock = tmp_path / "debian-base-amd64.lock"
    packages = debian_base.installed_packages(rootfs(tmp_path))
    lock.write_text(debian_base.render_lock(packages, "amd64"))
    debian_base.check(packages, lock, mode="strict")  # no error
    assert debian_base.read_lock(lock) == packages


def test_a_base_that_drifted_from_its_lock_is_refused_with_each_change(tmp_path: Path) -> None:
    lock = tmp_path / "debian-base-amd64.lock"
    lock.write_text(
        debian_base.render_lock(["apt 2.6.1 amd64", "libc6 2.36-9+deb12u9 amd64", "gone 1 amd64"], "amd64")
    )
    actual = ["apt 2.6.1 amd64", "libc6 2.36-9+deb12u10 amd64", "new 2 amd64"]

    with pytest.raises(BaseLockError) as refused:
        debian_base.check(actual, lock, mode="strict")

    text = str(refused.value)
    assert "3 packages" in text and "make images-base-lock" in text
    assert "~ libc6 2.36-9+deb12u9 amd64 -> 2.36-9+deb12u10 amd64" in text
    assert "+ new 2 amd64" in text and "- gone 1 amd64" in text


def test_warn_mode_builds_anyway_and_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    debian_base.check(["apt 2.6.1 amd64"], tmp_path / "missing.lock", mode="warn")
    assert "no lock of the Debian base" in capsys.readouterr().err
    with pytest.raises(BaseLockError, match="no lock of the Debian base"):
        debian_base.check(["apt 2.6.1 amd64"], tmp_path / "missing.lock", mode="strict")


def test_the_project_records_a_lock_for_this_machines_architecture() -> None:
    lock = debian_base.lock_path(debian_base.architecture())
    packages = debian_base.read_lock(lock)
    names = {line.split(" ", 1)[0] for line in packages}
    assert {"libc6", "apt", "dpkg", "base-files"} <= names, sorted(names)
    assert all(len(line.split(" ")) == 3 for line in packages)
