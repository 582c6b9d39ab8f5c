"""``helm upgrade`` of the operator alone, as a user makes it: the release's values kept
(``--reuse-values``), one or two of them changed, so that the operator's Deployment rolls a new
ReplicaSet and its pod is replaced.

Shared by the upgrade test (tests/e2e/test_upgrade.py), the soak's ``upgrade-operator`` fault and
``make bench-operator-upgrade-k8s``, so all three replace the pod the same way. A changed CPU
request is the smallest change that rolls the pod (the chart has no pod-annotation value); it is
what issue 40's report changed. How the Deployment replaces the pod (``Recreate``, or a rolling
update with a surge pod) is the chart's business, never set here: the point is the chart's
defaults.

It returns once the upgrade is complete as a user sees it: ``helm upgrade --wait`` returned (the
new pod is Ready), no pod of the old ReplicaSet is left (a rolling update's old pod may still be
terminating when helm returns: its SIGTERM is where it hands over) and every operator pod is Ready.
It judges nothing about the brokers: what the upgrade must not move is for its callers to check.
"""

from __future__ import annotations

import time
import urllib.request
from dataclasses import dataclass
from typing import Any

from local_cluster.relay import CHART, Relay, RelayError, wait_until

OPERATOR_PODS = "app.kubernetes.io/component=operator"
CPU_REQUEST = "operator.resources.requests.cpu"
# Two requests to alternate between: each upgrade changes the pod template, and neither asks the
# node for more than the chart's default (100m) does, by much.
CPU_REQUESTS = ("100m", "101m")


@dataclass(frozen=True)
class OperatorRoll:
    """What one upgrade replaced: the operator pods before and after (name to uid), and how long
    it took from the ``helm upgrade`` to the last old pod gone."""

    before: dict[str, str]
    after: dict[str, str]
    seconds: float


def operator_pods(relay: Relay) -> dict[str, str]:
    """The release's operator pods, name to uid (terminating ones included: they still run)."""
    pods = relay.get("pods", "-l", OPERATOR_PODS) or {}
    return {str(p["metadata"]["name"]): str(p["metadata"]["uid"]) for p in pods.get("items") or []}


def _operator_cpu_request(relay: Relay) -> str:
    deployments = (relay.get("deployments", "-l", OPERATOR_PODS) or {}).get("items") or []
    if not deployments:
        raise RelayError(f"no operator Deployment in {relay.namespace}")
    container: dict[str, Any] = deployments[0]["spec"]["template"]["spec"]["containers"][0]
    return str(((container.get("resources") or {}).get("requests") or {}).get("cpu", ""))


def next_cpu_request(relay: Relay) -> dict[str, str]:
    """A ``--set`` that changes the operator pod's CPU request from what the release has now."""
    current = _operator_cpu_request(relay)
    return {CPU_REQUEST: CPU_REQUESTS[1] if current == CPU_REQUESTS[0] else CPU_REQUESTS[0]}


def upgrade_operator(
    relay: Relay, values: dict[str, str] | None = None, timeout: float = 240
) -> OperatorRoll:
    """``helm upgrade --reuse-values`` with ``values`` set (default: ``next_cpu_request``); returns
    once every old operator pod is gone and the new ones are Ready. A RelayError says which step
    did not happen in time."""
    before = operator_pods(relay)
    if not before:
        raise RelayError(f"no operator pod in {relay.namespace} by {OPERATOR_PODS}")
    changes = values if values is not None else next_cpu_request(relay)
    settings = [argument for key, value in changes.items() for argument in ("--set", f"{key}={value}")]
    began = time.monotonic()
    relay.cluster.helm(
        "upgrade", relay.release, str(CHART), "--namespace", relay.namespace, "--reuse-values",
        *settings, "--wait", f"--timeout={timeout:.0f}s",
        timeout=timeout + 60,
    )  # fmt: skip

    def replaced() -> dict[str, str] | None:
        now = operator_pods(relay)
        if not now or set(now.values()) & set(before.values()):
            return None
        return now if all(relay.pod_ready(name) for name in now) else None

    after = wait_until("every old operator pod gone and the new ones Ready", replaced, timeout, 0.25)
    return OperatorRoll(before=before, after=dict(after), seconds=time.monotonic() - began)


def operator_heartbeats(relay: Relay) -> dict[str, float]:
    """Heartbeats each operator container made so far (its /metrics), by pod uid and restart count:
    one that grew since an earlier look is an operator at work (a replaced pod starts at 0)."""
    counts = {}
    for name in operator_pods(relay):
        pod = relay.get("pod", name)
        if not pod:
            continue  # gone since the list: a replaced pod heartbeats no more
        ip = pod["status"].get("podIP")
        restarts = (pod["status"].get("containerStatuses") or [{}])[0].get("restartCount", 0)
        key = f"{pod['metadata']['uid']}/{restarts}"

        def scrape(address: str = str(ip)) -> str:
            with urllib.request.urlopen(f"http://{address}:9090/metrics", timeout=2) as reply:
                return str(reply.read().decode())

        try:
            text = relay.cluster.call_in_network(scrape)
        except OSError:
            continue
        counts[key] = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("broker_failover_heartbeats_total{")
        )
    return counts
