"""Operator high availability: two operator replicas with kopf peering, on the sealed pod network.

The chart is installed with ``operator.replicas=2`` and a peering name: both operator pods run,
each keeps a record in the namespace's KopfPeering, and only the one with the highest priority
(the older one) handles the BrokerCluster; the other stays paused (kopf logs no resume). Under traffic through
the ``orders-active`` Service, the handling operator's container is killed with -9: the other
replica takes over within a bound, and when the active broker is then killed with -9 it fails
over. Safety is the epoch compare-and-swap, not peering, so the test watches what matters
throughout: never two pods labelled active, every activation logged by either operator (current
and previous container instances) with an epoch above the one before (no epoch granted twice),
``status.epoch`` never going down, and the simulators' records: nothing lost, duplicated or out
of order, both ways.

The chart is installed through ``local_cluster.relay.deploy_relay`` with the HA values.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from local_cluster.relay import CLUSTER_NAME, Relay, deploy_relay
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import wait_for

pytestmark = pytest.mark.e2e

STREAMS, MESSAGES = 4, 150  # per stream, per direction
PEERING = "broker-ha"
PEERING_LIFETIME = 30  # seconds (the chart's): a takeover's bound when the killed replica stays gone
OPERATOR_SELECTOR = "app.kubernetes.io/component=operator"
ACTIVATION = re.compile(
    r"^(\S+ \S+) .*?" + CLUSTER_NAME + r": (\w+): broker (\S+) is active with epoch (\d+)"
)


@pytest.fixture
def relay(sealed_cluster: SealedCluster) -> Iterator[Relay]:
    namespace = f"ha-{uuid.uuid4().hex[:6]}"
    sealed_cluster.kubectl("create", "namespace", namespace)
    relay = _deploy_ha_relay(sealed_cluster, namespace)
    yield relay
    relay.uninstall()
    sealed_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _deploy_ha_relay(cluster: SealedCluster, namespace: str) -> Relay:
    """``deploy_relay`` with two operator replicas and peering."""
    return deploy_relay(
        cluster,
        namespace,
        streams=STREAMS,
        messages_per_stream=MESSAGES,
        helm_values={"operator.replicas": "2", "operator.peering": PEERING},
    )


def _operator_pods(relay: Relay) -> list[str]:
    items = (relay.get("pods", "-l", OPERATOR_SELECTOR) or {}).get("items") or []
    return sorted(pod["metadata"]["name"] for pod in items)


def _peers(relay: Relay) -> dict[str, dict[str, Any]]:
    """The KopfPeering's live records: pod name -> {priority, lifetime, lastseen}."""
    peering = relay.get("kopfpeering", PEERING) or {}
    return {k: v for k, v in (peering.get("status") or {}).items() if v and int(v.get("lifetime", 0)) > 0}


def _logs(relay: Relay, pod: str, previous: bool = False) -> str:
    args = ["-n", relay.namespace, "logs", pod, *(["--previous"] if previous else [])]
    result = relay.cluster.kubectl(*args, check=False)
    return result.stdout if result.returncode == 0 else ""


def _restart_count(relay: Relay, pod: str) -> int:
    statuses = relay.pod(pod)["status"].get("containerStatuses") or [{}]
    return int(statuses[0].get("restartCount") or 0)


