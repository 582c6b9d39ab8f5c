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
3. merge-patch ``status.epoch = current + 1`` carrying the ``resourceVersion``
   that was read. The API server applies the patch only if the object is still
   at that version and answers 409 otherwise: conflict.

Whoever gets the 200 owns ``current + 1``; the loser re-reads and retries or
gives up the round (the engine decides). This module does not retry.
"""

from __future__ import annotations

from kubernetes.client.exceptions import ApiException

from broker_operator.controller.kube import HTTP_CONFLICT, KubeApi
from broker_operator.engine import EpochConflict


async def allocate_epoch(api: KubeApi, namespace: str, cluster: str, current: int) -> int:
    """Record ``current + 1`` as BrokerCluster ``namespace/cluster``'s epoch, or raise ``EpochConflict``."""
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
    patch = {"metadata": {"resourceVersion": version}, "status": {"epoch": current + 1}}
    try:
        await api.patch_cluster_status(namespace, cluster, patch)
    except ApiException as error:
        if error.status == HTTP_CONFLICT:
            raise EpochConflict(
                f"BrokerCluster {namespace}/{cluster} changed since resourceVersion {version} was read; "
                f"epoch {current + 1} was not recorded"
            ) from error
        raise
    return current + 1
