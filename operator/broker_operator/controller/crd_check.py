"""The operator reads its installed CRD and changes nothing while it is older than it needs.

Three pieces, each small:

- :class:`InstalledCrd`, one per process (``ControllerContext.crd``): the last verdict on the
  CRD (``crd_revision.judge``), read again when it is older than ``max_age`` (the reconcile
  period), once for every cluster at a time: one metadata-only list a period, not one per cluster.
  A read that fails keeps the last verdict; with none yet, nothing is refused (the operator
  cannot tell, and refusing would stop every cluster on one API hiccup).
- :func:`crd_refusal`, the gate the reconcile pass calls first: while the CRD is outdated, the
  condition ``CRDCurrent`` (False, reason ``CRDOutdated``, the fix in its message) and a Warning
  event per BrokerCluster, and the pass stops there: no child created, patched or deleted, no
  rollout, no certificate issued. Once the CRD is upgraded the condition turns True (it stays, as
  the record of when) and the pass goes on.
- :func:`check_crd_at_start`, a kopf startup handler (``handlers.py``): reads the CRD once before
  kopf starts the watches and logs the verdict, so that ``kubectl logs`` of an operator started
  on an old CRD says so in its first lines.

What it deliberately does not stop: the heartbeat daemons. The engine's renewals are what keep
the active's lease; an outdated CRD must never fence a working active. Its failovers stay safe
under an old schema too: they are fenced by ``status.epoch``'s compare-and-swap and the brokers'
epochs, which every revision has; what an old schema prunes (``status.activeEpoch``) costs at
most one epoch at the next restart (docs/failover-engine.md, rule 4).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any, Protocol

import kopf
import urllib3
from kubernetes.client.exceptions import ApiException

from broker_operator.controller.conditions import set_condition
from broker_operator.controller.crd_revision import (
    CONDITION_CRD_CURRENT,
    CRD_NAME,
    REASON_CURRENT,
    REASON_OUTDATED,
    REASON_UPGRADED,
    REQUIRED_CRD_REVISION,
    CrdVerdict,
    judge,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from broker_operator.controller.context import ControllerContext
    from broker_operator.controller.reconcile import ClusterRef

Logger = logging.Logger | logging.LoggerAdapter[logging.Logger]
logger = logging.getLogger(__name__)


class CrdReader(Protocol):
    async def read_crd_metadata(self, name: str) -> Mapping[str, Any] | None: ...


class InstalledCrd:
    """The last verdict on the installed CRD, shared by every reconcile of the process."""

    def __init__(self, required: int = REQUIRED_CRD_REVISION) -> None:
        self.required = required
        self.verdict: CrdVerdict | None = None
        self._read_at: float | None = None  # the event loop's clock: kopf's timers run on it too
        self._lock = asyncio.Lock()
        self._failure: str | None = None

    @property
    def outdated(self) -> bool:
        """Whether the last verdict refuses changes (False while none was reached)."""
        return self.verdict is not None and self.verdict.outdated

    async def current(self, api: CrdReader, max_age: float) -> CrdVerdict | None:
        """The verdict, read again first when the last read is ``max_age`` seconds old or more."""
        if self._fresh(max_age):
            return self.verdict
        async with self._lock:
            # Every cluster's pass comes here within the same second: one read serves them all.
            if not self._fresh(max_age):
                await self.read(api)
        return self.verdict

    def _fresh(self, max_age: float) -> bool:
        return self._read_at is not None and asyncio.get_running_loop().time() - self._read_at < max_age

    async def read(self, api: CrdReader) -> CrdVerdict | None:
        """Read the CRD now; on a failure keep the verdict there was (logged once per failure)."""
        try:
            metadata = await api.read_crd_metadata(CRD_NAME)
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as error:
            self._read_at = asyncio.get_running_loop().time()  # tried: not again before max_age
            failure = f"cannot read CRD {CRD_NAME} to check its revision: {error}"
            if failure != self._failure:
                logger.warning("%s; keeping the last verdict: %s", failure, self.verdict)
            self._failure = failure
            return self.verdict
        # Set once the read is over: passes waiting on the lock meanwhile get this read's verdict.
        self._read_at = asyncio.get_running_loop().time()
        self._failure = None
        verdict = judge(metadata, self.required)
        if verdict != self.verdict:
            logger.log(logging.ERROR if verdict.outdated else logging.INFO, "%s", verdict.message)
        self.verdict = verdict
        return verdict


async def crd_refusal(
    context: ControllerContext, ref: ClusterRef, status_patch: MutableMapping[str, Any], log: Logger
) -> bool:
    """The reconcile pass's gate: True while the installed CRD is older than this operator needs,
    after setting ``CRDCurrent`` False and a Warning event (once per message); the pass then
    changes nothing. False otherwise, with ``CRDCurrent`` turned True if it had been shown."""
    verdict = await context.crd.current(context.api, max_age=context.settings.reconcile_seconds)
    observations = context.observations_for(ref.namespace, ref.name)
    if verdict is not None and verdict.outdated:
        set_condition(
            ref,
            status_patch,
            CONDITION_CRD_CURRENT,
            ok=False,
            reason=REASON_OUTDATED,
            message=verdict.message,
        )
        if observations.first_report(REASON_OUTDATED, verdict.message):
            kopf.warn(ref.kopf_body, reason=REASON_OUTDATED, message=verdict.message)
            log.warning("not reconciling: %s", verdict.message)
        return True
    observations.reported.pop(REASON_OUTDATED, None)
    shown = next(
        (c for c in ref.status.get("conditions") or [] if c.get("type") == CONDITION_CRD_CURRENT), None
    )
    if shown is not None and verdict is not None:
        # Kept once shown, True: when the CRD was upgraded stays readable in `kubectl describe`.
        set_condition(
            ref, status_patch, CONDITION_CRD_CURRENT, ok=True, reason=REASON_CURRENT, message=verdict.message
        )
        upgraded = f"{verdict.message}: reconciling again"
        if shown.get("status") == "False" and observations.first_report(REASON_UPGRADED, upgraded):
            kopf.info(ref.kopf_body, reason=REASON_UPGRADED, message=upgraded)
    return False


async def check_crd_at_start(context: ControllerContext) -> None:
    """The startup read (a kopf startup handler: before any watch or daemon), so that the first
    lines of an operator started on an old CRD say so."""
    verdict = await context.crd.read(context.api)
    if verdict is not None and verdict.outdated:
        # read() logged the verdict itself; this says what the operator does about it.
        logger.error(
            "every BrokerCluster gets the condition %s=False and no change until the CRD is upgraded",
            CONDITION_CRD_CURRENT,
        )