class Watcher:
    """Samples the active label and status (epoch, activeEpoch, active) every half second on a
    thread of its own."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        # (time, pods labelled active, status.epoch, status.activeEpoch, status.active)
        self.samples: list[tuple[float, list[str], int, int | None, str | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ha-watcher", daemon=True)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            pods = (self.relay.get("pods", "-l", "role=active") or {}).get("items") or []
            status = self.relay.status()
            self.samples.append(
                (
                    time.monotonic(),
                    sorted(p["metadata"]["name"] for p in pods),
                    int(status.get("epoch") or 0),
                    None if status.get("activeEpoch") is None else int(status["activeEpoch"]),
                    status.get("active"),
                )
            )


def test_two_replicas_one_handles_the_other_takes_over_after_kill_9(relay: Relay) -> None:
    pods = wait_for(
        "two operator pods",
        lambda: len(names := _operator_pods(relay)) == 2 and names,
        timeout=60,
    )
    peers = wait_for(
        "both operators' records in the KopfPeering",
        lambda: set(p := _peers(relay)) == set(pods) and p,
        timeout=90,
        interval=1,
    )
    handler = max(peers, key=lambda name: int(peers[name]["priority"]))
    (standby,) = set(pods) - {handler}
    assert peers[handler]["priority"] != peers[standby]["priority"]
    # kopf starts a replica with mandatory peering paused, and logs when it resumes: the
    # handler did, the standby did not (it saw the handler's higher priority first).
    assert "Resuming operations after the pause" in _logs(relay, handler)
    standby_log = _logs(relay, standby)
    assert "Resuming operations after the pause" not in standby_log
    assert f"peering {PEERING!r}: priority" in standby_log
    # Only the handler has run the engine.
    assert not any(ACTIVATION.match(line) for line in standby_log.splitlines())
    assert any(ACTIVATION.match(line) for line in _logs(relay, handler).splitlines())
    first = relay.status()
    epoch_before = int(first["epoch"])
    handler_restarts = _restart_count(relay, handler)

    with Watcher(relay) as watcher:
        relay.backend("/sim/start", {})
        wait_for(
            "a third of the outbound messages confirmed through the Service",
            lambda: int(relay.backend("/sim/status")["confirmed"]) >= STREAMS * MESSAGES // 3,
            timeout=180,
            interval=0.2,
        )
        # kill -9 of the handling operator's container (the process group, as an OOM kill would).
        killed_at = time.monotonic()
        relay.kill_9(handler)
        wait_for(
            "the standby operator to resume (take over)",
            lambda: "Resuming operations after the pause" in _logs(relay, standby),
            timeout=PEERING_LIFETIME + 90,
            interval=1,
        )
        takeover_seconds = time.monotonic() - killed_at
        wait_for(
            "the BrokerCluster Healthy under the surviving operator",
            lambda: (s := relay.status()).get("phase") == "Healthy" and s.get("active"),
            timeout=120,
            interval=0.5,
        )
        peers = _peers(relay)
        survivor_priority = int(peers[standby]["priority"])
        others = [int(p["priority"]) for name, p in peers.items() if name != standby]
        assert all(priority < survivor_priority for priority in others), peers

        # Now the surviving operator fails over a kill -9 of the active broker.
        active = str(relay.status()["active"])
        epoch_at_broker_kill = int(relay.status()["epoch"])
        relay.kill_9(active)
        after = wait_for(
            "a failover to the other broker",
            lambda: (s := relay.status()).get("active") not in (None, active) and s,
            timeout=120,
        )
        assert int(after["epoch"]) > epoch_at_broker_kill
        relay.wait_all_confirmed(timeout=300)

    # The killed operator came back as a container restart in the same pod, and stands by.
    assert _restart_count(relay, handler) > handler_restarts
    assert "Resuming operations after the pause" not in _logs(relay, handler)

    _check_records(relay)
    _check_watched(watcher)
    activations = _check_activations(relay, handler, standby, epoch_before)
    print(
        f"takeover after operator kill -9: {takeover_seconds:.1f}s; activations: "
        + ", ".join(f"{broker}@{epoch} ({reason})" for _, epoch, broker, reason in activations)
    )


def _check_records(relay: Relay) -> None:
    """Nothing lost, duplicated or out of order, both ways (the simulators' own records)."""
    outbound, inbound = relay.cloud("/sim/received"), relay.backend("/sim/received")
    assert len(outbound) == STREAMS and len(inbound) == STREAMS
    for stream, seqs in [*outbound.items(), *inbound.items()]:
        assert seqs == list(range(1, MESSAGES + 1)), f"{stream}: lost, duplicated or out of order"


def _check_watched(watcher: Watcher) -> None:
    """Never two pods labelled active; status.epoch never went down and never fell behind
    activeEpoch; an activeEpoch names one broker.

    ``active`` is paired with ``activeEpoch`` (written together), not with ``epoch``: the
    allocation's compare-and-swap raises ``epoch`` before the new active is activated, so a
    sample in between shows the new epoch beside the old active by design."""
    assert watcher.samples, "the watcher took no sample"
    assert all(len(active_pods) <= 1 for _, active_pods, _, _, _ in watcher.samples), [
        s for s in watcher.samples if len(s[1]) > 1
    ]
    epochs = [epoch for _, _, epoch, _, _ in watcher.samples]
    assert epochs == sorted(epochs), f"status.epoch went down: {epochs}"
    behind = [s for s in watcher.samples if s[3] is not None and s[3] > s[2]]
    assert not behind, f"activeEpoch above epoch: {behind}"
    holders: dict[int, set[str]] = {}
    for _, _, _, active_epoch, holder in watcher.samples:
        if holder and active_epoch is not None:
            holders.setdefault(active_epoch, set()).add(holder)
    assert holders, "no sample named an active with its epoch"
    assert all(len(names) == 1 for names in holders.values()), holders


def _check_activations(
    relay: Relay, handler: str, standby: str, epoch_before: int
) -> list[tuple[str, int, str, str]]:
    """Every activation either operator logged (both instances of the killed one): each epoch
    went to one broker, epochs rise in time (none granted twice), the last is the cluster's."""
    lines = [
        line
        for text in (_logs(relay, handler, previous=True), _logs(relay, handler), _logs(relay, standby))
        for line in text.splitlines()
    ]
    activations = sorted(
        (m.group(1), int(m.group(4)), m.group(3), m.group(2))
        for line in lines
        if (m := ACTIVATION.match(line))
    )
    granted = [epoch for _, epoch, _, _ in activations]
    per_epoch: dict[int, set[str]] = {}
    for _, epoch, broker, _ in activations:
        per_epoch.setdefault(epoch, set()).add(broker)
    assert all(len(brokers) == 1 for brokers in per_epoch.values()), f"an epoch granted twice: {activations}"
    first_seen = sorted(set(granted), key=granted.index)
    assert first_seen == sorted(first_seen), f"epochs out of order: {activations}"
    assert max(granted) == int(relay.status()["epoch"]) >= epoch_before
    return activations
