"""What every kopf handler of the controller shares: settings, the API wrapper, pod observations.

kopf gives each handler a ``memo``; the operator's root memo is shallow-copied
into every object's memo, so one ``ControllerContext`` placed in it at start is
the same object in the pod watch, the reconciler and the heartbeat daemons.
That is how a pod event reaches the heartbeat loop of its cluster without a
global variable.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from broker_operator.controller.claim_sizes import ClassVerdict
from broker_operator.controller.crd_check import InstalledCrd
from broker_operator.controller.kube import KubeApi
from broker_operator.controller.observed import ClusterObservations
from broker_operator.controller.placement import NodeZones
from broker_operator.controller.settings import ControllerSettings
from broker_operator.core.model import HANDOVER_SEND_SECONDS

if TYPE_CHECKING:
    from broker_operator.engine import ClusterLoop

MEMO_KEY = "broker_failover_controller"


@dataclass
class CertificateCheck:
    """The last look at one cluster's certificates (certificates.py): what it found, for the passes
    until the next look, and when that is due."""

    generation: int | None
    due: float  # monotonic: read the Secrets again from then on
    report: Any  # certificate_report.CertificateReport (imported there: no cycle through here)
    holds_pods: bool  # a pod made now would mount a Secret that is not the operator's
    read_from: float = 0.0  # monotonic: when the reads of this check began
    # The replace-ca-key annotations this look answered (ca_replacement.Request): a change reads again.
    request: Any = None
    # status.tls.caReplacement as this look left it (None: none ever asked for; certificates._UNCHANGED:
    # not known, as in modes other than Operator).
    replacement: Any = None


@dataclass
class StorageClassCheck:
    """One StorageClass's answer to "may claims grow?" (claim_growth.py), shared by every cluster
    that uses the class, and when to ask again."""

    verdict: ClassVerdict
    due: float  # monotonic


@dataclass
class ControllerContext:
    settings: ControllerSettings
    api: KubeApi  # the reconciles' calls
    # What failover and renewals wait on (token reads, epochs, status, labels, the -active slice),
    # on threads of its own (KubeApi.lane); None: the same as ``api``.
    engine_api: KubeApi = None  # type: ignore[assignment]  # set in __post_init__
    observations: dict[tuple[str, str], ClusterObservations] = field(default_factory=dict)
    # Nodes being drained (cordoned, or marked for deletion), from the node watch; every cluster's
    # observations hold this same set.
    draining_nodes: set[str] = field(default_factory=set)
    # The zones of the schedulable nodes, from the same watch (and a listing at start): what decides
    # whether a new broker pod is spread over zones (placement.py).
    node_zones: NodeZones = field(default_factory=NodeZones)
    # Clusters whose engine runs now (daemon._run_engine): what the periodic token re-reads are
    # spread over (ControllerSettings.token_recheck_for).
    running_engines: int = 0
    # When the first engine of this process saw the operator exit (monotonic): every handover
    # renewal is sent within HANDOVER_SEND_SECONDS of it (handover_deadline).
    exit_seen_at: float | None = None
    # The engines that run now, for the handover of all of them at the exit (hand_over_all).
    running_loops: set[ClusterLoop] = field(default_factory=set)
    # Each cluster's last certificate check (certificates.py), so that an idle pass reads nothing.
    certificate_checks: dict[tuple[str, str], CertificateCheck] = field(default_factory=dict)
    # One certificate check at a time per cluster: kopf may run the create handler and the timer at
    # once, and two passes making keys in parallel would race each other to the Secrets.
    certificate_locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)
    # StorageClass name -> its last read (claim_growth.py): read again only when due, so a class
    # that does not allow expansion costs one read per few minutes, not one per reconcile.
    storage_classes: dict[str, StorageClassCheck] = field(default_factory=dict)
    # The installed CRD's revision against the one this operator needs (crd_check.py): one read
    # per reconcile period for every cluster.
    crd: InstalledCrd = field(default_factory=InstalledCrd)

    def __post_init__(self) -> None:
        if self.engine_api is None:
            self.engine_api = self.api

    async def hand_over_all(self) -> None:
        """The operator exits: hand every running engine's active over at once, the first time
        only. Waiting for kopf to stop each daemon, the last ones of 50 came after the window and
        their actives got no handover (``make bench-operator-k8s``)."""
        if self.exit_seen_at is not None:
            return
        deadline = self.handover_deadline()
        await asyncio.gather(*(loop.hand_over(deadline) for loop in list(self.running_loops)))

    def handover_deadline(self) -> float:
        """Until when (monotonic) this exiting process may still send handover renewals: one
        window for the whole process, counted from the first engine that saw the exit, so that a
        successor started since then waits out every one of them (core/handover.py)."""
        if self.exit_seen_at is None:
            self.exit_seen_at = time.monotonic()
        return self.exit_seen_at + HANDOVER_SEND_SECONDS

    def forget(self, namespace: str, cluster: str) -> None:
        """Drop what is remembered of a deleted cluster."""
        self.observations.pop((namespace, cluster), None)
        self.certificate_checks.pop((namespace, cluster), None)
        self.certificate_locks.pop((namespace, cluster), None)

    def observations_for(self, namespace: str, cluster: str) -> ClusterObservations:
        key = (namespace, cluster)
        if key not in self.observations:
            self.observations[key] = ClusterObservations(draining_nodes=self.draining_nodes)
        return self.observations[key]


def context_from(memo: Mapping[str, Any]) -> ControllerContext:
    """The shared context in a kopf memo; fails loudly if the operator was started without one."""
    context = memo.get(MEMO_KEY)
    if not isinstance(context, ControllerContext):
        raise RuntimeError(
            f"kopf memo lacks {MEMO_KEY!r}: start the operator through broker_operator.__main__ "
            "(or pass memo=kopf.Memo({MEMO_KEY: ControllerContext(...)}) to kopf.operator)"
        )
    return context
