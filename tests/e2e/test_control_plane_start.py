"""The control plane's start errors say what to do (``local_cluster/local_cluster/control_plane.py``).

Every cluster starts its etcd, kube-apiserver and kube-controller-manager through
``start_control_plane``: missing tools name the command that builds them, and a component that
dies at start is named with its log. No cluster needed; the second test runs the real etcd.
(Moved here from the retired node agent's ``test_harness.py``: they never depended on it.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from local_cluster.cluster import built_tools_dir
from local_cluster.control_plane import ControlPlaneSettings, ControlPlaneStartError, start_control_plane

pytestmark = pytest.mark.e2e


def test_missing_tools_fail_with_the_command_to_run(tmp_path: Path) -> None:
    settings = ControlPlaneSettings(tools_dir=tmp_path / "empty", workdir=tmp_path / "work")
    with pytest.raises(ControlPlaneStartError, match=r"etcd not found in tools dir .*run `make tools`"):
        start_control_plane(settings)


def test_a_component_that_dies_at_start_is_reported_with_its_log(tmp_path: Path) -> None:
    """Real etcd, unusable data dir: the launcher names the component and shows its log."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "etcd").write_text("a file where etcd wants its data directory\n")
    settings = ControlPlaneSettings(tools_dir=built_tools_dir(), workdir=workdir, ready_timeout_seconds=30)
    with pytest.raises(ControlPlaneStartError, match=r"etcd exited with \d+ while waiting for etcd /health"):
        start_control_plane(settings)
