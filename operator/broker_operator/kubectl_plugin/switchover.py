"""``kubectl broker switchover CLUSTER BROKER``: ask the operator for a planned move and watch it happen.

The request is what it is with raw kubectl: a merge patch of ``spec.preferredActive``. The operator
acts on a *change* of that field (docs/failover-engine.md, rule 5: drain the active, then activate
the target with the next epoch), so when it already names BROKER while another broker is active
(a failover since), the field is cleared first and set again after the operator has had time to
see the clearing.

Then the plugin reads the BrokerCluster every half second until ``status.active`` is BROKER, printing
each change of phase, active and the target's state, and gives up after ``--timeout``. It stops
early when the status says the target refused: the move has settled (phase not ``FailingOver``)
on another broker and the target's entry, recorded after the request, is ``Unavailable`` with a
code (``BACKEND_UNREACHABLE``, ``STALE_EPOCH``, ...). It never heartbeats a broker itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from broker_operator.controller import names
from broker_operator.controller.bodies import BrokerClusterBody
from broker_operator.kubectl_plugin.errors import PluginError, UsageError
from broker_operator.kubectl_plugin.kube import Kube, cluster_spec
from broker_operator.kubectl_plugin.status_view import parse_time, status_of

POLL_SECONDS: Final = 0.5
FAILING_OVER: Final = "FailingOver"


@dataclass(frozen=True)
class Progress:
    """What one look at the status says about the switchover to ``broker``."""

    done: bool
    refused: str | None  # why the target will not become active, when the status says so
    line: str  # a progress line for the person waiting


def progress(status: Mapping[str, Any], broker: str, requested_at: datetime) -> Progress:
    """Pure: the switchover's state from ``status`` alone (``requested_at``: when the patch was sent)."""
    active, phase = status.get("active"), status.get("phase")
    entry: Mapping[str, Any] = next((b for b in status.get("brokers") or [] if b.get("name") == broker), {})
    state, code = entry.get("state") or "not reported", entry.get("unavailabilityCode")
    line = f"phase {phase or '-'}, active {active or 'none'}, {broker} {state}" + (
        f" ({code})" if code else ""
    )
    if active == broker:
        return Progress(True, None, line)
    seen = parse_time(entry.get("lastHeartbeatTime"))
    fresh = seen is not None and seen >= requested_at
    if phase != FAILING_OVER and state == "Unavailable" and code and fresh:
        message = entry.get("unavailabilityMessage") or "no message"
        return Progress(False, f"{broker} refused activation: {code}: {message}", line)
    return Progress(False, None, line)


def brokers_of(body: BrokerClusterBody) -> list[str]:
    """The brokers a switchover may name, as the CRD's rule allows them: pods by replicas, or endpoints."""
    spec = cluster_spec(body)
    name = body["metadata"]["name"]
    if spec.endpoints_mode:
        return [e.name for e in spec.endpoints]
    return [names.pod_name(name, ordinal) for ordinal in range(spec.replicas)]


def switchover(
    kube: Kube,
    cluster: str,
    broker: str,
    *,
    timeout: float,
    wait: bool,
    say: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> str:
    """Request the move and (with ``wait``) follow it; returns the closing sentence or raises."""
    body = kube.get_cluster(cluster)
    known = brokers_of(body)
    if broker not in known:
        raise UsageError(
            f"broker {broker!r} is not in BrokerCluster {cluster} (its brokers: {', '.join(known)})"
        )
    status = status_of(body)
    preferred = (body.get("spec") or {}).get("preferredActive")
    if status.get("active") == broker:
        if preferred != broker:
            kube.set_preferred_active(cluster, broker)  # keeps it there under Automatic failback
        return f"{broker} is already the active broker of {cluster} (epoch {status.get('epoch')})"
    if preferred == broker:
        # The engine acts on a change of the field only; let it see the clearing first.
        settle = (
            2.0 * float(((body.get("spec") or {}).get("heartbeat") or {}).get("intervalSeconds") or 1) + 1.0
        )
        say(f"spec.preferredActive already names {broker}; clearing it and setting it again in {settle:g}s")
        kube.set_preferred_active(cluster, None)
        sleep(settle)
    requested_at = now().replace(microsecond=0)  # status times may be whole seconds
    kube.set_preferred_active(cluster, broker)
    say(f"switchover of {cluster} to {broker} requested (spec.preferredActive={broker})")
    if not wait:
        return "not waiting (--wait=false); follow it with: kubectl broker status " + cluster
    deadline = clock() + timeout
    last_line = ""
    while True:
        seen = progress(status_of(kube.get_cluster(cluster)), broker, requested_at)
        if seen.line != last_line:
            say(f"  {seen.line}")
            last_line = seen.line
        if seen.done:
            epoch = status_of(kube.get_cluster(cluster)).get("epoch")
            return f"{broker} is now the active broker of {cluster} (epoch {epoch})"
        if seen.refused:
            raise PluginError(f"switchover of {cluster} to {broker} failed: {seen.refused}")
        if clock() >= deadline:
            raise PluginError(
                f"switchover of {cluster} to {broker} did not complete within {timeout:g}s ({seen.line}); "
                "the operator switches only to a ready standby: check the pod and "
                f"`kubectl describe brokercluster {cluster}` for SwitchoverRefused events"
            )
        sleep(POLL_SECONDS)
