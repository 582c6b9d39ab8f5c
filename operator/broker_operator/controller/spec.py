"""A BrokerCluster's spec, read once into a typed, defaulted, checked ``ClusterSpec``.

The CRD's schema and CEL rules are the first line: the API server refuses an
invalid manifest. This module is the second line, for the cases the API server
does not cover (a CRD installed without its rules, an object written before a
rule existed, a test API server without admission): it applies the same
defaults and the same checks with the same messages, so the operator never
runs a cluster the CRD would have refused. The messages name the field and
the value, like the CEL ``messageExpression``s do.

Every default, range and enum comes from ``core/spec_fields.py``, the Python
transcription of the CRD that ``tests/unit/controller/test_crd.py`` checks
against it; the heartbeat and failback fields are parsed by the engine's own
``HeartbeatSettings.from_spec`` (with the CRD's types and bounds: decimal
seconds for the interval, timeout and lease), so there is one
parser of them, and ``ClusterSpec.heartbeat`` is what it returned. ``spec.tls`` and
``spec.activeService`` have modules of their own (``tls_spec.py``, ``active_service_spec.py``),
in the same form, and so do the pod knobs of issue 42 (``pod_spec.py``: pull secrets, spread
constraints, priority class, pod labels and annotations, ServiceAccount).

``spec.image`` has no default in the CRD: absent, the pods run the operator's ``--broker-image``
(``pod_fields.py``), so that one setting of the chart points every BrokerCluster at the user's
registry. The CRD's former default, which the API server wrote into every BrokerCluster created
before, counts as absent for the same reason (``FORMER_DEFAULT_IMAGE``).

This module reads and checks; it does not talk to Kubernetes and does not
decide anything about failover.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

from broker_operator.controller import names
from broker_operator.controller.active_service_spec import ActiveServiceSpec, parse_active_service
from broker_operator.controller.pod_spec import PodSpec, parse_pod, plain_copy
from broker_operator.controller.secret_refs import SecretRef, read_secret_ref
from broker_operator.controller.tls_spec import TlsSpec, parse_tls
from broker_operator.core import spec_fields as fields
from broker_operator.core.model import HeartbeatSettings, SettingsError

# spec.image's schema default until issue 42: the API server stored it in every BrokerCluster made
# before, so it is read as "not set" (the operator's --broker-image), or those clusters would never
# follow the chart's image. Nobody means this local-only name as a deliberate choice of their own.
FORMER_DEFAULT_IMAGE: Final = "localhost/broker-failover/broker:0.1.0"
IMAGE_MAX: Final = 512
_DNS_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_URL: Final = re.compile(r"^https?://[^\s/]+(/\S*)?$")


class SpecError(ValueError):
    """A BrokerCluster spec the operator refuses to run; ``problems`` lists every finding."""

    def __init__(self, cluster: str, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__(f"BrokerCluster {cluster}: " + "; ".join(self.problems))


@dataclass(frozen=True)
class Endpoint:
    name: str
    url: str
    priority: int


@dataclass(frozen=True)
class Connection:
    """How brokers reach the backend or the cloud: a plain URL or a Secret key holding one, and
    the Secret whose keys they present to it (``credentialsSecretRef``: mounted, never in a URL)."""

    url: str | None
    url_secret: SecretRef | None
    credentials_secret: str | None = None


@dataclass(frozen=True)
class ClaimRetention:
    """``spec.persistentVolumeClaimRetentionPolicy``: what becomes of the journal claims.

    ``when_scaled`` applies to the claims of ordinals at or above ``replicas`` after a scale-down,
    ``when_deleted`` to every claim when the BrokerCluster is deleted; each is Retain or Delete.
    """

    when_scaled: str = fields.WHEN_SCALED.default
    when_deleted: str = fields.WHEN_DELETED.default

    @property
    def delete_when_scaled(self) -> bool:
        return self.when_scaled == "Delete"

    @property
    def delete_when_deleted(self) -> bool:
        return self.when_deleted == "Delete"


# The fields of a NetworkPolicyPeer (networking.k8s.io/v1); the API server checks what is inside
# each when the operator creates the policy, this parser only their shape and combination.
_PEER_SELECTORS: Final = ("podSelector", "namespaceSelector")
_PEER_FIELDS: Final = (*_PEER_SELECTORS, "ipBlock")


@dataclass(frozen=True)
class NetworkPolicySpec:
    """``spec.networkPolicy`` when enabled: who may reach the brokers' main port.

    The admin port (Heartbeat, admin operations) always admits the operator only; that part is not
    the user's to widen. ``send_messages_from`` is None when the field is absent: the main port is
    then open to every source (as a NetworkPolicy rule without ``from``), so turning the policy on
    never cuts off a backend nobody listed; listed peers are the only sources admitted besides the
    operator.
    """

    send_messages_from: tuple[Mapping[str, Any], ...] | None = None
    # Where brokers may connect over TCP (besides DNS): None, every address but the link-local
    # ranges (network_policy.DEFAULT_EGRESS_PEERS); listed peers are the only destinations.
    egress_to: tuple[Mapping[str, Any], ...] | None = None


@dataclass(frozen=True)
class ClusterSpec:
    account: str
    company: str
    replicas: int  # 0 in endpoints mode
    endpoints: tuple[Endpoint, ...]
    image: str | None  # None: the operator's --broker-image (pod_fields.broker_image)
    image_pull_policy: str
    resources: Mapping[str, Any]  # as written; without requests and limits, pod_fields' default requests
    storage_size: str
    storage_class: str | None
    claim_retention: ClaimRetention
    backend: Connection
    cloud: Connection
    token_secret: SecretRef | None  # None: the operator generates <name>-broker-token
    backend_token_secret: SecretRef | None  # None: the operator generates <name>-backend-token
    heartbeat: HeartbeatSettings  # with failback and failbackStableSeconds; parsed by from_spec
    preferred_active: str | None
    max_deliveries: int
    on_poison: str
    message_log_claim: str | None
    message_log_mount: str
    network_policy: NetworkPolicySpec | None = (
        None  # None: no NetworkPolicy (spec.networkPolicy.enabled: false)
    )
    # spec.podSecurityContext and spec.securityContext as written; None: the operator's defaults
    # (builders.DEFAULT_POD_SECURITY_CONTEXT, DEFAULT_CONTAINER_SECURITY_CONTEXT). A given one
    # replaces the default whole, never merged into it, so a field of the default can be left out.
    pod_security_context: Mapping[str, Any] | None = None
    container_security_context: Mapping[str, Any] | None = None
    # Where the pods may run: spec.affinity, spec.nodeSelector and spec.tolerations as written;
    # None: absent. Without spec.affinity the operator spreads one cluster's brokers over nodes
    # (placement.default_affinity); a given one replaces that default whole.
    affinity: Mapping[str, Any] | None = None
    node_selector: Mapping[str, Any] | None = None
    tolerations: tuple[Mapping[str, Any], ...] | None = None
    # Wait: a drain waits for a standby elsewhere before it evicts the active; Evict: it goes on.
    drain_without_standby: str = fields.DRAIN_WITHOUT_STANDBY.default
    # spec.tls (tls_spec.py): the certificates' mode and trust; spec.activeService
    # (active_service_spec.py): the <name>-active Service's shape. Both default as the CRD does.
    tls: TlsSpec = field(default_factory=TlsSpec)
    active_service: ActiveServiceSpec = field(default_factory=ActiveServiceSpec)
    # The pod knobs (pod_spec.py), each as written; their defaults are the operator's.
    pod: PodSpec = field(default_factory=PodSpec)

    @property
    def endpoints_mode(self) -> bool:
        return bool(self.endpoints)

    def token_ref(self, cluster: str) -> SecretRef:
        """The Secret holding the operator's token: the user's, or the one the operator generates."""
        return self.token_secret or SecretRef(
            names.generated_token_secret_name(cluster), names.TOKEN_FILE_KEY
        )

    def backend_token_ref(self, cluster: str) -> SecretRef:
        """The Secret holding the backend's credential for SendMessages: the user's, or generated."""
        return self.backend_token_secret or SecretRef(
            names.generated_backend_token_secret_name(cluster), names.TOKEN_FILE_KEY
        )


def parse_spec(cluster: str, spec: Mapping[str, Any]) -> ClusterSpec:
    """Default and check ``spec`` as the CRD does; raise ``SpecError`` naming every bad field."""
    problems: list[str] = []
    delivery = _mapping(spec, "delivery", problems)
    storage = _mapping(spec, "storage", problems)
    message_log = _mapping(spec, "messageLog", problems)
    auth = _mapping(spec, "auth", problems)
    retention = _mapping(spec, "persistentVolumeClaimRetentionPolicy", problems)
    network_policy = _network_policy(_mapping(spec, "networkPolicy", problems), problems)

    account = _text(spec.get("account"), "spec.account", problems)
    company = _text(spec.get("company"), "spec.company", problems)
    endpoints = _endpoints(spec.get("endpoints"), problems)
    if "replicas" in spec and "endpoints" in spec:
        problems.append(
            "spec.replicas and spec.endpoints are exclusive: set replicas for brokers the operator runs "
            "as pods, or endpoints for brokers that run elsewhere, not both"
        )
    replicas = 0 if endpoints else fields.REPLICAS.read(spec, problems, fields.DEFAULT_REPLICAS)

    try:
        # The one parser of the heartbeat fields, shared with the engine; the CRD's types and bounds.
        heartbeat = HeartbeatSettings.from_spec(spec, crd_bounds=True)
    except SettingsError as error:
        problems += error.problems
        heartbeat = HeartbeatSettings()

    on_poison = fields.ON_POISON.read(delivery, problems)
    preferred = spec.get("preferredActive")
    if preferred is not None:
        preferred = _text(preferred, "spec.preferredActive", problems)
        allowed = (
            [e.name for e in endpoints]
            if endpoints
            else [names.pod_name(cluster, i) for i in range(replicas)]
        )
        if preferred and preferred not in allowed:
            problems.append(f"spec.preferredActive ({preferred}) must name one of {', '.join(allowed)}")

    token_secret = read_secret_ref(auth.get("tokenSecretRef"), fields.TOKEN_KEY, problems)
    backend_token_secret = read_secret_ref(
        auth.get("backendTokenSecretRef"), fields.BACKEND_TOKEN_KEY, problems
    )
    if token_secret is not None and token_secret == backend_token_secret:
        problems.append(
            "spec.auth.backendTokenSecretRef names the same Secret key as spec.auth.tokenSecretRef; "
            "the backend needs a credential of its own"
        )
    parsed = ClusterSpec(
        account=account,
        company=company,
        replicas=replicas,
        endpoints=endpoints,
        image=_image(spec.get("image"), problems),
        image_pull_policy=fields.IMAGE_PULL_POLICY.read(spec, problems),
        resources=dict(spec.get("resources") or {}),
        storage_size=str(storage.get("size") or fields.STORAGE_SIZE.default),
        storage_class=storage.get("storageClassName"),
        claim_retention=ClaimRetention(
            when_scaled=fields.WHEN_SCALED.read(retention, problems),
            when_deleted=fields.WHEN_DELETED.read(retention, problems),
        ),
        backend=_connection(spec, "backend", fields.BACKEND_URL_KEY, problems),
        cloud=_connection(spec, "cloud", fields.CLOUD_URL_KEY, problems),
        token_secret=token_secret,
        backend_token_secret=backend_token_secret,
        heartbeat=heartbeat,
        preferred_active=preferred or None,
        max_deliveries=fields.MAX_DELIVERIES.read(delivery, problems),
        on_poison=on_poison,
        message_log_claim=message_log.get("claimName") or None,
        message_log_mount=str(message_log.get("mountPath") or fields.MESSAGE_LOG_MOUNT.default),
        network_policy=network_policy,
        pod_security_context=_security_context(spec, "podSecurityContext", "PodSecurityContext", problems),
        container_security_context=_security_context(spec, "securityContext", "SecurityContext", problems),
        affinity=_kubernetes_object(
            spec, "affinity", "Affinity", "leave it out to spread the brokers over nodes", problems
        ),
        node_selector=_kubernetes_object(
            spec, "nodeSelector", "node selector (labels)", "leave it out for any node", problems
        ),
        tolerations=_tolerations(spec, problems),
        drain_without_standby=fields.DRAIN_WITHOUT_STANDBY.read(spec, problems),
        tls=parse_tls(_mapping(spec, "tls", problems), problems),
        active_service=parse_active_service(_mapping(spec, "activeService", problems), problems),
        pod=parse_pod(spec, problems),
    )
    if problems:
        raise SpecError(cluster, problems)
    return parsed


def _image(value: object, problems: list[str]) -> str | None:
    """``spec.image``, or None for the operator's own (absent, or the CRD's former default)."""
    if value is None or value == FORMER_DEFAULT_IMAGE:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > IMAGE_MAX:
        problems.append(
            f"spec.image ({value!r}) must be an image reference of at most {IMAGE_MAX} characters; "
            "leave it out for the operator's --broker-image"
        )
        return None
    return value


def _mapping(spec: Mapping[str, Any], field: str, problems: list[str]) -> Mapping[str, Any]:
    value = spec.get(field) or {}
    if not isinstance(value, Mapping):
        problems.append(f"spec.{field} must be an object, got {value!r}")
        return {}
    return value


def _text(value: object, path: str, problems: list[str]) -> str:
    if not isinstance(value, str) or not value:
        problems.append(f"{path} is required and must be a non-empty string, got {value!r}")
        return ""
    return value


def _endpoints(raw: object, problems: list[str]) -> tuple[Endpoint, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        problems.append(f"spec.endpoints must be a non-empty list of {{name, url, priority}}, got {raw!r}")
        return ()
    endpoints: list[Endpoint] = []
    for index, entry in enumerate(raw):
        path = f"spec.endpoints[{index}]"
        if not isinstance(entry, Mapping):
            problems.append(f"{path} must be an object with name, url and priority")
            continue
        name = _text(entry.get("name"), f"{path}.name", problems)
        if name and not _DNS_LABEL.match(name):
            problems.append(f"{path}.name ({name}) must be a DNS label: lower-case letters, digits and '-'")
        url = _text(entry.get("url"), f"{path}.url", problems)
        if url and not _URL.match(url):
            problems.append(f"{path}.url ({url}) must be an http:// or https:// URL")
        priority = (
            fields.ENDPOINT_PRIORITY.read(entry, problems, 0, parent=path) if "priority" in entry else -1
        )
        if priority < 0:
            problems.append(f"{path}.priority is required")
        endpoints.append(Endpoint(name, url, priority))
    seen_names = [e.name for e in endpoints]
    duplicates = sorted({n for n in seen_names if seen_names.count(n) > 1})
    if duplicates:
        problems.append(f"spec.endpoints names must be unique; repeated: {', '.join(duplicates)}")
    priorities = [e.priority for e in endpoints]
    repeated = [f"{e.name}={e.priority}" for e in endpoints if priorities.count(e.priority) > 1]
    if repeated:
        problems.append(f"spec.endpoints priorities must be unique; repeated: {', '.join(repeated)}")
    return tuple(sorted(endpoints, key=lambda e: e.priority))


def _network_policy(raw: Mapping[str, Any], problems: list[str]) -> NetworkPolicySpec | None:
    """``spec.networkPolicy``: None unless enabled (the default); the peers checked for shape as the
    CRD's CEL does."""
    enabled = fields.NETWORK_POLICY_ENABLED.read(raw, problems)
    policy = NetworkPolicySpec(
        _peers(raw, "sendMessagesFrom", "to admit every source", problems),
        _peers(raw, "egressTo", "to let brokers reach every address but the link-local ranges", problems),
    )
    return policy if enabled else None


