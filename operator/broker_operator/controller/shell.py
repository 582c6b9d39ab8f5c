"""The Kubernetes side of the engine's ``ClusterShell``: epochs, the active label, status, events.

The failover engine decides; this carries out its decisions against the API
server for one BrokerCluster:

- ``allocate_epoch``: the conditional write of the next epoch (``epochs.py``),
  the only write of ``status.epoch``;
- ``move_active_label``: take ``role=active`` off every other pod first, then
  put it on the new active, so the ``<name>-active`` Service never selects two
  brokers (endpoints mode has no pods: nothing to move);
- ``record_status``: a merge patch of the status subresource without ``epoch``
  (which has no precondition here and so must not be written here); the engine
  calls it only when the status changed, so there is no write per heartbeat;
- ``record_event``: a Kubernetes Event on the BrokerCluster, through kopf's
  event poster (batched, retried, never blocking a heartbeat);
- ``pod_facts``: what the pod watch last saw (``observed.py``).

It makes no decision of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf

from broker_operator.controller import names
from broker_operator.controller.epochs import allocate_epoch
from broker_operator.controller.kube import KubeApi
from broker_operator.controller.observed import ClusterObservations, facts_for
from broker_operator.core.model import PodFacts
from broker_operator.core.status import ClusterStatus
from broker_operator.engine import EpochConflict

logger = logging.getLogger(__name__)


class KubernetesClusterShell:
    """``ClusterShell`` for one BrokerCluster, in pods mode or endpoints mode."""

    def __init__(
        self,
        api: KubeApi,
        body: Mapping[str, Any],
        observations: ClusterObservations,
        broker_names: Mapping[str, object],
        *,
        manages_pods: bool,
    ) -> None:
        self._api = api
        self._body = body  # for event references only: kind, name, namespace, uid
        self._namespace = str(body["metadata"]["namespace"])
        self._cluster = str(body["metadata"]["name"])
        self._observations = observations
        self._broker_names = broker_names
        self._manages_pods = manages_pods

    def set_broker_names(self, broker_names: Mapping[str, object]) -> None:
        """The brokers the engine knows of changed (spec update): report facts for exactly these."""
        self._broker_names = broker_names

    async def allocate_epoch(self, current: int, epoch: int) -> int:
        try:
            granted = await allocate_epoch(self._api, self._namespace, self._cluster, current, epoch)
        except EpochConflict as conflict:
            logger.warning("%s/%s: epoch %d not granted: %s", self._namespace, self._cluster, epoch, conflict)
            raise
        logger.info("%s/%s: epoch %d recorded", self._namespace, self._cluster, granted)
        return granted

    async def move_active_label(self, active: str | None) -> None:
        if not self._manages_pods:
            return
        pods = await self._api.list_cluster_pods(self._namespace, self._cluster)
        labelled = {
            pod["metadata"]["name"]: (pod["metadata"].get("labels") or {}).get(names.LABEL_ROLE)
            for pod in pods
        }
        # Demote before promoting: for a moment no pod is selected, never two.
        for pod, role in labelled.items():
            if pod != active and role != names.ROLE_STANDBY:
                await self._api.set_pod_role(self._namespace, pod, names.ROLE_STANDBY)
        if active is not None and active in labelled and labelled[active] != names.ROLE_ACTIVE:
            await self._api.set_pod_role(self._namespace, active, names.ROLE_ACTIVE)

    async def record_status(self, status: ClusterStatus) -> None:
        await self._api.patch_cluster_status(
            self._namespace, self._cluster, {"status": status.to_status_patch()}
        )

    async def record_event(self, reason: str, message: str, warning: bool) -> None:
        kopf.event(self._body, type="Warning" if warning else "Normal", reason=reason, message=message)  # type: ignore[arg-type]

    def pod_facts(self) -> Mapping[str, PodFacts]:
        if not self._manages_pods:
            return {}
        return facts_for(self._observations.pods, self._broker_names)
