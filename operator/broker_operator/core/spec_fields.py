"""The BrokerCluster spec's constrained fields: each one's default, bounds or choices, written once.

The CRD (``crds/broker.failover.dev_brokerclusters.yaml``) is the authority: it is what the API
server enforces and what ``kubectl explain`` shows. This module is its transcription for the
Python side, and the only one: the controller's spec parser (``controller/spec.py``) and the
heartbeat settings (``core/model.py``) take every default, range and enum from here instead of
writing their own, and ``tests/unit/controller/test_crd.py`` checks this table against the CRD's
openAPI schema in both directions, so a field added, re-defaulted or re-bounded in one place and
not the other fails the tests.

Each constrained field also reads itself out of a spec section (``read``), so that a range is
checked, and its message worded, the same way by both parsers. A field is an ``IntegerField``
(``type: integer``), a ``NumberField`` (``type: number``: the heartbeat durations, which take
decimal seconds such as 0.2), a ``ChoiceField`` (an enum), an ``OptionalChoiceField`` (an enum
without a default), a ``TextField`` or a ``BooleanField``.

What it does not hold: the cross-field rules (lease longer than interval times failureThreshold, and
so on), which are code in the parsers and CEL in the CRD, checked against each other by the same
messages in the unit and e2e tests; and fields without a default, bound or enum (names, URLs,
Secret names), which the parsers read as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final


@dataclass(frozen=True)
class SpecField:
    """Where a field is: ``path``, dotted below ``spec`` ("heartbeat.intervalSeconds"; "[]" marks
    a list's items)."""

    path: str

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1]

    @property
    def parent(self) -> str:
        """``spec`` or ``spec.<section>``: the path the parsers' messages name the field under."""
        return "spec" + "".join(f".{part}" for part in self.path.split(".")[:-1])


@dataclass(frozen=True)
class IntegerField(SpecField):
    """An integer field; ``seconds`` marks a duration (the local runner may give it in fractions,
    though the CRD wants whole seconds)."""

    minimum: int
    maximum: int
    default: int | None = None
    seconds: bool = False

    def read(
        self, section: Mapping[str, Any], problems: list[str], default: int | None = None, *, parent: str = ""
    ) -> int:
        """The field's value in ``section`` (the object that holds it), or its default; a value out
        of bounds is added to ``problems``, named as the CRD names it (``parent`` names a list's item,
        ``spec.endpoints[2]``), and the default returned."""
        fallback = self.default if default is None else default
        value = section.get(self.name, fallback)
        # bool is an int in Python; `true` is never a valid count.
        if not isinstance(value, int) or isinstance(value, bool) or not self.minimum <= value <= self.maximum:
            bounds = f"from {self.minimum} to {self.maximum}"
            problems.append(f"{parent or self.parent}.{self.name} ({value!r}) must be an integer {bounds}")
            return fallback or 0
        return value


@dataclass(frozen=True)
class NumberField(SpecField):
    """A decimal field (``type: number``), read as a float: a duration in seconds, such as 0.2."""

    minimum: float
    maximum: float
    default: float | None = None

    def read(self, section: Mapping[str, Any], problems: list[str]) -> float:
        """The field's value in ``section`` as a float (an integer is a number too), or its default; a
        value of another type or out of bounds is added to ``problems`` and the default returned."""
        value = section.get(self.name, self.default)
        # bool is an int in Python; `true` is never a number of seconds.
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not self.minimum <= value <= self.maximum:
            bounds = f"from {self.minimum:g} to {self.maximum:g}"
            problems.append(f"{self.parent}.{self.name} ({value!r}) must be a number {bounds}")
            return float(self.default or 0)
        return float(value)


@dataclass(frozen=True)
class ChoiceField(SpecField):
    """A string field with an enum and a default."""

    choices: tuple[str, ...]
    default: str

    def read(self, section: Mapping[str, Any], problems: list[str]) -> str:
        """The field's value in ``section``, or its default; anything else is added to ``problems``."""
        value = section.get(self.name, self.default)
        if value not in self.choices:
            problems.append(f"{self.parent}.{self.name} ({value!r}) must be one of {', '.join(self.choices)}")
            return self.default
        return str(value)


@dataclass(frozen=True)
class OptionalChoiceField(SpecField):
    """A string field with an enum and no default: absent means "not set" (the API server's or
    the operator's own default applies), as ``activeService.externalTrafficPolicy``, which a
    ClusterIP Service must not carry at all."""

    choices: tuple[str, ...]

    def read(self, section: Mapping[str, Any], problems: list[str]) -> str | None:
        """The field's value in ``section``, or None when absent; anything else is a problem."""
        value = section.get(self.name)
        if value is None:
            return None
        if value not in self.choices:
            problems.append(f"{self.parent}.{self.name} ({value!r}) must be one of {', '.join(self.choices)}")
            return None
        return str(value)


