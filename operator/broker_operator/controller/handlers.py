"""The kopf handlers of the BrokerCluster controller, registered into a given registry.

Thin on purpose: each handler unpacks what kopf hands it and calls the module
that does the work (``reconcile``, ``daemon``, ``observed``). Registration is a
function rather than import-time decorators so that the operator and the tests
each build their own registry, and the tests can add a login to their mock
API server without touching the process-wide default registry.

Handlers:
- ``pair_claims`` (index): which BrokerClusters claim which (account, company);
- create / update / resume / timer: ``reconcile_cluster``;
- update of ``spec``: also hand the running engine its new settings;
- daemon: ``run_cluster_heartbeats``, one per BrokerCluster;
- pod events: record the pod, wake the engine when the active's pod dies;
- node events: the nodes being drained (the active moves off first), and the zones a new broker
  pod is spread over (``placement.NodeZones``, listed once at start);
- journal claim events: record the claim for the retention policy (``claims``);
- deletions of Services and PVCs: forget that they were ensured, so the next
  periodic reconcile creates them again; a deletion of the ``-active`` Service's
  EndpointSlice makes the engine write it again at once. Secrets are not watched (that would
  stream every Secret of the cluster through the operator); the token Secret is
  re-ensured whenever a pod is created, the only time it is needed.

Progress and the last-handled spec are kept in annotations, not in status,
so that the status schema stays exactly the design's. Every handler that
touches a running engine is ``async``: kopf runs sync handlers in threads, and
the engine's wake-up event belongs to the event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Iterable, Mapping
from typing import Any, cast

import kopf
from kubernetes.client.exceptions import ApiException

from broker_operator import metrics
from broker_operator.controller import names
from broker_operator.controller.bodies import ClaimBody, PodBody
from broker_operator.controller.conflicts import PairClaim, pair_key
from broker_operator.controller.context import context_from
from broker_operator.controller.crd_check import check_crd_at_start
from broker_operator.controller.daemon import run_cluster_heartbeats
from broker_operator.controller.observed import node_draining
from broker_operator.controller.peering import join_peering, own_identity
from broker_operator.controller.placement import ZONE_TOPOLOGY
from broker_operator.controller.reconcile import ClusterRef, pair_of, reconcile_cluster
from broker_operator.controller.settings import ControllerSettings, peering_priority_from

RESOURCE = (names.GROUP, names.VERSION, names.PLURAL)


def configure_kopf(settings: kopf.OperatorSettings, peering: ControllerSettings | None = None) -> None:
    """kopf settings every instance of this operator runs with (tests included); with ``peering``,
    also this replica's peering priority and lifetime (``configure_peering``)."""
    if peering is not None:
        configure_peering(settings, peering)
        if peering.shard is not None:
            # kopf removes its finalizer from objects none of its handlers wants: with one name for
            # every shard, each shard would remove the others' (a patch fight on every cluster).
            settings.persistence.finalizer = peering.shard.finalizer
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=names.KOPF_ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=names.KOPF_ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.posting.level = logging.INFO
    settings.posting.reporting_component = names.EVENT_COMPONENT  # the engine's events say the same


def configure_peering(settings: kopf.OperatorSettings, controller: ControllerSettings) -> None:
    """This replica's kopf peering priority and record lifetime; nothing when standalone.

    ``kopf.run(peering_name=...)`` has already made peering mandatory (no peering object: no
    handling at all). Each replica needs its own priority, since kopf pauses every peer that
    shares one; the default is ``peering_priority_from()`` (older start = higher), so the replica
    handling the clusters keeps them while another one starts. Peering only decides who handles;
    the conditional epoch write (epochs.py) is what keeps two handlers from granting one epoch.
    """
    if controller.peering is None:
        return
    settings.peering.priority = (
        controller.peering_priority if controller.peering_priority is not None else peering_priority_from()
    )
    settings.peering.lifetime = controller.peering_lifetime_seconds
    logging.getLogger(__name__).info(
        "peering %r: priority %d, lifetime %d s",
        controller.peering,
        settings.peering.priority,
        settings.peering.lifetime,
    )


def _claims(
    index: kopf.Index[Any, Any] | None, namespace: str, spec: Mapping[str, Any]
) -> Iterable[PairClaim]:
    if index is None:
        raise RuntimeError("kopf did not pass the pair_claims index; is the index handler registered?")
    account, company = pair_of(spec)
    store = cast(Mapping[Any, Iterable[PairClaim]], index).get(pair_key(namespace, account, company))
    return list(store or [])


