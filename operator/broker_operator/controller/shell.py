"""The Kubernetes side of the engine's ``ClusterShell``: epochs, the active label, status, events.

The failover engine decides; this carries out its decisions against the API
server for one BrokerCluster:

- ``allocate_epoch``: the conditional write of the next epoch (``epochs.py``),
  the only write of ``status.epoch``;
- ``point_active``: write the ``<name>-active`` Service's EndpointSlice, fenced by the
  epoch (``active_service.py``; a Service of the selector era is converted first), then
  move the ``role=active`` label, off every other pod first (endpoints mode has no
  pods and no Service: nothing to point);
- ``record_status``: a merge patch of the status subresource without ``epoch`` (whose only
  writer is the allocation), on condition that the stored epoch is not above the engine's
  (``status_fence.py``: a late write of an older engine never stands over a newer one's); the
  engine calls it only when the status changed, so there is no write per heartbeat;
- ``record_event``: a Kubernetes Event on the BrokerCluster, posted here rather than by kopf's
  poster, whose queue is dropped when the operator stops (the engine posts it beside its steps,
  ``status_writer.EventWriter``, and lets it land within its grace);
- ``pod_facts``: what the pod watch last saw (``observed.py``).

It makes no decision of its own.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from broker_operator.controller import active_service, names
from broker_operator.controller.epochs import allocate_epoch
from broker_operator.controller.kube import KubeApi
from broker_operator.controller.observed import ClusterObservations, facts_for, main_port
from broker_operator.controller.status_fence import record_status_under_epoch
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
        # kopf's live view: event references, and the epoch's compare-and-swap without a read first
        self._body = body
        self._namespace = str(body["metadata"]["namespace"])
        self._cluster = str(body["metadata"]["name"])
        self._observations = observations
        self._broker_names = broker_names
        self._manages_pods = manages_pods
        self._service_converted = False
        # The highest epoch this engine was granted: its status writes are of that term at least,
        # though a step's status is computed before the grant is folded in (record_status).
        self._granted = 0
        self._slice = active_service.KnownSlice()  # the last write's result: the next one's precondition
        self._tidying: asyncio.Task[None] | None = None

    def set_broker_names(self, broker_names: Mapping[str, object]) -> None:
        """The brokers the engine knows of changed (spec update): report facts for exactly these."""
        self._broker_names = broker_names

    async def allocate_epoch(self, current: int, epoch: int) -> int:
        try:
            granted = await allocate_epoch(
                self._api, self._namespace, self._cluster, current, epoch, known=self._body
            )
        except EpochConflict as conflict:
            logger.warning("%s/%s: epoch %d not granted: %s", self._namespace, self._cluster, epoch, conflict)
            raise
        logger.info("%s/%s: epoch %d recorded", self._namespace, self._cluster, granted)
        self._granted = max(self._granted, granted)
        return granted

    async def point_active(self, active: str | None, epoch: int, url: str | None) -> None:
        if not self._manages_pods:
            return
        if not self._service_converted:
            # Once per engine: a Service created with a selector (before issue 23) stops selecting,
            # and the EndpointSlice controller's slices go, before ours is written: no moment with
            # two endpoints, a short one with none.
            if await active_service.convert_selector_service(self._api, self._namespace, self._cluster):
                await active_service.delete_controller_slices(self._api, self._namespace, self._cluster)
            self._service_converted = True
        endpoint = self._endpoint(active, url)
        began = time.monotonic()
        wrote = await active_service.point_active_service(self._api, self._body, endpoint, epoch, self._slice)
        self._observations.slice_version = (self._slice.body or {}).get("metadata", {}).get("resourceVersion")
        if wrote:
            logger.info(
                "%s/%s: the -active Service points at %s (epoch %d), written in %.0f ms",
                self._namespace,
                self._cluster,
                active or "nobody",
                epoch,
                (time.monotonic() - began) * 1000,
            )
        # A controller with a lagging informer may have written a slice of its own since: looked
        # for beside the next steps, not before them (a blank's step precedes the activation).
        if self._tidying is None or self._tidying.done():
            self._tidying = asyncio.create_task(self._delete_controller_slices())
        if active is not None:
            await self._move_active_label(active)

    async def _delete_controller_slices(self) -> None:
        try:
            if await active_service.delete_controller_slices(self._api, self._namespace, self._cluster):
                logger.warning(
                    "%s/%s: deleted an EndpointSlice controller's slice of the -active Service",
                    self._namespace,
                    self._cluster,
                )
        except Exception:  # looked for again at the next write of the Service
            logger.exception(
                "%s/%s: looking for controllers' EndpointSlices failed", self._namespace, self._cluster
            )

    def _endpoint(self, active: str | None, url: str | None) -> active_service.ActiveEndpoint | None:
        """The address the engine activated ``active`` at (its URL), with the pod's identity."""
        if active is None or url is None:
            return None
        address = urlsplit(url).hostname
        if address is None:
            raise ValueError(f"{active}: no address in its URL {url!r}")
        pod = self._observations.pods.get(active)
        if pod is None or pod.get("status", {}).get("podIP") != address:
            # Not the pod the engine activated (replaced since): the address alone, no identity.
            return active_service.ActiveEndpoint(pod=active, address=address)
        return active_service.ActiveEndpoint(
            pod=active,
            address=address,
            port=main_port(pod),
            uid=pod.get("metadata", {}).get("uid"),
            node=pod.get("spec", {}).get("nodeName"),
        )

    async def _move_active_label(self, active: str) -> None:
        pods = await self._api.list_cluster_pods(self._namespace, self._cluster)
        labelled = {
            pod["metadata"]["name"]: (pod["metadata"].get("labels") or {}).get(names.LABEL_ROLE)
            for pod in pods
        }
        # Demote before promoting: for a moment no pod is labelled, never two.
        for pod, role in labelled.items():
            if pod != active and role != names.ROLE_STANDBY:
                await self._api.set_pod_role(self._namespace, pod, names.ROLE_STANDBY)
        if active in labelled and labelled[active] != names.ROLE_ACTIVE:
            await self._api.set_pod_role(self._namespace, active, names.ROLE_ACTIVE)

    async def record_status(self, status: ClusterStatus) -> None:
        # Not over a newer engine's status: on condition of the stored epoch (status_fence.py).
        fields = status.to_status_patch()
        # Its own latest grant counts: the status of the step that allocated still carries the
        # epoch before it, and was refused as "a newer engine's" (CI, 2026-11-28).
        epoch = max(status.epoch, self._granted)
        await record_status_under_epoch(
            self._api, self._namespace, self._cluster, fields, epoch, known=self._body
        )

    async def record_event(self, reason: str, message: str, warning: bool) -> None:
        metadata = self._body["metadata"]
        involved = {
            "apiVersion": names.API_VERSION,
            "kind": names.KIND,
            "name": self._cluster,
            "namespace": self._namespace,
            "uid": str(metadata.get("uid", "")),
        }
        await self._api.create_event(involved, reason, message, warning, instance=socket.gethostname())

    def pod_facts(self) -> Mapping[str, PodFacts]:
        if not self._manages_pods:
            return {}
        return facts_for(self._observations.pods, self._broker_names, self._observations.draining_nodes)
