"""Epoch allocation through the API server, with optimistic concurrency as the fence.

An epoch is what lets a broker refuse an operator that lost track of time: a
broker stores the highest epoch it was activated with and answers
``STALE_EPOCH`` to anything lower. That only works if no two activations ever
carry the same epoch, even with two operator replicas running at once (an
upgrade, a split brain, a misconfigured Helm release). kopf peering does not
guarantee that (it is a courtesy between operators, not a lock), so the
allocation is a compare-and-swap on the BrokerCluster itself:

1. read the object; its ``status.epoch`` is the highest epoch ever granted;
2. if it is above what the caller believes, someone else allocated: conflict;
3. merge-patch ``status.epoch = epoch`` (``current + 1``, or higher when the
   engine jumps above an epoch a broker reported) carrying the
   ``resourceVersion`` that was read. The API server applies the patch only if
   the object is still at that version and answers 409 otherwise: conflict.

Whoever gets the 200 owns ``epoch`` (and every epoch skipped below it, which
nobody will use); the loser re-reads and retries or gives up the round (the
engine decides).

Step 1 may be skipped: the daemon holds kopf's live view of the object, as the
last watch event left it (``known``). Checking and writing against it is the same
compare-and-swap, since the API server applies the patch only if the object is
still exactly that version; it saves a round trip on the failover's path. If the
view was behind (a 409), the allocation reads once and tries again, as without
it; a conflict after that read is the caller's to handle.

This is the only writer of ``status.epoch``. The engine's status patch leaves
it out (``ClusterStatus.to_status_patch``): an unconditional write of the
epoch an engine believed in, after it stalled past another's allocation, put
a lower epoch back, and the next allocation handed out one already granted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from broker_operator.controller.kube import HTTP_CONFLICT, KubeApi
from broker_operator.engine import EpochConflict


async def allocate_epoch(
    api: KubeApi,
    namespace: str,
    cluster: str,
    current: int,
    epoch: int | None = None,
    *,
    known: Mapping[str, Any] | None = None,
) -> int:
    """Record ``epoch`` (default ``current + 1``) as BrokerCluster ``namespace/cluster``'s epoch,
    or raise ``EpochConflict`` if another writer got there first. ``known``: the object as last
    seen (kopf's live body), tried before a read."""
    wanted = current + 1 if epoch is None else epoch
    if wanted <= current:
        raise ValueError(f"epoch to allocate ({wanted}) must be above the current epoch ({current})")
    if known is not None and known.get("metadata", {}).get("resourceVersion"):
        with contextlib.suppress(_StaleVersionError):
            return await _write(api, namespace, cluster, known, current=current, wanted=wanted)
    body = await api.read_cluster(namespace, cluster)
    try:
        return await _write(api, namespace, cluster, body, current=current, wanted=wanted)
    except _StaleVersionError as stale:
        raise EpochConflict(
            f"BrokerCluster {namespace}/{cluster} changed since resourceVersion {stale.version} was read; "
            f"epoch {wanted} was not recorded"
        ) from stale.__cause__


class _StaleVersionError(Exception):
    def __init__(self, version: str) -> None:
        super().__init__(version)
        self.version = version


async def _write(
    api: KubeApi, namespace: str, cluster: str, body: Mapping[str, Any], *, current: int, wanted: int
) -> int:
    """Check ``body``'s epoch and patch ``wanted`` on condition of ``body``'s version."""
    stored = int((body.get("status") or {}).get("epoch") or 0)
    if stored > current:
        raise EpochConflict(
            f"BrokerCluster {namespace}/{cluster} status.epoch is {stored}, above {current}: "
            "another operator allocated an epoch; re-read the status before activating anything",
            current=stored,
        )
    version = body["metadata"].get("resourceVersion")
    if not version:
        # Without a version there is no precondition, and an unconditional write could hand out
        # an epoch twice. A real API server always sends one; refuse rather than guess.
        raise RuntimeError(
            f"BrokerCluster {namespace}/{cluster} came back without metadata.resourceVersion; "
            "refusing to record an epoch without a precondition"
        )
    patch = {"metadata": {"resourceVersion": version}, "status": {"epoch": wanted}}
    try:
        await api.patch_cluster_status(namespace, cluster, patch)
    except ApiException as error:
        if error.status == HTTP_CONFLICT:
            raise _StaleVersionError(str(version)) from error
        raise
    return wanted
