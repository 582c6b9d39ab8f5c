"""Every default image name of ours names a registry, and that registry is this machine's (issue 39).

A name without a registry (``broker-failover/broker:0.1.0``) means Docker Hub, under an owner nobody
here controls: a node without the image would pull whatever that owner publishes, and ``skaffold run``
without a default repo would push there. ``localhost/broker-failover/...`` resolves to nothing
public: a cluster runs these images only after they were imported (``make images``, the local
cluster) or pushed to a registry the user names (charts/README.md, "Images").
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from broker_operator.controller.settings import parse_settings
from broker_operator.controller.spec import FORMER_DEFAULT_IMAGE
from local_cluster import containerd_sandbox, relay
from local_cluster.image_build import IMAGES, TAG

ROOT = Path(__file__).resolve().parents[2]
OURS = "localhost/broker-failover/"
BUILT = {spec.reference for spec in IMAGES}


def registry_of(reference: str) -> str | None:
    """The registry host a reference names explicitly, as containerd and Docker parse it."""
    first, _, rest = reference.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first
    return None  # no registry: Docker Hub


def defaults() -> dict[str, str]:
    """Where a default image reference of ours is written, and the reference."""
    found = {
        "the operator's --broker-image default": parse_settings([], {}).broker_image,
        "spec.image's former CRD default, read as unset": FORMER_DEFAULT_IMAGE,
        "the pod sandbox image": containerd_sandbox.SANDBOX_IMAGE,
        "the relay's cloud simulator": relay.CLOUD_IMAGE,
        "the relay's backend simulator": relay.BACKEND_IMAGE,
    }
    values = yaml.safe_load((ROOT / "charts/broker-failover/values.yaml").read_text())
    # The chart's repositories sit under image.registry (charts/README.md, "Images").
    registry = values["image"]["registry"]
    for where, image in (
        ("operator.image", values["operator"]["image"]),
        ("operator.defaultBrokerImage", values["operator"]["defaultBrokerImage"]),
        ("validator.image", values["validator"]["image"]),
    ):
        found[f"the chart's {where}"] = f"{registry}/{image['repository']}:{TAG}"
    for artifact in yaml.safe_load((ROOT / "skaffold.yaml").read_text())["build"]["artifacts"]:
        found[f"skaffold's artifact {artifact['image']}"] = f"{artifact['image']}:{TAG}"
    for path in [
        *sorted((ROOT / "examples").glob("*.yaml")),
        *sorted((ROOT / "local_cluster").rglob("*.yaml")),
    ]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            match = re.match(r"\s*(?:-\s*)?image:\s*([^\s#]+)", line)
            if match and "broker-failover/" in match.group(1):
                found[f"{path.relative_to(ROOT)}:{number}"] = match.group(1).strip("\"'")
    return found


def test_every_image_make_images_builds_is_named_under_localhost() -> None:
    assert all(reference.startswith(OURS) for reference in BUILT), sorted(BUILT)


def test_no_default_image_of_ours_resolves_to_a_public_registry() -> None:
    found = defaults()
    assert len(found) >= 12, found  # the CRD, the operator, the chart, skaffold, examples, the local cluster
    public = {where: ref for where, ref in found.items() if registry_of(ref) != "localhost"}
    assert not public, f"these resolve to a public registry: {public}"


def test_every_default_names_an_image_make_images_builds() -> None:
    unknown = {where: ref for where, ref in defaults().items() if ref not in BUILT}
    assert not unknown, f"no `make images` image has these names: {unknown}"


def test_skaffold_fills_the_charts_values_from_its_own_artifacts() -> None:
    skaffold = yaml.safe_load((ROOT / "skaffold.yaml").read_text())
    artifacts = {a["image"] for a in skaffold["build"]["artifacts"]}
    # skaffold names each artifact's template values after it, "/" and "-" made "_".
    keys = {re.sub(r"[/-]", "_", image) for image in artifacts}
    templates = skaffold["deploy"]["helm"]["releases"][0]["setValueTemplates"]
    used = {m for value in templates.values() for m in re.findall(r"IMAGE_(?:REPO|TAG|DIGEST)_(\w+)", value)}
    assert used and used <= keys, (used, keys)
