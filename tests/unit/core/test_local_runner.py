"""The local runner's manifest reading and state file: bad input is refused, epochs never go back.

No processes here (``tests/integration/operator/test_local_runner_cli.py`` runs the
command for real); these check the parts that decide what the runner accepts.
"""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest
import yaml

from broker_operator.core.pause import PAUSE_ANNOTATION
from broker_operator.core.status import ClusterStatus
from broker_operator.engine import EpochConflict
from broker_operator.local_runner import (
    LocalShell,
    ManifestError,
    StateFile,
    _follow_manifest,
    parse_manifest,
    read_manifest,
)

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


def test_the_pause_annotation_pauses_and_its_other_edits_wait_for_the_resume(tmp_path: Path) -> None:
    """As in the operator (docs/pause.md): the runner's engine keeps its spec while paused."""
    paused = {**GOOD, "metadata": {"name": "acme-1000", "annotations": {PAUSE_ANNOTATION: "true"}}}
    assert parse_manifest(paused).paused and not parse_manifest(GOOD).paused
    manifest = tmp_path / "cluster.yaml"
    manifest.write_text(yaml.safe_dump(GOOD), encoding="utf-8")
    updates: list[tuple[str | None, bool | None]] = []

    class Loop:
        def update(self, targets: object, settings: object, preferred: str | None, *, paused: bool) -> None:
            updates.append((preferred, paused))

    async def follow() -> None:
        engine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        following = asyncio.ensure_future(
            _follow_manifest(manifest, Loop(), engine, parse_manifest(GOOD))  # type: ignore[arg-type]
        )

        async def edit(document: dict[str, object], count: int) -> None:
            await asyncio.sleep(0.05)
            manifest.write_text(yaml.safe_dump(document), encoding="utf-8")
            for _ in range(50):
                if len(updates) >= count:
                    return
                await asyncio.sleep(0.1)

        edited = {**paused, "spec": {**GOOD["spec"], "preferredActive": "east"}}  # type: ignore[dict-item]
        await edit(edited, 1)
        await edit({**edited, "metadata": {"name": "acme-1000"}}, 2)
        engine.set_result(None)
        await following

    asyncio.run(follow())
    assert updates == [("west", True), ("east", False)]