def _ref(body: Mapping[str, Any], status: Mapping[str, Any]) -> ClusterRef:
    meta = body["metadata"]
    return ClusterRef(namespace=meta["namespace"], name=meta["name"], body=body, status=status)


def _register_startup(registry: kopf.OperatorRegistry) -> None:
    """kopf's settings, the installed CRD's revision, then (with peering) this replica's early
    peering record; in this order."""

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
        # Startup handlers run before kopf starts its peering keep-alives and watches.
        configure_kopf(settings, peering=context_from(memo).settings)

    @kopf.on.startup(registry=registry)
    async def check_installed_crd(memo: Any, **_: Any) -> None:
        await check_crd_at_start(context_from(memo))

    @kopf.on.startup(registry=registry)
    async def announce_peer(
        settings: kopf.OperatorSettings, memo: Any, logger: kopf.Logger, **_: Any
    ) -> None:
        # After configure (startup handlers run in order) and before kopf's own peering: see peering.py.
        context = context_from(memo)
        if context.settings.peering is None:
            return
        try:
            joined = await join_peering(
                context.api,
                context.settings.peering,
                context.settings.namespaces,
                priority=settings.peering.priority,
                lifetime_seconds=settings.peering.lifetime,
                identity=own_identity(),
                pinned=context.settings.peering_priority is not None,
            )
        except ApiException as error:  # kopf's own peering still runs without it, by start time
            logger.warning("peering %r: no early announcement: %s", context.settings.peering, error)
            return
        # Below every replica already there: kopf's keep-alives carry this one from now on.
        settings.peering.priority = joined.priority

    @kopf.on.startup(registry=registry)
    async def list_node_zones(memo: Any, logger: kopf.Logger, **_: Any) -> None:
        # Before any BrokerCluster handler runs (startup handlers come first): a pod made before the
        # node watch's first listing was through would see too few zones and miss the zone spread.
        context = context_from(memo)
        try:
            context.node_zones.seed(await context.api.list_nodes(ZONE_TOPOLOGY))
        except ApiException as error:  # the node watch fills it in; until then, hosts only
            logger.warning("cannot list nodes for the zone spread: %s %s", error.status, error.reason)


def _drives_cluster(*, namespace: str | None, name: str, memo: Any, **_: Any) -> bool:
    """A BrokerCluster handler's filter: this process drives the cluster (its shard, sharding.py)."""
    return context_from(memo).settings.drives(namespace or "", name)


def _drives_child_of(*, namespace: str | None, labels: kopf.Labels, memo: Any, **_: Any) -> bool:
    """A child watch's filter: this process drives the cluster the child is labelled with."""
    return context_from(memo).settings.drives(namespace or "", str(labels.get(names.LABEL_CLUSTER, "")))


async def _reconcile_measured(body: kopf.Body, ref: ClusterRef, reconciling: Awaitable[object]) -> None:
    """Run a reconcile, counted by outcome; and first turn what the validator and the certificates
    pass wrote into status into gauges (metrics.record_status). At every reconcile (the timer's every
    ``reconcile_seconds``), since kopf calls no handler for a change of status alone; not once the
    cluster is being deleted, which would make series that nothing drops any more."""
    if not body["metadata"].get("deletionTimestamp"):
        metrics.record_status(metrics.ClusterKey(ref.namespace, ref.name), ref.status)
    try:
        await reconciling
    except Exception:  # kopf logs it and retries; a cancellation is no outcome
        metrics.RECONCILES.labels("error").inc()
        raise
    metrics.RECONCILES.labels("ok").inc()


