"""Pausing a BrokerCluster under traffic, on the sealed local cluster (issue 42, docs/pause.md).

The relay as users run it (``local_cluster.relay``: the chart's operator as a pod, the example's
two broker pods, the backend and the cloud as simulator pods sending through the ``-active``
Service, more outbound traffic fed all along). With the annotation
``broker.failover.dev/pause-reconciliation: "true"`` set:

- for two leases, the active stays Active at its epoch by its own metrics (it is renewed; it never
  fences itself), the backend's confirmations keep moving, ``kubectl get bc`` shows PAUSED True;
- the standby pod deleted by hand is not made again;
- the active's container killed with -9 is not failed over, past its lease: the status keeps the
  active and its epoch with phase ``Unavailable``, the condition says why, a ``FailoverPaused``
  Warning is posted and no ``Failover``; ``kubectl broker status`` shows the pause;

then the annotation removed: the failover happens at once under a new epoch, the standby pod comes
back, and the simulators' records show nothing lost, taken twice or out of order.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from broker_operator.core.pause import PAUSE_ANNOTATION
from local_cluster.relay import CLUSTER_NAME, Feeder, Relay
from local_cluster.sealed_cluster import SealedCluster
from local_cluster.soak_faults import broker_metrics
from tests.e2e.support import relay_in_new_namespace, wait_for
from tests.e2e.test_kubectl_plugin import plugin
from tests.e2e.test_operator import bc_row
from tests.e2e.test_upgrade import confirmed, event_counts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

BROKERS = (f"{CLUSTER_NAME}-0", f"{CLUSTER_NAME}-1")
LEASE = 10.0  # the example's heartbeat.leaseSeconds
RECONCILE = 10.0  # the operator's --reconcile-seconds (the chart's default)


@pytest.fixture(scope="module")
def relay(sealed_cluster: SealedCluster) -> Iterator[Relay]:
    # Manual: after the resume, the active stays where the failover put it (one move to check).
    with relay_in_new_namespace(
        sealed_cluster, "pause", streams=2, messages_per_stream=20, spec={"failback": "Manual"}
    ) as relay:
        yield relay


def set_pause(relay: Relay, value: str | None) -> None:
    """``kubectl annotate``, as a person pauses (``true``) or resumes (None: the annotation removed)."""
    change = f"{PAUSE_ANNOTATION}=true" if value else f"{PAUSE_ANNOTATION}-"
    relay.cluster.kubectl("-n", relay.namespace, "annotate", "--overwrite", "bc", CLUSTER_NAME, change)


def paused_condition(relay: Relay) -> dict[str, Any]:
    conditions = relay.status().get("conditions") or []
    return next((c for c in conditions if c["type"] == "ReconciliationPaused"), {})


def term(relay: Relay, broker: str) -> dict[str, float]:
    """The broker's own ``broker_active`` and ``broker_epoch``; a scrape that timed out on the loaded
    node is tried again (an empty answer says nothing about the broker's term)."""
    return wait_for(f"{broker}'s metrics", lambda: broker_metrics(relay, broker), timeout=30, interval=1)


def row(relay: Relay) -> dict[str, str]:
    return bc_row(relay.cluster, relay.namespace, CLUSTER_NAME)


def test_paused_under_traffic_nothing_fences_nothing_is_made_or_failed_over_until_resumed(
    relay: Relay,
) -> None:
    relay.backend("/sim/start", {})
    feeder = Feeder(relay, per_stream=2, tick=0.2).start()
    try:
        wait_for("traffic confirmed", lambda: confirmed(relay) > 0, timeout=120)
        status = relay.status()
        active, epoch = str(status["active"]), int(status["epoch"])
        (standby,) = [name for name in BROKERS if name != active]
        before = event_counts(relay)

        set_pause(relay, "true")
        shown = wait_for("PAUSED True in kubectl get bc", lambda: (r := row(relay))["PAUSED"] == "True" and r)
        assert (shown["ACTIVE"], shown["EPOCH"], shown["PHASE"]) == (active, str(epoch), "Healthy"), shown
        assert paused_condition(relay)["reason"] == "Paused"

        # Two leases of traffic: the active is renewed and keeps its term; confirmations move on.
        counts = [confirmed(relay)]
        end = time.monotonic() + 2 * LEASE
        while time.monotonic() < end:
            held = term(relay, active)
            assert held == {"broker_active": 1.0, "broker_epoch": float(epoch)}, held
            time.sleep(2)
            counts.append(confirmed(relay))
        assert counts[-1] > counts[len(counts) // 2] > counts[0], counts

        # The standby deleted by hand stays deleted for several reconcile passes.
        relay.cluster.kubectl("-n", relay.namespace, "delete", "pod", standby, "--wait=true", timeout=120)
        time.sleep(3 * RECONCILE)
        assert relay.get("pod", standby) is None, "the standby pod was made again while paused"
        assert term(relay, active) == {"broker_active": 1.0, "broker_epoch": float(epoch)}

        # The active killed: no failover decision while paused, however long.
        relay.kill_9(active)
        wait_for("a FailoverPaused event", lambda: event_counts(relay)["FailoverPaused"] >= 1, timeout=60)
        wait_for(
            "the condition saying the active is not failed over",
            lambda: paused_condition(relay).get("reason") == "PausedActiveUnavailable",
            timeout=3 * RECONCILE,
        )
        time.sleep(LEASE + 5)  # past the active's lease and the fence's margin
        status = relay.status()
        assert (status["active"], int(status["epoch"]), status["phase"]) == (active, epoch, "Unavailable")
        during = event_counts(relay) - before
        assert during["Failover"] == 0 and during["ActiveUnavailable"] == 0, during
        assert during["ReconciliationPaused"] == 1, during
        assert relay.get("pod", standby) is None
        assert (shown := row(relay))["PAUSED"] == "True" and shown["PHASE"] == "Unavailable", shown
        text = plugin(relay.cluster, "status", CLUSTER_NAME, "-n", relay.namespace, "--no-held")
        assert text.returncode == 0, text.stderr
        assert "Paused:     PAUSED since" in text.stdout and "NOT failed over" in text.stdout

        # Resumed: the failover at once, under a new epoch; the standby pod made again.
        set_pause(relay, None)
        after = wait_for(
            "a failover under a new epoch",
            lambda: (
                (s := relay.status()).get("phase") in ("Healthy", "Degraded")
                and int(s.get("epoch") or 0) > epoch
                and s
            ),
            timeout=180,
        )
        assert after["lastFailover"]["from"] == active, after
        wait_for("the standby pod made again", lambda: relay.get("pod", standby) is not None, timeout=120)
        wait_for("PAUSED False", lambda: row(relay)["PAUSED"] == "False", timeout=3 * RECONCILE)
        during = event_counts(relay) - before
        assert during["Failover"] >= 1 and during["ReconciliationResumed"] == 1, during
    finally:
        feeder.stop.set()
    relay.wait_all_confirmed()
    assert relay.record_violations() == {"lost": 0, "twice": 0, "out-of-order": 0}
