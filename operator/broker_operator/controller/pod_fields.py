"""The broker pod's fields beyond the broker's configuration: image, pull secrets, ServiceAccount,
priority class, labels and annotations, and the container's default requests (issue 42).

Two sources meet here. The operator's settings give every BrokerCluster of the install its broker
image (``--broker-image``, for a spec without ``image``) and the Secrets to pull it with
(``--broker-image-pull-secrets``), so that the chart can point every cluster at the user's
registry; ``PodDefaults`` carries them into the pure builders. The spec gives the rest
(``pod_spec.py``).

What reaches the pod template's hash (``builders.template_hash``), and so replaces pods when it
changes: the resolved image, and every knob the spec sets; not the operator's pull secrets (a
running pod never pulls again; pods made from then on get the new list) and not the default
requests (an operator upgrade that added them must not replace every broker pod: a switchover per
cluster for a scheduling hint; a pod gets them when it is next made). A spec without the new
knobs hashes as it did before, so an upgrade of the operator alone replaces no pod.

Pure: nothing here reads settings, the environment or the API.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from broker_operator.controller.spec import FORMER_DEFAULT_IMAGE, ClusterSpec

Manifest = dict[str, Any]

# The operator's --broker-image default: the CRD's former spec.image default, unchanged, so that an
# upgrade alone changes no pod's image (and no template hash).
DEFAULT_BROKER_IMAGE: Final = FORMER_DEFAULT_IMAGE
# Without requests a broker is BestEffort: the first to be starved of CPU on a busy node, where it
# misses heartbeats and probes and is failed over for nothing, and the first evicted under memory
# pressure. 100m and 128Mi are examples/brokercluster-pods.yaml's: a broker's peak RSS under
# make bench-broker's load is about 55 MB (docs/benchmarks.md). No limit: a CPU limit throttles a
# broker into missed heartbeats, and a memory limit is the user's to size to their journal.
DEFAULT_REQUESTS: Final[Mapping[str, str]] = {"cpu": "100m", "memory": "128Mi"}


@dataclass(frozen=True)
class PodDefaults:
    """What the operator's settings give every broker pod (``ControllerSettings.pod_defaults``)."""

    image: str = DEFAULT_BROKER_IMAGE
    image_pull_secrets: tuple[str, ...] = ()


BUILT_IN_DEFAULTS: Final = PodDefaults()  # an operator started without --broker-image and pull secrets


def broker_image(spec: ClusterSpec, defaults: PodDefaults) -> str:
    """The image the broker pods run: ``spec.image``, else the operator's."""
    return spec.image or defaults.image


def container_resources(spec: ClusterSpec) -> Manifest:
    """``spec.resources`` as written when it sets requests or limits (``requests: {}`` is an explicit
    BestEffort), else the default requests."""
    given = dict(spec.resources)
    if "requests" in given or "limits" in given:
        return given
    return {"requests": dict(DEFAULT_REQUESTS)}


def image_pull_secrets(spec: ClusterSpec, defaults: PodDefaults) -> list[Manifest]:
    """The operator's pull secrets, then the cluster's own, each once (the kubelet tries them in turn)."""
    ordered = dict.fromkeys((*defaults.image_pull_secrets, *spec.pod.image_pull_secrets))
    return [{"name": name} for name in ordered]


def given_pod_fields(spec: ClusterSpec) -> Manifest:
    """The pod fields the spec sets itself (for the pod, and for the template hash: only when set, so
    a spec without them hashes as before)."""
    given: Manifest = {}
    if spec.pod.service_account_name is not None:
        given["serviceAccountName"] = spec.pod.service_account_name
    if spec.pod.image_pull_secrets:
        given["imagePullSecrets"] = [{"name": name} for name in spec.pod.image_pull_secrets]
    if spec.pod.labels:
        given["labels"] = dict(spec.pod.labels)
    if spec.pod.annotations:
        given["annotations"] = dict(spec.pod.annotations)
    return given


def pod_identity(spec: ClusterSpec, defaults: PodDefaults) -> Manifest:
    """The pod spec's ServiceAccount and pull secrets. The ServiceAccount's token is never mounted
    (``automountServiceAccountToken: false`` in the pod): the broker does not call the Kubernetes API,
    and a token would only be a credential for whoever took the pod over. Workload identity webhooks
    (IRSA, GKE, Azure) project tokens of their own, which is what ``serviceAccountName`` is for."""
    identity: Manifest = {}
    if spec.pod.service_account_name is not None:
        identity["serviceAccountName"] = spec.pod.service_account_name
    secrets = image_pull_secrets(spec, defaults)
    if secrets:
        identity["imagePullSecrets"] = secrets
    return identity


def pod_labels(spec: ClusterSpec, own: Mapping[str, str]) -> dict[str, str]:
    """The spec's labels under the operator's ``own``, which win (the parser refuses the reserved keys
    anyway, so nothing is overridden in practice)."""
    return {**spec.pod.labels, **own}


def pod_annotations(spec: ClusterSpec, own: Mapping[str, str]) -> dict[str, str]:
    return {**spec.pod.annotations, **own}
