"""The BrokerCluster's pod knobs (issue 42), read into a frozen ``PodSpec``.

What a managed cluster needs of a pod besides the broker's own settings: the Secrets the kubelet
pulls the image with (``imagePullSecrets``), where the pods may be placed (
``topologySpreadConstraints``), how the scheduler ranks them against other pods
(``priorityClassName``), the labels and annotations other tools key on (``podMetadata``: a cost
centre, a service mesh's opt-out, a log pipeline's parser), and the ServiceAccount that cloud
workload identity (IRSA, GKE and Azure workload identity) binds to (``serviceAccountName``).

The second line behind the CRD's schema and CEL rules, as ``spec.py``, ``tls_spec.py`` and
``active_service_spec.py`` are: the same bounds (``core/spec_fields.py`` for the ones with a
minimum, maximum or enum) and the reserved keys refused in the CRD's words, worded once below.
What is inside a spread constraint beyond its three required fields (``labelSelector``,
``matchLabelKeys``, ``minDomains``, ``nodeAffinityPolicy``, ``nodeTaintsPolicy``) is core/v1's, which
the API server checks, with its own messages, when the operator creates a pod.

What it does not do: decide the default spread (``placement.py``) or build the pod
(``builders.py``, ``pod_fields.py``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from broker_operator.controller import names
from broker_operator.core import spec_fields as fields

PULL_SECRETS_MAX: Final = 16
SPREAD_CONSTRAINTS_MAX: Final = 8
POD_LABELS_MAX: Final = 64
POD_ANNOTATIONS_MAX: Final = 64
NAME_MAX: Final = 253
# A label key: an optional DNS-subdomain prefix (253) and "/", then a name of at most 63.
TOPOLOGY_KEY_MAX: Final = 317
# RFC 1123 subdomains: the names of Secrets, ServiceAccounts and PriorityClasses. The CRD's pattern.
DNS_SUBDOMAIN: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

# Keys a user may not set on the broker pods: the operator's own. Its headless Service, its default
# spread, its NetworkPolicy and its watches select the pods by the first two and the cluster label;
# it moves ``role`` with every activation; it keeps the pod template's hash under its group.
# Refused rather than ignored: a label the pods silently lack is a dashboard that silently lies.
RESERVED_LABELS: Final = (names.LABEL_APP, names.LABEL_MANAGED_BY, names.LABEL_ROLE)
RESERVED_PREFIX: Final = f"{names.GROUP}/"
LABELS_RESERVED_MESSAGE: Final = (
    f"spec.podMetadata.labels may not set {RESERVED_LABELS[0]}, {RESERVED_LABELS[1]}, "
    f"{RESERVED_LABELS[2]} or keys under {RESERVED_PREFIX}: the operator selects its broker pods by "
    "them and moves role with the active"
)
ANNOTATIONS_RESERVED_MESSAGE: Final = (
    f"spec.podMetadata.annotations may not use keys under {RESERVED_PREFIX}: the operator keeps its "
    "own there (the pod template's hash)"
)


@dataclass(frozen=True)
class PodSpec:
    """The pod knobs as written; the defaults are the operator's (None, empty: not set)."""

    image_pull_secrets: tuple[str, ...] = ()
    # None: the operator's default spread (placement.py); given (even empty), it replaces that whole.
    topology_spread_constraints: tuple[Mapping[str, Any], ...] | None = None
    priority_class_name: str | None = None
    service_account_name: str | None = None  # None: the namespace's "default" ServiceAccount
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


def parse_pod(spec: Mapping[str, Any], problems: list[str]) -> PodSpec:
    """The pod knobs of ``spec`` (the whole spec: they are top-level fields), checked as the CRD does."""
    metadata = spec.get("podMetadata") or {}
    if not isinstance(metadata, Mapping):
        problems.append(f"spec.podMetadata must be an object with labels and annotations, got {metadata!r}")
        metadata = {}
    labels = _string_map(metadata.get("labels"), "labels", POD_LABELS_MAX, problems)
    if any(key in RESERVED_LABELS or key.startswith(RESERVED_PREFIX) for key in labels):
        problems.append(LABELS_RESERVED_MESSAGE)
    annotations = _string_map(metadata.get("annotations"), "annotations", POD_ANNOTATIONS_MAX, problems)
    if any(key.startswith(RESERVED_PREFIX) for key in annotations):
        problems.append(ANNOTATIONS_RESERVED_MESSAGE)
    return PodSpec(
        image_pull_secrets=_pull_secrets(spec.get("imagePullSecrets"), problems),
        topology_spread_constraints=_spread_constraints(spec.get("topologySpreadConstraints"), problems),
        priority_class_name=_name(spec.get("priorityClassName"), "spec.priorityClassName", problems),
        service_account_name=_name(spec.get("serviceAccountName"), "spec.serviceAccountName", problems),
        labels=labels,
        annotations=annotations,
    )