@dataclass(frozen=True)
class BooleanField(SpecField):
    """A boolean field with a default (``type: boolean``)."""

    default: bool

    def read(self, section: Mapping[str, Any], problems: list[str]) -> bool:
        """The field's value in ``section``, or its default; anything but true or false is a problem."""
        value = section.get(self.name, self.default)
        if not isinstance(value, bool):
            problems.append(f"{self.parent}.{self.name} ({value!r}) must be true or false")
            return self.default
        return value


@dataclass(frozen=True)
class TextField(SpecField):
    """A string field with a default and no enum."""

    default: str


# replicas has no schema default: it is exclusive with endpoints, and a default would make every
# endpoints manifest invalid. The operator applies DEFAULT_REPLICAS when neither is set.
REPLICAS: Final = IntegerField("replicas", 1, 9)
DEFAULT_REPLICAS: Final = 2
ENDPOINT_PRIORITY: Final = IntegerField("endpoints[].priority", 0, 1000)

IMAGE_PULL_POLICY: Final = ChoiceField("imagePullPolicy", ("Always", "IfNotPresent", "Never"), "IfNotPresent")
STORAGE_SIZE: Final = TextField("storage.size", "1Gi")
# Retain first and default: a journal may hold acknowledged messages, held messages and the
# stored epoch, so it is deleted only when asked (as StatefulSet's policy of the same name).
WHEN_SCALED: Final = ChoiceField(
    "persistentVolumeClaimRetentionPolicy.whenScaled", ("Retain", "Delete"), "Retain"
)
WHEN_DELETED: Final = ChoiceField(
    "persistentVolumeClaimRetentionPolicy.whenDeleted", ("Retain", "Delete"), "Retain"
)
BACKEND_URL_KEY: Final = TextField("backend.urlSecretRef.key", "url")
CLOUD_URL_KEY: Final = TextField("cloud.urlSecretRef.key", "url")
TOKEN_KEY: Final = TextField("auth.tokenSecretRef.key", "token")
BACKEND_TOKEN_KEY: Final = TextField("auth.backendTokenSecretRef.key", "token")

# Decimal seconds: sub-second heartbeats (interval 0.2, lease 2) fail over within a few seconds.
HEARTBEAT_INTERVAL: Final = NumberField("heartbeat.intervalSeconds", 0.1, 60, 1)
HEARTBEAT_TIMEOUT: Final = NumberField("heartbeat.timeoutSeconds", 0.1, 60, 1)
FAILURE_THRESHOLD: Final = IntegerField("heartbeat.failureThreshold", 1, 100, 2)
# 10 s: an operator restarted after a kill -9 renews within about 4-5 s on a quiet two-core node
# (make bench-operator-upgrade-k8s); the lease must outlast that, plus an interval, with a margin.
LEASE: Final = NumberField("heartbeat.leaseSeconds", 0.1, 3600, 10)
# The lease a stopping operator grants the actives it hands over (issue 40): long enough for its
# successor to start and renew them; a successor waits it out before it activates anyone else.
HANDOVER_LEASE: Final = NumberField("heartbeat.handoverLeaseSeconds", 0.1, 3600, 30)
STANDBY_PROBE: Final = IntegerField("heartbeat.standbyProbeSeconds", 0, 3600, 10, seconds=True)
FAILBACK: Final = ChoiceField("failback", ("Automatic", "Manual"), "Automatic")
FAILBACK_STABLE: Final = IntegerField("failbackStableSeconds", 0, 86400, 30, seconds=True)

MAX_DELIVERIES: Final = IntegerField("delivery.maxDeliveries", 1, 100, 5)
ON_POISON: Final = ChoiceField("delivery.onPoison", ("BlockStream", "Hold"), "BlockStream")
MESSAGE_LOG_MOUNT: Final = TextField("messageLog.mountPath", "/var/lib/broker/message-log")
# On unless turned off (issue 39): by default the policy admits SendMessages from every source (a
# backend nobody listed is never cut off) and restricts what no backend needs: the admin port to
# the operator's pods, and the brokers' egress to DNS and every address but the link-local ranges.
NETWORK_POLICY_ENABLED: Final = BooleanField("networkPolicy.enabled", True)
# What a drain does to an active broker that no standby on another node can relieve: Wait (its
# PodDisruptionBudget refuses the eviction until one can) or Evict (nobody is active until it
# restarts elsewhere; nothing is lost, the backend resends).
DRAIN_EVICT: Final = "Evict"
DRAIN_WITHOUT_STANDBY: Final = ChoiceField("drainWithoutStandby", ("Wait", DRAIN_EVICT), "Wait")
# TLS on every channel (issue 41). Operator: the operator's CA issues everything; Secrets: the user's
# Secrets (cert-manager's shape), only read; Disabled: plain HTTP, the opt-out.
TLS_MODE_OPERATOR: Final = "Operator"
TLS_MODE_SECRETS: Final = "Secrets"
TLS_MODE_DISABLED: Final = "Disabled"
TLS_MODE: Final = ChoiceField(
    "tls.mode", (TLS_MODE_OPERATOR, TLS_MODE_SECRETS, TLS_MODE_DISABLED), TLS_MODE_OPERATOR
)
TLS_CLUSTER_DOMAIN: Final = TextField("tls.clusterDomain", "cluster.local")
# Strimzi's and CloudNativePG's numbers: 90-day leaves renewed 30 days ahead, a ten-year CA. The
# bounds keep pki.RenewalPolicy satisfiable: a leaf is never due when issued (renewBeforeDays <
# validityDays, a CEL rule), and the CA's fixed 365-day renewal window fits inside its life.
CERTIFICATE_VALIDITY_DAYS: Final = IntegerField("tls.certificates.validityDays", 2, 3650, 90)
CERTIFICATE_RENEW_BEFORE_DAYS: Final = IntegerField("tls.certificates.renewBeforeDays", 1, 365, 30)
CA_VALIDITY_DAYS: Final = IntegerField("tls.certificates.caValidityDays", 366, 36500, 3650)
BACKEND_CLIENTS_CA_KEY: Final = TextField("tls.backendClients.caSecretRef.key", "ca.crt")
UPSTREAM_CA_KEY: Final = TextField("tls.upstreamCASecretRef.key", "ca.crt")