def register_handlers(registry: kopf.OperatorRegistry, *, reconcile_seconds: float = 10.0) -> None:
    """Register every handler of the controller into ``registry``; children are re-checked every
    ``reconcile_seconds`` even without events (a pod a user deleted comes back within it)."""
    _register_startup(registry)

    @kopf.index(*RESOURCE, id="pair_claims", registry=registry)  # the id is the kwarg name handlers get
    def pair_claims(
        *, namespace: str | None, name: str, spec: kopf.Spec, meta: kopf.Meta, **_: Any
    ) -> dict[tuple[str, str, str], PairClaim]:
        account, company = pair_of(spec)
        claim = PairClaim(str(meta.get("creationTimestamp") or ""), name)
        return {pair_key(namespace or "", account, company): claim}

    async def reconcile(
        *,
        body: kopf.Body,
        spec: kopf.Spec,
        status: kopf.Status,
        memo: Any,
        patch: kopf.Patch,
        logger: kopf.Logger,
        pair_claims: kopf.Index[Any, Any] | None = None,
        **_: Any,
    ) -> None:
        context = context_from(memo)
        ref = _ref(body, status)
        await _reconcile_measured(
            body,
            ref,
            reconcile_cluster(
                context=context,
                ref=ref,
                spec=spec,
                claims=_claims(pair_claims, ref.namespace, spec),
                status_patch=patch.status,
                logger=cast(logging.Logger, logger),
            ),
        )

    kopf.on.create(*RESOURCE, id="reconcile-on-create", when=_drives_cluster, registry=registry)(reconcile)
    kopf.on.resume(*RESOURCE, id="reconcile-on-resume", when=_drives_cluster, registry=registry)(reconcile)
    kopf.on.update(*RESOURCE, id="reconcile-on-update", when=_drives_cluster, registry=registry)(reconcile)

    @kopf.timer(
        *RESOURCE,
        id="reconcile-periodically",
        when=_drives_cluster,
        registry=registry,
        interval=reconcile_seconds,
        # The create or resume handler reconciles at once; a timer firing then too doubled the
        # requests of an operator restart (two 409 creates and two 404 deletes per cluster).
        initial_delay=reconcile_seconds,
    )
    async def reconcile_periodically(**kwargs: Any) -> None:
        await reconcile(**kwargs)

    @kopf.on.update(
        *RESOURCE, id="retarget-on-spec-change", field="spec", when=_drives_cluster, registry=registry
    )
    async def retarget_on_spec_change(*, body: kopf.Body, memo: Any, **_: Any) -> None:
        context = context_from(memo)
        meta = body["metadata"]
        observations = context.observations_for(meta["namespace"], meta["name"])
        if observations.retarget is not None:
            observations.retarget()

    @kopf.on.delete(*RESOURCE, id="forget-cluster", optional=True, when=_drives_cluster, registry=registry)
    async def forget_cluster(*, body: kopf.Body, memo: Any, **_: Any) -> None:
        # optional=True: this handler asks for no finalizer of its own, but the BrokerCluster has
        # kopf's all the same (the heartbeat daemon and the periodic timer require one), so a
        # deletion waits until kopf has stopped the daemon and run this, then kopf removes it
        # (docs/operator.md, "Deleting a BrokerCluster"). Children go by garbage collection (owner
        # references); this only drops what the operator remembers about the cluster, best effort.
        context = context_from(memo)
        meta = body["metadata"]
        context.forget(meta["namespace"], meta["name"])
        # The heartbeat daemon drops the series again once its engine has stopped
        # (daemon.run_cluster_heartbeats); this covers a cluster whose daemon had ended.
        metrics.forget_cluster(metrics.ClusterKey(meta["namespace"], meta["name"]))

    @kopf.daemon(
        *RESOURCE, id="heartbeats", when=_drives_cluster, registry=registry, cancellation_timeout=10.0
    )
    async def heartbeats(
        *,
        body: kopf.Body,
        spec: kopf.Spec,
        status: kopf.Status,
        memo: Any,
        stopped: kopf.DaemonStopped,
        logger: kopf.Logger,
        pair_claims: kopf.Index[Any, Any] | None = None,
        **_: Any,
    ) -> None:
        context = context_from(memo)
        namespace = body["metadata"]["namespace"]
        await run_cluster_heartbeats(
            context=context,
            ref_of=lambda: _ref(body, status),  # body and status are kopf's live views in a daemon
            spec=spec,
            claims=lambda: _claims(pair_claims, namespace, spec),
            stopped=stopped,
            logger=cast(logging.Logger, logger),
        )

    @kopf.on.event(
        "v1",
        "pods",
        labels={names.LABEL_MANAGED_BY: names.MANAGED_BY, names.LABEL_CLUSTER: kopf.PRESENT},
        when=_drives_child_of,
        registry=registry,
    )
    async def observe_broker_pod(
        *,
        event: kopf.RawEvent,
        body: kopf.Body,
        name: str,
        namespace: str | None,
        labels: kopf.Labels,
        memo: Any,
        **_: Any,
    ) -> None:
        context = context_from(memo)
        key = (namespace or "", labels[names.LABEL_CLUSTER])
        pod = None if event.get("type") == "DELETED" else cast(PodBody, dict(body))
        if pod is None and key not in context.observations:
            return  # the pods of a deleted cluster going away: nothing to remember
        observations = context.observations_for(*key)
        targets_changed, death_changed = observations.observe(name, pod)
        if targets_changed and observations.retarget is not None:
            observations.retarget()
        # A dead active must not wait for `failureThreshold` heartbeats: the engine re-evaluates now.
        if death_changed and observations.wake is not None:
            observations.wake()

    @kopf.on.event(
        "v1",
        "persistentvolumeclaims",
        id="observe-journal-claims",
        labels={names.LABEL_MANAGED_BY: names.MANAGED_BY, names.LABEL_CLUSTER: kopf.PRESENT},
        when=_drives_child_of,
        registry=registry,
    )
    async def observe_journal_claim(
        *,
        event: kopf.RawEvent,
        body: kopf.Body,
        name: str,
        namespace: str | None,
        labels: kopf.Labels,
        memo: Any,
        **_: Any,
    ) -> None:
        # Recorded for the retention policy (claims.py); a deleted claim is also forgotten as
        # ensured, so the next reconcile creates it again if its ordinal is still wanted.
        context = context_from(memo)
        key = (namespace or "", labels[names.LABEL_CLUSTER])
        if event.get("type") == "DELETED":
            if key in context.observations:  # else: the cluster is gone, and its claims with it
                context.observations[key].claims.pop(name, None)
                context.observations[key].ensured.discard(f"PersistentVolumeClaim/{name}")
            return
        context.observations_for(*key).claims[name] = cast(ClaimBody, dict(body))

    _register_child_deletion(registry, "Service", "services")
    _register_failover_watches(registry)


