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
engine decides). This module does not retry.

This is the only writer of ``status.epoch``. The engine's status patch leaves
it out (``ClusterStatus.to_status_patch``): an unconditional write of the
epoch an engine believed in, after it stalled past another's allocation, put
a lower epoch back, and the next allocation handed out one already granted.
"""

from __future__ import annotations

from kubernetes.client.exceptions import ApiException

from broker_operator.controller.kube import HTTP_CONFLICT, KubeApi
from broker_operator.engine import EpochConflict


async def allocate_epoch(
    api: KubeApi, namespace: str, cluster: str, current: int, epoch: int | None = None
) -> int:
    """Record ``epoch`` (default ``current + 1``) as BrokerCluster ``namespace/cluster``'s epoch,
    or raise ``EpochConflict`` if another writer got there first."""
    wanted = current + 1 if epoch is None else epoch
    if wanted <= current:
        raise ValueError(f"epoch to allocate ({wanted}) must be above the current epoch ({current})")
    body = await api.read_cluster(namespace, cluster)
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
            raise EpochConflict(
                f"BrokerCluster {namespace}/{cluster} changed since resourceVersion {version} was read; "
                f"epoch {wanted} was not recorded"
            ) from error
        raise
    return wanted
