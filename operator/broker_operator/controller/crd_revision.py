"""Which revision of the BrokerCluster CRD is installed, and whether this operator may act under it.

Helm installs what a chart keeps in ``crds/`` once and never upgrades it, and a forgotten
``kubectl apply`` leaves an old schema in place: the API server then prunes every field the old
schema lacks, silently, from specs the users write and from the status the operator writes
(``status.activeEpoch`` pruned costs an epoch per operator restart, docs/failover-engine.md). A
number on the CRD says which schema it is: the annotation ``broker.failover.dev/crd-revision``,
bumped with every change to the schema (a unit test records a digest of the schema per revision,
so a change without a bump fails), and :data:`REQUIRED_CRD_REVISION` is the revision this
operator's code was written against, equal to the file's (the operator reads every field the CRD
declares: tests/unit/controller/test_crd.py).

Pure: what the metadata says, and the words for it. Reading the CRD, the refusal and its
condition are ``crd_check.py``. What it deliberately does not do: compare schemas (the API server
holds the one it serves; a number the file carries is what a person can read in ``kubectl get crd
-o yaml`` too), or refuse a newer CRD (an operator rolled back under a newer CRD reads fields that
are all still there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from broker_operator.controller import names

CRD_NAME: Final = f"{names.PLURAL}.{names.GROUP}"
CRD_FILE: Final = "crds/broker.failover.dev_brokerclusters.yaml"
ANNOTATION_CRD_REVISION: Final = f"{names.GROUP}/crd-revision"
# The revision of crds/broker.failover.dev_brokerclusters.yaml this code reads and writes; equal to
# the file's annotation (tests/unit/controller/test_crd_revision.py).
REQUIRED_CRD_REVISION: Final = 1
# A CRD installed before revisions were marked carries no annotation: the oldest schema there is.
UNMARKED_REVISION: Final = 0

CONDITION_CRD_CURRENT: Final = "CRDCurrent"
REASON_OUTDATED: Final = "CRDOutdated"
REASON_CURRENT: Final = "CRDCurrent"
REASON_UPGRADED: Final = "CRDUpgraded"  # the event when an outdated CRD was upgraded

FIX: Final = (
    f"upgrade it: `helm upgrade` of the operator's release (with crds.create: true, the default), "
    f"or `kubectl apply --server-side --force-conflicts -f {CRD_FILE}` from this operator's version"
)


class CrdRevisionError(ValueError):
    """The revision annotation is there but is not a whole number."""


def installed_revision(metadata: Mapping[str, Any]) -> int:
    """The CRD's revision from its metadata; :data:`UNMARKED_REVISION` without the annotation."""
    raw = (metadata.get("annotations") or {}).get(ANNOTATION_CRD_REVISION)
    if raw is None:
        return UNMARKED_REVISION
    try:
        revision = int(str(raw).strip())
    except ValueError:
        raise CrdRevisionError(
            f"annotation {ANNOTATION_CRD_REVISION} of CRD {CRD_NAME} is {raw!r}, not a whole number"
        ) from None
    if revision < 0:
        raise CrdRevisionError(
            f"annotation {ANNOTATION_CRD_REVISION} of CRD {CRD_NAME} is {revision}, below 0."
        )
    return revision


@dataclass(frozen=True)
class CrdVerdict:
    """What the last read of the CRD says: ``outdated`` refuses changes (``crd_check.crd_refusal``)."""

    outdated: bool
    installed: int | None  # None: not read, not found, or not a number
    message: str


def judge(metadata: Mapping[str, Any] | None, required: int = REQUIRED_CRD_REVISION) -> CrdVerdict:
    """The verdict on the installed CRD's ``metadata`` (None: not found, so nothing to judge)."""
    if metadata is None:
        # The operator is handed BrokerClusters, so the API server serves them; a CRD it cannot
        # list (an API server that serves them otherwise) is no reason to stop.
        return CrdVerdict(False, None, f"CRD {CRD_NAME} not found: its revision is not checked")
    try:
        revision = installed_revision(metadata)
    except CrdRevisionError as error:
        return CrdVerdict(True, None, f"{error}; this operator needs revision {required}: {FIX}")
    if revision >= required:
        return CrdVerdict(
            False, revision, f"CRD {CRD_NAME} is revision {revision}; this operator needs {required}"
        )
    marked = ANNOTATION_CRD_REVISION in (metadata.get("annotations") or {})
    installed = (
        f"revision {revision}"
        if marked
        else f"from before revisions were marked (no {ANNOTATION_CRD_REVISION} annotation)"
    )
    return CrdVerdict(
        True,
        revision,
        (
            f"the installed CRD {CRD_NAME} is {installed}, this operator needs revision {required}: the "
            "API server drops what the old schema lacks from specs and status, so the operator changes "
            "nothing (no pods, Services, claims, rollouts or certificates) until the CRD is upgraded; "
            f"heartbeats and failovers go on. To fix, {FIX}"
        ),
    )
