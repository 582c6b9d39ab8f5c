"""The local runner's manifest reading and state file: bad input is refused, epochs never go back.

No processes here (``tests/integration/operator/test_local_runner_cli.py`` runs the
command for real); these check the parts that decide what the runner accepts.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from broker_operator.core.status import ClusterStatus
from broker_operator.engine import EpochConflict
from broker_operator.local_runner import LocalShell, ManifestError, StateFile, parse_manifest, read_manifest

GOOD = {
    "apiVersion": "broker.failover.dev/v1alpha1",
    "kind": "BrokerCluster",
    "metadata": {"name": "acme-1000"},
    "spec": {
        "account": "acme",
        "company": "1000",
        "endpoints": [
            {"name": "east", "url": "http://127.0.0.2:8080/soap", "priority": 0},
            {"name": "west", "url": "http://127.0.0.3:8080/soap", "priority": 1},
        ],
        "heartbeat": {"intervalSeconds": 1, "leaseSeconds": 5},
        "preferredActive": "west",
    },
}


def test_reads_an_endpoints_manifest() -> None:
    cluster = parse_manifest(GOOD)
    assert cluster.name == "acme-1000"
    assert [t.name for t in cluster.targets] == ["east", "west"]
    assert cluster.preferred_active == "west"
    assert cluster.settings.lease_seconds == 5


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kind": "Pod"}, "kind: BrokerCluster"),
        ({"metadata": {}}, "metadata.name is required"),
        ({"spec": {"replicas": 2}}, "spec.endpoints must list"),
        ({"spec": {**GOOD["spec"], "endpoints": [{"name": "x", "url": "ftp://x"}]}}, r"endpoints\[0\].url"),
        (
            {"spec": {**GOOD["spec"], "endpoints": [{"name": "x", "url": "http://x", "priority": "high"}]}},
            "priority",
        ),
        (
            {"spec": {**GOOD["spec"], "endpoints": [GOOD["spec"]["endpoints"][0]] * 2}},  # type: ignore[index]
            "must be unique",
        ),
        ({"spec": {**GOOD["spec"], "preferredActive": "north"}}, r"preferredActive \(north\)"),
        ({"spec": {**GOOD["spec"], "heartbeat": {"leaseSeconds": 1}}}, "leaseSeconds"),
    ],
)
def test_refuses_bad_manifests_naming_the_field(change: dict[str, object], message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        parse_manifest({**GOOD, **change})


def test_refuses_hostile_yaml(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("!!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ManifestError, match="cannot read"):
        read_manifest(path)


async def test_state_file_grants_in_order_and_never_goes_back(tmp_path: Path) -> None:
    state = StateFile(tmp_path / "state.json")
    out = io.StringIO()
    shell = LocalShell(state, out)
    assert await shell.allocate_epoch(0, 1) == 1
    assert await shell.allocate_epoch(1, 2) == 2
    with pytest.raises(EpochConflict) as conflict:
        await shell.allocate_epoch(0, 1)
    assert conflict.value.current == 2
    with pytest.raises(EpochConflict):
        state.save(1, None)
    await shell.record_status(ClusterStatus(phase="Healthy", active="east", epoch=2))
    epoch, status = state.load()
    assert epoch == 2 and status is not None and status.active == "east"
    assert "status phase=Healthy active=east epoch=2" in out.getvalue()
    # A jump above an epoch a broker reported is one write.
    assert await shell.allocate_epoch(2, 95) == 95
    # Only allocate_epoch writes the epoch: a status from an engine that believes in an older
    # one neither fails nor writes it back.
    await shell.record_status(ClusterStatus(phase="Degraded", active="east", epoch=2))
    epoch, status = state.load()
    assert epoch == 95 and status is not None and status.phase == "Degraded"


def test_corrupt_state_file_is_refused_not_reset(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text('{"epoch": 7, "status": ')
    with pytest.raises(ManifestError, match="holds the cluster's epoch"):
        StateFile(path).load()
    path.write_text('{"epoch": -3}')
    with pytest.raises(ManifestError, match="non-negative"):
        StateFile(path).load()