def _register_failover_watches(registry: kopf.OperatorRegistry) -> None:
    """The watches that wake an engine between heartbeats: its Service's slice, its pods' nodes."""
    _register_active_slice_watch(registry)
    _register_node_watch(registry)


def _register_node_watch(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.event("v1", "nodes", id="observe-node-drains", registry=registry)
    async def observe_node(*, event: kopf.RawEvent, body: kopf.Body, name: str, memo: Any, **_: Any) -> None:
        # A drain cordons the node before it evicts: the engine of every cluster with a pod there
        # re-evaluates at once, so its active moves off by a planned switchover while the
        # PodDisruptionBudget holds the eviction back.
        context = context_from(memo)
        deleted = event.get("type") == "DELETED"
        context.node_zones.observe(name, None if deleted else body)
        draining = not deleted and node_draining(body)
        if draining == (name in context.draining_nodes):
            return
        if draining:
            context.draining_nodes.add(name)
        else:
            context.draining_nodes.discard(name)
        for observations in context.observations.values():
            if observations.runs_on(name) and observations.wake is not None:
                observations.wake()


def _register_child_deletion(registry: kopf.OperatorRegistry, kind: str, plural: str) -> None:
    """A child deleted by hand comes back: the controller remembers which children it
    ensured (to spare the API server a create per child per reconcile), so a deletion
    must make it forget that one."""

    @kopf.on.event(
        "v1",
        plural,
        id=f"forget-deleted-{plural}",
        labels={names.LABEL_MANAGED_BY: names.MANAGED_BY, names.LABEL_CLUSTER: kopf.PRESENT},
        when=_drives_child_of,
        registry=registry,
    )
    async def forget_deleted_child(
        *, event: kopf.RawEvent, name: str, namespace: str | None, labels: kopf.Labels, memo: Any, **_: Any
    ) -> None:
        if event.get("type") != "DELETED":
            return
        context = context_from(memo)
        key = (namespace or "", labels[names.LABEL_CLUSTER])
        if key in context.observations:  # else: the cluster itself is gone, and its children with it
            context.observations[key].ensured.discard(f"{kind}/{name}")


def _register_active_slice_watch(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.event(
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        id="repoint-changed-active-slices",
        labels={names.LABEL_SLICE_MANAGED_BY: names.SLICE_MANAGER, names.LABEL_CLUSTER: kopf.PRESENT},
        when=_drives_child_of,
        registry=registry,
    )
    async def repoint_changed_slice(
        *, event: kopf.RawEvent, namespace: str | None, labels: kopf.Labels, memo: Any, **_: Any
    ) -> None:
        # The engine remembers where it pointed the Service; without its slice, or with one written
        # by hand, the Service would have no endpoint or a wrong one until the next move of the
        # active. The engine's own writes come back here too: it knows their version, and a write
        # it has not heard back from yet only costs a read that finds nothing to change.
        kind = event.get("type")
        observations = context_from(memo).observations.get((namespace or "", labels[names.LABEL_CLUSTER]))
        if (
            observations is None
            or observations.repoint is None
            or kind not in ("DELETED", "ADDED", "MODIFIED")
        ):
            return  # None: kopf's initial listing; the engine checks the slice when it starts
        version = event["object"].get("metadata", {}).get("resourceVersion")
        if kind == "DELETED" or version != observations.slice_version:
            observations.repoint()
