"""The engine's status write, on condition that no newer term has begun: the stored epoch.

Two engines can run one BrokerCluster for a moment: a replica pausing for another (kopf peering)
or stopping lets its engine's last status land within ``status_grace_seconds``, and a request
already sent lands whenever the API server takes it. The engine that took over writes its status
only when that changes, so a late write of the older engine, naming the active it knew, stood over
the newer one's until the newer one's next change: in CI, ``status.active`` named orders-0 for 11 s
after the ``role=active`` label and the ``-active`` Service had moved to orders-1 (issue 40).

A change of active takes a new epoch (the compare-and-swap of ``epochs.py``), so the stored
``status.epoch`` says which term is newest. The write carries the writer's epoch: it goes through
only if the stored epoch is not above it, checked and written as one compare-and-swap on the
``resourceVersion`` (against kopf's live view first, as the epoch's allocation does, then a fresh
read after a 409). A writer whose epoch is behind gets :class:`StatusFenced` and writes nothing.
Two engines in one term (a takeover that renewed the active it found) both name that active.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from kubernetes.client.exceptions import ApiException

from broker_operator.controller.kube import HTTP_CONFLICT, KubeApi
from broker_operator.status_writer import StatusFenced

WRITE_ATTEMPTS: Final = 3
"""Conditional writes before giving up (each loses only to another write of the object; the
engine hands its status over again at its next step)."""


async def record_status_under_epoch(
    api: KubeApi,
    namespace: str,
    cluster: str,
    fields: Mapping[str, Any],
    epoch: int,
    *,
    known: Mapping[str, Any] | None = None,
) -> None:
    """Merge-patch ``fields`` into the status of BrokerCluster ``namespace/cluster`` unless its
    ``status.epoch`` is above ``epoch`` (then :class:`StatusFenced`). ``known``: kopf's live view
    of the object, tried before a read."""
    body = known if known is not None and known.get("metadata", {}).get("resourceVersion") else None
    for _ in range(WRITE_ATTEMPTS):
        if body is None:
            body = await api.read_cluster(namespace, cluster)
        stored = int((body.get("status") or {}).get("epoch") or 0)
        if stored > epoch:
            raise StatusFenced(
                f"BrokerCluster {namespace}/{cluster} is at epoch {stored}, above this engine's {epoch}: "
                "a newer engine writes its status"
            )
        patch: dict[str, Any] = {"status": dict(fields)}
        version = body.get("metadata", {}).get("resourceVersion")
        if version:
            patch["metadata"] = {"resourceVersion": version}
        try:
            await api.patch_cluster_status(namespace, cluster, patch)
        except ApiException as error:
            if error.status != HTTP_CONFLICT:
                raise
            body = None  # changed since: read it, and check the epoch again
            continue
        return
    raise RuntimeError(
        f"BrokerCluster {namespace}/{cluster} changed under each of {WRITE_ATTEMPTS} status writes"
    )