# spec.topologySpreadConstraints[] (issue 42): the bounds the CRD states of a core/v1 constraint's
# required fields; the rest of each entry is core/v1's, which the API server checks on the pod.
# 100: far above any skew that means something for at most 9 brokers.
TOPOLOGY_MAX_SKEW: Final = IntegerField("topologySpreadConstraints[].maxSkew", 1, 100)
WHEN_UNSATISFIABLE: Final = OptionalChoiceField(
    "topologySpreadConstraints[].whenUnsatisfiable", ("DoNotSchedule", "ScheduleAnyway")
)

# The <name>-active Service's shape (the backend's address). externalTrafficPolicy and nodePort have
# no default: a ClusterIP Service must carry neither, and absent on the other types means the API
# server's (Cluster; a node port it picks).
ACTIVE_SERVICE_CLUSTER_IP: Final = "ClusterIP"
ACTIVE_SERVICE_LOAD_BALANCER: Final = "LoadBalancer"
ACTIVE_SERVICE_TYPE: Final = ChoiceField(
    "activeService.type",
    (ACTIVE_SERVICE_CLUSTER_IP, "NodePort", ACTIVE_SERVICE_LOAD_BALANCER),
    ACTIVE_SERVICE_CLUSTER_IP,
)
EXTERNAL_TRAFFIC_POLICY: Final = OptionalChoiceField(
    "activeService.externalTrafficPolicy", ("Cluster", "Local")
)
# The API server's default service-node-port-range; a cluster with another range refuses a port
# outside its own when the operator writes the Service (the event names it).
NODE_PORT: Final = IntegerField("activeService.nodePort", 30000, 32767)

# In the design's spec, but deprecated and ignored (issue 42): the chart runs one validator
# CronJob for every cluster, on its own value (validator.schedule). No default since then, so it is
# not a constrained field; controller/deprecated_fields.py reads it only to say so.
MESSAGE_LOG_SCHEDULE_PATH: Final = "messageLog.schedule"

FIELDS: Final[
    tuple[IntegerField | NumberField | ChoiceField | OptionalChoiceField | TextField | BooleanField, ...]
] = (
    REPLICAS,
    ENDPOINT_PRIORITY,
    IMAGE_PULL_POLICY,
    STORAGE_SIZE,
    WHEN_SCALED,
    WHEN_DELETED,
    BACKEND_URL_KEY,
    CLOUD_URL_KEY,
    TOKEN_KEY,
    BACKEND_TOKEN_KEY,
    HEARTBEAT_INTERVAL,
    HEARTBEAT_TIMEOUT,
    FAILURE_THRESHOLD,
    LEASE,
    HANDOVER_LEASE,
    STANDBY_PROBE,
    FAILBACK,
    FAILBACK_STABLE,
    MAX_DELIVERIES,
    ON_POISON,
    MESSAGE_LOG_MOUNT,
    NETWORK_POLICY_ENABLED,
    DRAIN_WITHOUT_STANDBY,
    TOPOLOGY_MAX_SKEW,
    WHEN_UNSATISFIABLE,
    TLS_MODE,
    TLS_CLUSTER_DOMAIN,
    CERTIFICATE_VALIDITY_DAYS,
    CERTIFICATE_RENEW_BEFORE_DAYS,
    CA_VALIDITY_DAYS,
    BACKEND_CLIENTS_CA_KEY,
    UPSTREAM_CA_KEY,
    ACTIVE_SERVICE_TYPE,
    EXTERNAL_TRAFFIC_POLICY,
    NODE_PORT,
)
"""Every field of the spec with a default, a minimum/maximum or an enum in the CRD."""

NOT_READ_BY_THE_OPERATOR: Final = (MESSAGE_LOG_SCHEDULE_PATH,)
"""CRD fields that ``parse_spec`` does not read (deprecated ones, only looked at for their warning);
every other field of the CRD's spec it reads."""
