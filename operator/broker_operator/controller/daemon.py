"""The heartbeat daemon of one BrokerCluster: wires the failover engine to Kubernetes and keeps it fed.

One kopf daemon per BrokerCluster (not a thread per cluster: every engine
shares the operator's event loop). It waits until the cluster may run (no
conflict, a valid spec, its token Secret readable), then runs the engine's
``ClusterLoop`` with the Kubernetes shell, and until kopf stops it:

- pushes new targets and settings to the engine when pods get or change IPs
  or the spec changes (``retarget``), and wakes it at once when the active's
  pod dies (``wake``, called by the pod watch), so a kill -9 fails over
  without waiting for heartbeat failures;
- hands the engine the pause annotation within a poll of its change (``pause.py``), and while
  paused keeps the spec the engine runs with: a spec edited during a pause takes effect when it ends;
- stops the engine if an older BrokerCluster takes the pair (``Conflict``);
- reads the token Secret again every ``token_recheck_seconds`` (less often with many clusters:
  ``token_reads_per_second`` over all of them) and hands a new value to the
  heartbeat client (which also re-reads it when a broker refuses every token it knows), so a
  rotated token is used without a restart; only a Secret that opts in as a credential is read
  for its value (credentials.py). The same read writes the brokers' verifiers when a token
  changed (``verifiers.sync_verifiers``), which is how the brokers learn it. Not a Secret watch:
  that would stream every Secret of the namespace through the operator, and RBAC cannot narrow
  list/watch to the opt-in label;
- once the engine has stopped, drops the cluster's metric series
  (``metrics.forget_cluster``): the BrokerCluster was deleted, or this process no longer drives
  it (a peer took over), and a phase it went on exporting would contradict the process that
  does. Here rather than in the delete handler: kopf runs that handler while the daemon is still
  stopping, and a loop that steps once more would create the series again.

On stop it cancels the engine, which leaves brokers as they are: a restarted
operator picks up from ``status`` (``ClusterStatus.from_status``) and the
brokers' leases cover the gap. The decisions themselves are the engine's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import kopf

from broker_contracts.redact import redact_url
from broker_operator import metrics
from broker_operator.controller import credentials, verifiers
from broker_operator.controller.conflicts import PairClaim
from broker_operator.controller.context import ControllerContext
from broker_operator.controller.endpoint_hosts import endpoint_refusals
from broker_operator.controller.heartbeat_tls import HeartbeatTls, material_required
from broker_operator.controller.observed import expected_brokers, pod_ready, targets_for
from broker_operator.controller.pause import EngineSpec, cluster_paused
from broker_operator.controller.reconcile import ClusterRef, conflict_owner
from broker_operator.controller.shell import KubernetesClusterShell
from broker_operator.controller.spec import ClusterSpec, SpecError, parse_spec
from broker_operator.core.model import HeartbeatSettings, SettingsError
from broker_operator.core.status import ClusterStatus
from broker_operator.engine import ClusterLoop
from broker_operator.heartbeat_client import HeartbeatClient

Logger = logging.Logger | logging.LoggerAdapter[logging.Logger]
logger = logging.getLogger(__name__)


def may_start(
    *,
    expected: Mapping[str, int],
    addressed: set[str],
    ready: set[str],
    recorded_active: str | None,
    waited: float,
    grace: float,
) -> bool:
    """Whether the engine may start with the brokers that have an address now.

    The engine's first move activates the best broker that answers, so starting it before the
    highest-priority broker is up (pod Ready: its /readyz answers) would make a lower one active
    for no reason, and keep it so with ``failback: Manual``; starting it with no broker at all
    gives up the first walk. So: every broker is ready; or the recorded active has an address (an
    operator restart must renew its lease before it fences itself); or some broker has an address
    and ``grace`` has passed (a pod that never starts must not keep the whole cluster down).
    """
    if not addressed:
        return False
    return ready >= set(expected) or recorded_active in addressed or waited >= grace


async def _ready_to_run(
    *,
    context: ControllerContext,
    ref_of: Callable[[], ClusterRef],
    spec: Mapping[str, Any],
    claims: Callable[[], Iterable[PairClaim]],
    stopped: Any,
    logger: Logger,
) -> tuple[ClusterSpec, HeartbeatSettings, str, HeartbeatTls] | None:
    """Wait until the cluster may run; None if kopf stopped the daemon first."""
    began = time.monotonic()
    tls = HeartbeatTls(context, ref_of().namespace, ref_of().name)
    while not stopped:
        ref = ref_of()
        waiting_for: str
        if conflict_owner(ref, claims()) is not None:
            waiting_for = "its pair to be free (phase Conflict)"
        else:
            try:
                parsed = parse_spec(ref.name, spec)
                settings = HeartbeatSettings.from_spec(spec)
            except (SpecError, SettingsError) as error:
                waiting_for = f"a valid spec ({error})"
            else:
                outside = endpoint_refusals(
                    ((e.name, e.url) for e in parsed.endpoints), context.settings.endpoint_hosts
                )
                token_ref = parsed.token_ref(ref.name)
                # Only a Secret that opts in is sent anywhere (credentials.py); reconcile reports a
                # refusal as the CredentialsAllowed condition and an event.
                token, refused = await credentials.read_operator_token(
                    context.engine_api,
                    ref.namespace,
                    ref.name,
                    str(ref.body["metadata"].get("uid") or ""),
                    parsed,
                )
                observations = context.observations_for(ref.namespace, ref.name)
                addressed = {target.name for target in targets_for(parsed, observations.pods)}
                # Endpoints have no pod to be Ready; an address is all the operator can know.
                ready = (
                    addressed
                    if parsed.endpoints_mode
                    else {name for name, pod in observations.pods.items() if pod_ready(pod)} & addressed
                )
                if outside:
                    waiting_for = f"endpoints it may reach: {'; '.join(outside)}"
                elif refused is not None:
                    waiting_for = f"a credential it may use: {refused.message}"
                elif (
                    problem := verifiers.token_problem(ref.namespace, token_ref, "operator's", token)
                ) or not token:
                    waiting_for = f"a usable token: {problem}"
                elif (await tls.read(parsed) is None or tls.client() is None) and material_required(
                    context, parsed
                ):
                    waiting_for = f"the operator's client certificate ({tls.problem})"
                elif may_start(
                    expected=expected_brokers(ref.name, parsed),
                    addressed=addressed,
                    ready=ready,
                    recorded_active=ref.status.get("active"),
                    waited=time.monotonic() - began,
                    grace=context.settings.startup_grace_seconds,
                ):
                    return parsed, settings, token, tls
                else:
                    waiting_for = f"every broker pod Ready (ready: {', '.join(sorted(ready)) or 'none'})"
        logger.info("heartbeats wait for %s", waiting_for)
        await stopped.wait(context.settings.daemon_poll_seconds)
    return None


async def read_token(
    context: ControllerContext, ref: ClusterRef, spec: Mapping[str, Any], parsed: ClusterSpec
) -> str | None:
    """The operator token now in the cluster's Secret (the one the spec names now, if it is valid),
    None if it cannot be used; and the brokers' verifiers brought in line with both tokens, which
    is how a rotated token reaches the brokers (verifiers.py). A token that cannot be used, or a
    Secret that does not opt in as a credential (credentials.py), is reported (a Warning event,
    once per problem) and the current one kept."""
    try:
        current = parse_spec(ref.name, spec)
    except SpecError:
        current = parsed
    synced = await verifiers.sync_verifiers(context.engine_api, ref.namespace, ref.body, current)
    if synced.written:
        logger.info("%s/%s: the brokers' verifiers follow the tokens now", ref.namespace, ref.name)
    if synced.problem is not None:
        observations = context.observations_for(ref.namespace, ref.name)
        if observations.first_report("InvalidToken", synced.problem):
            kopf.warn(ref.kopf_body, reason="InvalidToken", message=synced.problem)
        logger.warning("%s/%s: %s", ref.namespace, ref.name, synced.problem)
    return synced.operator_token


async def run_cluster_heartbeats(
    *,
    context: ControllerContext,
    ref_of: Callable[[], ClusterRef],
    spec: Mapping[str, Any],
    claims: Callable[[], Iterable[PairClaim]],
    stopped: Any,
    logger: Logger,
) -> None:
    """Run the engine for one cluster until kopf stops the daemon; restart it after a conflict clears.

    ``spec`` is kopf's live view of the BrokerCluster's spec; ``ref_of`` and
    ``claims`` are read again on every check for the same reason.
    """
    metrics.CLUSTERS_DRIVEN.inc()
    try:
        # Not again once the process exits: an engine that ended because another saw the exit first.
        while not stopped and context.exit_seen_at is None:
            ready = await _ready_to_run(
                context=context, ref_of=ref_of, spec=spec, claims=claims, stopped=stopped, logger=logger
            )
            if ready is None:
                return
            parsed, settings, token, tls = ready
            ref = ref_of()
            await _run_engine(
                context=context,
                ref_of=ref_of,
                spec=spec,
                claims=claims,
                stopped=stopped,
                logger=logger,
                parsed=parsed,
                settings=settings,
                token=token,
                tls=tls,
            )
            logger.info("heartbeats for %s/%s stopped", ref.namespace, ref.name)
    finally:
        metrics.CLUSTERS_DRIVEN.dec()
        # The engine is stopped by now (_run_engine awaits it), so nothing sets the series again;
        # a daemon kopf starts again (after an error, or when this process handles the cluster
        # again) makes them anew, its counters from 0, which Prometheus reads as a reset.
        ref = ref_of()
        metrics.forget_cluster(metrics.ClusterKey(ref.namespace, ref.name))


def _current_spec(name: str, spec: Mapping[str, Any], parsed: ClusterSpec) -> ClusterSpec:
    """The spec as it is now (kopf's live view), or the one the engine started with if it is invalid."""
    try:
        return parse_spec(name, spec)
    except SpecError:
        return parsed


async def _hand_over_if_exiting(context: ControllerContext, loop: ClusterLoop, stopped: Any) -> None:
    """An upgrade, a drain of this pod's node: the successor must find the active still in its
    lease however long it takes to start (core/handover.py). The first daemon to see the exit
    hands every engine's active over; the others wait for theirs."""
    if operator_exiting(stopped) or context.exit_seen_at is not None:
        await context.hand_over_all()
        await loop.hand_over(context.handover_deadline())
    context.running_loops.discard(loop)


def operator_exiting(stopped: Any) -> bool:
    """Whether kopf stopped the daemon because the operator process exits (SIGTERM), not because
    it pauses for a peer (which may already be handling: no handover then), nor a deletion."""
    reason = getattr(stopped, "reason", None)
    return reason is not None and bool(reason & kopf.DaemonStoppingReason.OPERATOR_EXITING)


async def _run_engine(
    *,
    context: ControllerContext,
    ref_of: Callable[[], ClusterRef],
    spec: Mapping[str, Any],
    claims: Callable[[], Iterable[PairClaim]],
    stopped: Any,
    logger: Logger,
    parsed: ClusterSpec,
    settings: HeartbeatSettings,
    token: str,
    tls: HeartbeatTls,
) -> None:
    ref = ref_of()
    observations = context.observations_for(ref.namespace, ref.name)
    paused = cluster_paused(ref.body)
    shell = KubernetesClusterShell(
        context.engine_api,
        ref.body,
        observations,
        expected_brokers(ref.name, parsed),
        manages_pods=not parsed.endpoints_mode,
    )
    heartbeats = HeartbeatClient(
        token=token,
        operator_id=context.settings.operator_id,
        timeout=settings.timeout_seconds,
        refresh=lambda: read_token(context, ref_of(), spec, parsed),
        tls=tls.client(),
    )
    loop = ClusterLoop(
        cluster=ref.name,
        targets=targets_for(parsed, observations.pods),
        settings=settings,
        shell=shell,
        heartbeats=heartbeats,
        initial=ClusterStatus.from_status(dict(ref.status)),
        preferred_active=observations.switchover_target or parsed.preferred_active,
        # Pods mode: each target is a pod's own address, so a refused connection is the pod's
        # (broker_watch); endpoints may sit behind a proxy whose refusal would say nothing.
        watch=not parsed.endpoints_mode,
        status_grace_seconds=context.settings.status_grace_seconds,
        # Once one engine saw the operator exit, none acts again: with many clusters kopf stops
        # the daemons one by one, seconds apart on a busy loop (core/handover.py).
        halted=lambda: context.exit_seen_at is not None,
        namespace=ref.namespace,
        paused=paused,
    )
    # The spec the engine runs with, and its pause: while paused, spec edits wait (pause.py).
    taken = EngineSpec(parsed, settings, paused)

    def retarget() -> None:
        """Pods, spec or pause changed: hand the engine the current targets, settings, preference
        and pause."""
        current = ref_of()
        taken.follow(current.body, spec, context.settings.endpoint_hosts, logger)
        fresh = taken.spec
        shell.set_broker_names(expected_brokers(current.name, fresh))
        targets = targets_for(fresh, observations.pods)
        preferred = observations.switchover_target or fresh.preferred_active
        logger.info(
            "heartbeat targets: %s; preferred active: %s",
            ", ".join(f"{t.name}={redact_url(t.url)}" for t in targets) or "none yet",
            preferred or "by priority",
        )
        loop.update(targets, taken.settings, preferred, paused=taken.paused)

    observations.wake, observations.retarget, observations.repoint = loop.wake, retarget, loop.repoint
    # What the heartbeats learn of TLS, for the certificates controller to report (status.tls.served[]).
    # And what a CA key replacement waits on (certificates.py, pki.replacement): the bundle each
    # broker trusts, the client certificate the heartbeats present.
    (
        observations.served_serials,
        observations.tls_problems,
        observations.loaded_bundles,
        observations.presented_certificate,
    ) = (
        heartbeats.served_serials,
        heartbeats.tls_problems,
        heartbeats.loaded_bundles,
        heartbeats.presented_certificate,
    )
    engine = asyncio.create_task(loop.run(), name=f"heartbeats {ref.namespace}/{ref.name}")
    context.running_loops.add(loop)
    # One waiter for the whole run, not kopf's stopped.wait(timeout) per check: that makes a task,
    # a timeout and a cancellation each second, ~4x the CPU of asyncio.wait, and at 2,000
    # clusters the checks alone took a tenth of a core.
    stop = asyncio.ensure_future(stopped.wait())
    context.running_engines += 1
    token_due = time.monotonic() + context.settings.token_recheck_for(context.running_engines)
    try:
        while not stopped and not engine.done():
            await asyncio.wait((engine, stop), timeout=context.settings.daemon_poll_seconds)
            if time.monotonic() >= token_due:
                # A rotated Secret reaches the heartbeats here (see heartbeat_client for the order).
                token_due = time.monotonic() + context.settings.token_recheck_for(context.running_engines)
                await heartbeats.refresh_token()
            # A renewed certificate or a changed CA bundle: after the controller's next look.
            await tls.follow(lambda: _current_spec(ref_of().name, spec, parsed), heartbeats)
            if cluster_paused(ref_of().body) != taken.paused:
                retarget()  # within a poll of the annotation's change
            if conflict_owner(ref_of(), claims()) is not None:
                logger.warning("an older BrokerCluster took the pair: stopping heartbeats")
                break
        if engine.done() and not engine.cancelled() and engine.exception() is not None:
            # Let kopf log it and restart the daemon after its backoff, with a fresh engine.
            raise engine.exception()  # type: ignore[misc]
    finally:
        context.running_engines -= 1
        stop.cancel()
        observations.wake = observations.retarget = observations.repoint = None
        observations.served_serials = observations.tls_problems = observations.loaded_bundles = (
            observations.presented_certificate
        ) = None
        engine.cancel()
        await asyncio.gather(engine, stop, return_exceptions=True)
        await _hand_over_if_exiting(context, loop, stopped)
        await heartbeats.close()
