"""A BrokerCluster's spec, read once into a typed, defaulted, checked ``ClusterSpec``.

The CRD's schema and CEL rules are the first line: the API server refuses an
invalid manifest. This module is the second line, for the cases the API server
does not cover (a CRD installed without its rules, an object written before a
rule existed, a test API server without admission): it applies the same
defaults and the same checks with the same messages, so the operator never
runs a cluster the CRD would have refused. The messages name the field and
the value, like the CEL ``messageExpression``s do.

This module reads and checks; it does not talk to Kubernetes and does not
decide anything about failover (the engine reads the heartbeat settings
itself through ``HeartbeatSettings.from_spec``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from broker_operator.controller import names

DEFAULT_REPLICAS: Final = 2
DEFAULT_IMAGE: Final = "broker-failover/broker:0.1.0"
DEFAULT_STORAGE_SIZE: Final = "1Gi"
DEFAULT_MESSAGE_LOG_MOUNT: Final = "/var/lib/broker/message-log"
MAX_REPLICAS: Final = 9
ON_POISON_POLICIES: Final = ("BlockStream", "Hold")
FAILBACK_MODES: Final = ("Automatic", "Manual")
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
class SecretRef:
    name: str
    key: str


@dataclass(frozen=True)
class Connection:
    """How brokers reach the backend or the cloud: a plain URL or a Secret key holding one."""

    url: str | None
    url_secret: SecretRef | None


@dataclass(frozen=True)
class ClusterSpec:
    account: str
    company: str
    replicas: int  # 0 in endpoints mode
    endpoints: tuple[Endpoint, ...]
    image: str
    image_pull_policy: str
    resources: Mapping[str, Any]
    storage_size: str
    storage_class: str | None
    backend: Connection
    cloud: Connection
    token_secret: SecretRef | None  # None: the operator generates <name>-broker-token
    backend_token_secret: SecretRef | None  # None: the operator generates <name>-backend-token
    heartbeat_interval: int
    heartbeat_timeout: int
    failure_threshold: int
    lease_seconds: int
    standby_probe_seconds: int
    failback: str
    failback_stable_seconds: int
    preferred_active: str | None
    max_deliveries: int
    on_poison: str
    message_log_claim: str | None
    message_log_mount: str

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
    heartbeat = _mapping(spec, "heartbeat", problems)
    delivery = _mapping(spec, "delivery", problems)
    storage = _mapping(spec, "storage", problems)
    message_log = _mapping(spec, "messageLog", problems)
    auth = _mapping(spec, "auth", problems)

    account = _text(spec.get("account"), "spec.account", problems)
    company = _text(spec.get("company"), "spec.company", problems)
    endpoints = _endpoints(spec.get("endpoints"), problems)
    if "replicas" in spec and "endpoints" in spec:
        problems.append(
            "spec.replicas and spec.endpoints are exclusive: set replicas for brokers the operator runs "
            "as pods, or endpoints for brokers that run elsewhere, not both"
        )
    replicas = (
        0 if endpoints else _integer(spec, "replicas", DEFAULT_REPLICAS, 1, MAX_REPLICAS, "spec", problems)
    )

    interval = _integer(heartbeat, "intervalSeconds", 1, 1, 60, "spec.heartbeat", problems)
    timeout = _integer(heartbeat, "timeoutSeconds", 1, 1, 60, "spec.heartbeat", problems)
    threshold = _integer(heartbeat, "failureThreshold", 2, 1, 100, "spec.heartbeat", problems)
    lease = _integer(heartbeat, "leaseSeconds", 5, 1, 3600, "spec.heartbeat", problems)
    probe = _integer(heartbeat, "standbyProbeSeconds", 10, 0, 3600, "spec.heartbeat", problems)
    # A lease that runs out before the operator has even declared the active failed would let a
    # healthy active fence itself between two heartbeats; the CRD refuses it the same way.
    if lease <= interval * threshold:
        problems.append(
            f"spec.heartbeat.leaseSeconds ({lease}) must exceed intervalSeconds × failureThreshold "  # noqa: RUF001
            f"({interval * threshold})"
        )
    if timeout > interval:
        problems.append(
            f"spec.heartbeat.timeoutSeconds ({timeout}) must not exceed intervalSeconds ({interval})"
        )

    failback = _choice(spec, "failback", FAILBACK_MODES, "spec", problems)
    on_poison = _choice(delivery, "onPoison", ON_POISON_POLICIES, "spec.delivery", problems)
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

    token_secret = _secret_ref(auth.get("tokenSecretRef"), "spec.auth.tokenSecretRef", "token", problems)
    backend_token_secret = _secret_ref(
        auth.get("backendTokenSecretRef"), "spec.auth.backendTokenSecretRef", "token", problems
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
        image=str(spec.get("image") or DEFAULT_IMAGE),
        image_pull_policy=str(spec.get("imagePullPolicy") or "IfNotPresent"),
        resources=dict(spec.get("resources") or {}),
        storage_size=str(storage.get("size") or DEFAULT_STORAGE_SIZE),
        storage_class=storage.get("storageClassName"),
        backend=_connection(spec, "backend", problems),
        cloud=_connection(spec, "cloud", problems),
        token_secret=token_secret,
        backend_token_secret=backend_token_secret,
        heartbeat_interval=interval,
        heartbeat_timeout=timeout,
        failure_threshold=threshold,
        lease_seconds=lease,
        standby_probe_seconds=probe,
        failback=failback,
        failback_stable_seconds=_integer(spec, "failbackStableSeconds", 30, 0, 86400, "spec", problems),
        preferred_active=preferred or None,
        max_deliveries=_integer(delivery, "maxDeliveries", 5, 1, 100, "spec.delivery", problems),
        on_poison=on_poison,
        message_log_claim=message_log.get("claimName") or None,
        message_log_mount=str(message_log.get("mountPath") or DEFAULT_MESSAGE_LOG_MOUNT),
    )
    if problems:
        raise SpecError(cluster, problems)
    return parsed


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


def _integer(  # noqa: PLR0917  (field, default, bounds, path: one call per field, read as a row)
    spec: Mapping[str, Any], field: str, default: int, low: int, high: int, parent: str, problems: list[str]
) -> int:
    value = spec.get(field, default)
    # bool is an int in Python; `true` is never a valid count.
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        problems.append(f"{parent}.{field} ({value!r}) must be an integer from {low} to {high}")
        return default
    return value


def _choice(
    spec: Mapping[str, Any], field: str, allowed: Sequence[str], parent: str, problems: list[str]
) -> str:
    value = spec.get(field, allowed[0])
    if value not in allowed:
        problems.append(f"{parent}.{field} ({value!r}) must be one of {', '.join(allowed)}")
        return allowed[0]
    return str(value)


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
        priority = _integer(entry, "priority", 0, 0, 1000, path, problems) if "priority" in entry else -1
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


def _secret_ref(raw: object, path: str, default_key: str, problems: list[str]) -> SecretRef | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or not raw.get("name"):
        problems.append(f"{path} must name a Secret: {{name, key}}, got {raw!r}")
        return None
    return SecretRef(str(raw["name"]), str(raw.get("key") or default_key))


def _connection(spec: Mapping[str, Any], field: str, problems: list[str]) -> Connection:
    raw = _mapping(spec, field, problems)
    url = raw.get("url")
    if url is not None and not (isinstance(url, str) and url.startswith(("http://", "https://"))):
        problems.append(f"spec.{field}.url ({url!r}) must be an http:// or https:// URL")
        url = None
    secret = _secret_ref(raw.get("urlSecretRef"), f"spec.{field}.urlSecretRef", "url", problems)
    if url is not None and secret is not None:
        problems.append(f"spec.{field}.url and spec.{field}.urlSecretRef are exclusive; set one")
    return Connection(url, secret)