def _peers(
    raw: Mapping[str, Any], field: str, absent_means: str, problems: list[str]
) -> tuple[Mapping[str, Any], ...] | None:
    peers = raw.get(field)
    if peers is None:
        return None
    if not isinstance(peers, Sequence) or isinstance(peers, str) or not peers:
        problems.append(
            f"spec.networkPolicy.{field} must be a non-empty list of NetworkPolicyPeers "
            f"(podSelector, namespaceSelector, ipBlock), got {peers!r}; leave it out {absent_means}"
        )
        return None
    checked: list[Mapping[str, Any]] = []
    for index, peer in enumerate(peers):
        path = f"spec.networkPolicy.{field}[{index}]"
        if not isinstance(peer, Mapping):
            problems.append(f"{path} must be a NetworkPolicyPeer object, got {peer!r}")
            continue
        given = {name: peer[name] for name in _PEER_FIELDS if peer.get(name) is not None}
        if not given:
            problems.append(f"{path} must set podSelector, namespaceSelector or ipBlock")
        if "ipBlock" in given and any(name in given for name in _PEER_SELECTORS):
            problems.append(f"{path}: ipBlock cannot be combined with podSelector or namespaceSelector")
        for name, value in given.items():
            if not isinstance(value, Mapping):
                problems.append(f"{path}.{name} must be an object, got {value!r}")
        checked.append(plain_copy(given))
    return tuple(checked)