def _name(value: object, path: str, problems: list[str]) -> str | None:
    """An object's name (a DNS subdomain), or None when absent."""
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > NAME_MAX or not DNS_SUBDOMAIN.match(value):
        problems.append(
            f"{path} ({value!r}) must be a name of at most {NAME_MAX} characters: lower-case letters, "
            "digits, '-' and '.', starting and ending with a letter or digit"
        )
        return None
    return value


def _pull_secrets(raw: object, problems: list[str]) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Sequence) or isinstance(raw, str) or len(raw) > PULL_SECRETS_MAX:
        limit = PULL_SECRETS_MAX
        problems.append(
            f"spec.imagePullSecrets must be a list of at most {limit} {{name}} objects, got {raw!r}"
        )
        return ()
    found: list[str] = []
    for index, entry in enumerate(raw):
        path = f"spec.imagePullSecrets[{index}]"
        if not isinstance(entry, Mapping) or entry.get("name") is None:
            problems.append(f"{path} must name a Secret: {{name}}, got {entry!r}")
            continue
        name = _name(entry["name"], f"{path}.name", problems)
        if name is not None:
            found.append(name)
    repeated = sorted({name for name in found if found.count(name) > 1})
    if repeated:
        # The CRD's list-map key: the API server answers "Duplicate value".
        problems.append(f"spec.imagePullSecrets names a Secret more than once: {', '.join(repeated)}")
    return tuple(dict.fromkeys(found))


def _spread_constraints(raw: object, problems: list[str]) -> tuple[Mapping[str, Any], ...] | None:
    """``spec.topologySpreadConstraints`` as JSON-ready copies, or None when absent."""
    if raw is None:
        return None
    if not isinstance(raw, Sequence) or isinstance(raw, str) or len(raw) > SPREAD_CONSTRAINTS_MAX:
        problems.append(
            f"spec.topologySpreadConstraints must be a list of at most {SPREAD_CONSTRAINTS_MAX} "
            f"core/v1 TopologySpreadConstraints, got {raw!r}; leave it out for the operator's spread"
        )
        return None
    checked: list[Mapping[str, Any]] = []
    for index, entry in enumerate(raw):
        path = f"spec.topologySpreadConstraints[{index}]"
        if not isinstance(entry, Mapping):
            problems.append(f"{path} must be a TopologySpreadConstraint object, got {entry!r}")
            continue
        # Copied before it is looked into: a field read that is absent must not count as read
        # (tests/unit/controller/test_crd.py records every field the parser touches).
        constraint = plain_copy(entry)
        problems += _constraint_problems(path, constraint)
        checked.append(constraint)
    return tuple(checked)


def _constraint_problems(path: str, constraint: Mapping[str, Any]) -> list[str]:
    found = [
        f"{path}.{required} is required"
        for required in ("maxSkew", "topologyKey", "whenUnsatisfiable")
        if constraint.get(required) is None
    ]
    skew, key = constraint.get("maxSkew"), constraint.get("topologyKey")
    low, high = fields.TOPOLOGY_MAX_SKEW.minimum, fields.TOPOLOGY_MAX_SKEW.maximum
    if skew is not None and (not isinstance(skew, int) or isinstance(skew, bool) or not low <= skew <= high):
        found.append(f"{path}.maxSkew ({skew!r}) must be an integer from {low} to {high}")
    if key is not None and (not isinstance(key, str) or not key or len(key) > TOPOLOGY_KEY_MAX):
        found.append(
            f"{path}.topologyKey ({key!r}) must be a node label key, e.g. topology.kubernetes.io/zone"
        )
    when = constraint.get("whenUnsatisfiable")
    choices = fields.WHEN_UNSATISFIABLE.choices
    if when is not None and when not in choices:
        found.append(f"{path}.whenUnsatisfiable ({when!r}) must be one of {', '.join(choices)}")
    return found


def _string_map(raw: object, field_name: str, limit: int, problems: list[str]) -> dict[str, str]:
    """``spec.podMetadata.<field_name>`` as a plain dict; the API server checks each key and value's
    syntax when the operator creates a pod."""
    if raw is None:
        return {}
    if (
        not isinstance(raw, Mapping)
        or len(raw) > limit
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items())
    ):
        problems.append(
            f"spec.podMetadata.{field_name} must map at most {limit} keys to strings, got {raw!r}"
        )
        return {}
    return {str(k): str(v) for k, v in raw.items()}


def plain_copy(value: Any) -> Any:
    """A JSON-ready copy (plain dicts and lists) of a mapping read from a kopf body (``spec.py``'s too)."""
    if isinstance(value, Mapping):
        return {str(k): plain_copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_copy(v) for v in value]
    return value
