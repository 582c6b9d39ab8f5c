"""The CRD's revision marker: the file, the operator's constant, the digest per revision, the chart's
one copy, and the verdicts the operator reaches on what is installed (controller/crd_revision.py,
controller/crd_check.py).

The digest test is what makes the marker worth having: a change to the schema without a bump of
the annotation fails here, with what to do. Descriptions and printer columns are left out of the
digest (neither changes what the API server prunes or refuses), so rewording one costs no bump.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from broker_operator.controller.crd_check import InstalledCrd
from broker_operator.controller.crd_revision import (
    ANNOTATION_CRD_REVISION,
    CRD_FILE,
    CRD_NAME,
    REQUIRED_CRD_REVISION,
    CrdRevisionError,
    installed_revision,
    judge,
)

ROOT = Path(__file__).resolve().parents[3]
CRD_PATH = ROOT / CRD_FILE
CHART = ROOT / "charts" / "broker-failover"

# sha256 of the schema (schema_digest) per revision. A schema change fails
# test_the_schema_changes_only_with_a_revision_bump until the revision is bumped and recorded here.
SCHEMA_DIGESTS = {
    1: "0ee6a99a5f1d8c96c9e24d7176e43696d10ea353e21651ec8e9606010b08e13a",
}


def crd() -> dict[str, Any]:
    return dict(yaml.safe_load(CRD_PATH.read_text()))


def without_descriptions(node: Any, *, names: bool = False) -> Any:
    """``node`` without its ``description`` texts; ``names``: ``node`` is a ``properties`` map,
    whose keys are field names (a field called ``description`` stays)."""
    if isinstance(node, dict):
        return {
            key: without_descriptions(value, names=key == "properties" and not names)
            for key, value in node.items()
            if names or not (key == "description" and isinstance(value, str))
        }
    if isinstance(node, list):
        return [without_descriptions(item) for item in node]
    return node


def schema_digest(definition: Mapping[str, Any]) -> str:
    """What the API server enforces and prunes by: the CRD's spec, less printer columns and
    descriptions, as canonical JSON."""
    spec = dict(definition["spec"])
    spec["versions"] = [
        {key: value for key, value in version.items() if key != "additionalPrinterColumns"}
        for version in spec["versions"]
    ]
    canonical = json.dumps(without_descriptions(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def test_the_operator_needs_the_revision_the_crd_file_carries() -> None:
    annotations = crd()["metadata"]["annotations"]
    assert annotations[ANNOTATION_CRD_REVISION] == str(REQUIRED_CRD_REVISION)
    # helm leaves the CRD, and so every BrokerCluster, on `helm uninstall`.
    assert annotations["helm.sh/resource-policy"] == "keep"


def test_the_schema_changes_only_with_a_revision_bump() -> None:
    definition = crd()
    revision = int(definition["metadata"]["annotations"][ANNOTATION_CRD_REVISION])
    digest = schema_digest(definition)
    assert SCHEMA_DIGESTS.get(revision) == digest, (
        f"the schema of {CRD_FILE} is not the one recorded for revision {revision} (digest {digest}). "
        f"A schema change needs a new revision: set {ANNOTATION_CRD_REVISION} to {revision + 1} in the "
        f"file and REQUIRED_CRD_REVISION to {revision + 1} in controller/crd_revision.py, and record "
        f"{revision + 1}: {digest!r} in SCHEMA_DIGESTS here (docs/operator.md, 'CRD upgrades')"
    )
    assert sorted(SCHEMA_DIGESTS) == list(range(1, revision + 1)), "one digest per revision, none skipped"


def test_the_digest_ignores_descriptions_and_printer_columns_but_not_fields() -> None:
    definition = crd()
    reworded = json.loads(json.dumps(definition))
    version = reworded["spec"]["versions"][0]
    version["schema"]["openAPIV3Schema"]["properties"]["spec"]["description"] = "reworded"
    version["additionalPrinterColumns"].append({"name": "Paused", "type": "string", "jsonPath": ".x"})
    assert schema_digest(reworded) == schema_digest(definition)
    pruned = json.loads(json.dumps(definition))
    del pruned["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"][
        "activeEpoch"
    ]
    assert schema_digest(pruned) != schema_digest(definition)


def test_the_chart_renders_the_one_file_and_keeps_kopfs_crds_in_crds_folder() -> None:
    linked = CHART / "files" / "crds" / CRD_PATH.name
    assert linked.is_symlink() and linked.resolve() == CRD_PATH.resolve()
    assert not os.path.isabs(os.readlink(linked)), "a relative link: it must resolve in every checkout"
    assert f'.Files.Get "files/crds/{CRD_PATH.name}"' in (CHART / "templates" / "crds.yaml").read_text()
    # helm's crds/ would install it too (once, never upgraded): only kopf's peering CRDs stay there.
    assert sorted(path.name for path in (CHART / "crds").iterdir()) == ["kopf.dev_peerings.yaml"]


@pytest.mark.parametrize(
    ("annotations", "revision"),
    [
        (None, 0),
        ({}, 0),
        ({"other": "9"}, 0),
        ({ANNOTATION_CRD_REVISION: "3"}, 3),
        ({ANNOTATION_CRD_REVISION: " 2 "}, 2),
    ],
)
def test_the_revision_is_the_annotation_and_zero_without_it(
    annotations: dict[str, str] | None, revision: int
) -> None:
    assert installed_revision({"name": CRD_NAME, "annotations": annotations}) == revision


@pytest.mark.parametrize("raw", ["two", "1.5", "", "-1"])
def test_a_revision_that_is_not_a_whole_number_is_named(raw: str) -> None:
    with pytest.raises(CrdRevisionError, match=ANNOTATION_CRD_REVISION):
        installed_revision({"annotations": {ANNOTATION_CRD_REVISION: raw}})


def test_an_older_or_unmarked_crd_is_outdated_and_the_message_gives_the_fix() -> None:
    for metadata, installed in (
        ({"annotations": {ANNOTATION_CRD_REVISION: "1"}}, "is revision 1,"),
        ({"annotations": {ANNOTATION_CRD_REVISION: "0"}}, "is revision 0,"),
        ({}, "from before revisions were marked"),
    ):
        verdict = judge(metadata, required=2)
        assert verdict.outdated
        assert installed in verdict.message and "needs revision 2" in verdict.message
        assert "helm upgrade" in verdict.message
        assert f"kubectl apply --server-side --force-conflicts -f {CRD_FILE}" in verdict.message
        assert "heartbeats and failovers go on" in verdict.message
    garbled = judge({"annotations": {ANNOTATION_CRD_REVISION: "latest"}}, required=2)
    assert garbled.outdated and garbled.installed is None and "'latest'" in garbled.message


def test_the_required_revision_or_a_newer_one_is_current_and_no_crd_is_no_verdict() -> None:
    for installed in (2, 3):
        verdict = judge({"annotations": {ANNOTATION_CRD_REVISION: str(installed)}}, required=2)
        assert not verdict.outdated and verdict.installed == installed
    missing = judge(None, required=2)
    assert not missing.outdated and missing.installed is None


class CrdStandIn:
    """What the API server answers about the CRD: its metadata, or an error to raise."""

    def __init__(self, revision: str | None) -> None:
        self.revision = revision
        self.failure: Exception | None = None
        self.reads = 0

    async def read_crd_metadata(self, name: str) -> Mapping[str, Any] | None:
        assert name == CRD_NAME
        self.reads += 1
        await asyncio.sleep(0.01)  # a round trip: concurrent passes overlap here
        if self.failure is not None:
            raise self.failure
        return (
            None
            if self.revision is None
            else {"name": name, "annotations": {ANNOTATION_CRD_REVISION: self.revision}}
        )


@pytest.mark.looptime
async def test_one_read_per_period_serves_every_pass() -> None:
    api, crd_state = CrdStandIn("0"), InstalledCrd(required=1)
    verdicts = await asyncio.gather(*(crd_state.current(api, max_age=10.0) for _ in range(50)))
    assert api.reads == 1 and all(v is not None and v.outdated for v in verdicts)
    api.revision = "1"
    await asyncio.sleep(5)
    assert (await crd_state.current(api, max_age=10.0)).outdated  # type: ignore[union-attr]
    assert api.reads == 1
    await asyncio.sleep(5)
    verdict = await crd_state.current(api, max_age=10.0)
    assert api.reads == 2 and verdict is not None and not verdict.outdated and not crd_state.outdated


@pytest.mark.looptime
async def test_a_failed_read_keeps_the_last_verdict_and_refuses_nothing_without_one() -> None:
    api, crd_state = CrdStandIn("0"), InstalledCrd(required=1)
    api.failure = ApiException(status=500, reason="etcd leader changed")
    assert await crd_state.current(api, max_age=1.0) is None and not crd_state.outdated
    api.failure = None
    await asyncio.sleep(1)
    await crd_state.current(api, max_age=1.0)
    assert crd_state.outdated
    api.failure = ConnectionRefusedError("API server restarting")
    await asyncio.sleep(1)
    assert (await crd_state.current(api, max_age=1.0)) is crd_state.verdict and crd_state.outdated