def _security_context(
    spec: Mapping[str, Any], field: str, kind: str, problems: list[str]
) -> Mapping[str, Any] | None:
    return _kubernetes_object(
        spec, field, kind, "leave it out for the operator's non-root, read-only defaults", problems
    )


def _kubernetes_object(
    spec: Mapping[str, Any], field: str, kind: str, when_absent: str, problems: list[str]
) -> Mapping[str, Any] | None:
    """``spec.<field>`` as a JSON-ready object, or None when absent (the operator's default).

    Only its shape is checked: what is inside is a core/v1 ``kind``, which the API server
    validates, field by field and with its own messages, when the operator creates the pod.
    """
    value = spec.get(field)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        problems.append(f"spec.{field} must be an object (a Kubernetes {kind}), got {value!r}; {when_absent}")
        return None
    return cast(Mapping[str, Any], plain_copy(value))


def _tolerations(spec: Mapping[str, Any], problems: list[str]) -> tuple[Mapping[str, Any], ...] | None:
    """``spec.tolerations``: a list of core/v1 Tolerations (the API server checks each one)."""
    value = spec.get("tolerations")
    if value is None:
        return None
    if not isinstance(value, list | tuple) or not all(isinstance(item, Mapping) for item in value):
        problems.append(f"spec.tolerations must be a list of Kubernetes Tolerations (objects), got {value!r}")
        return None
    return tuple(cast(Mapping[str, Any], plain_copy(item)) for item in value)


def _connection(
    spec: Mapping[str, Any], field: str, url_key: fields.TextField, problems: list[str]
) -> Connection:
    raw = _mapping(spec, field, problems)
    url = raw.get("url")
    if url is not None and not (isinstance(url, str) and url.startswith(("http://", "https://"))):
        problems.append(f"spec.{field}.url ({url!r}) must be an http:// or https:// URL")
        url = None
    secret = read_secret_ref(raw.get("urlSecretRef"), url_key, problems)
    if url is not None and secret is not None:
        problems.append(f"spec.{field}.url and spec.{field}.urlSecretRef are exclusive; set one")
    credentials = raw.get("credentialsSecretRef")
    credentials_name: str | None = None
    if credentials is not None:
        if (
            isinstance(credentials, Mapping)
            and isinstance(credentials.get("name"), str)
            and credentials["name"]
        ):
            credentials_name = credentials["name"]
        else:
            problems.append(f"spec.{field}.credentialsSecretRef must name a Secret: {{name}}")
    return Connection(url, secret, credentials_name)
