"""The plain values the failover engine reasons about: targets, settings, replies, pod facts.

These are the nouns shared by the decision core (:mod:`broker_operator.core`), the
heartbeat client and the Kubernetes shell. They are frozen dataclasses so that a
decision can never change what it was given, and so that hypothesis can build them.

Why the settings are validated here: every consumer (the controller's ``parse_spec``,
the heartbeat daemon, the local runner) builds them through
:meth:`HeartbeatSettings.from_spec`, the one parser of the heartbeat fields, so the one
place that applies the CRD's defaults (from :mod:`broker_operator.core.spec_fields`) is
also the one place that refuses a combination the failover rules cannot work with.
``HeartbeatReply`` is the contract's (``broker_contracts.soap``), shared with the broker.

This module does no I/O and knows nothing of Kubernetes, zeep or asyncio.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from typing import Any

from broker_contracts.soap import HeartbeatReply
from broker_operator.core.spec_fields import (
    FAILBACK,
    FAILBACK_STABLE,
    FAILURE_THRESHOLD,
    HANDOVER_LEASE,
    HEARTBEAT_INTERVAL,
    HEARTBEAT_TIMEOUT,
    LEASE,
    STANDBY_PROBE,
    IntegerField,
    NumberField,
)

__all__ = [
    "BrokerTarget",
    "FailbackMode",
    "HeartbeatReply",  # the contract's (broker_contracts.soap), re-exported for the core's users
    "HeartbeatSettings",
    "PodFacts",
    "SettingsError",
    "cel_number",
]


class FailbackMode(StrEnum):
    AUTOMATIC = "Automatic"  # return to the highest-priority healthy broker once it is stable
    MANUAL = "Manual"  # stay on the current active until it fails or a switchover is asked


class SettingsError(ValueError):
    """A BrokerCluster spec the failover rules cannot run with; ``problems`` names every bad field."""

    def __init__(self, problems: str | Sequence[str]) -> None:
        self.problems = (problems,) if isinstance(problems, str) else tuple(problems)
        super().__init__("; ".join(self.problems))


@dataclass(frozen=True)
class BrokerTarget:
    """One broker the engine heartbeats. Smaller ``priority`` = preferred (pod ordinal 0 is 0)."""

    name: str
    url: str  # the broker's SOAP endpoint, http://<ip>:<port>/soap (https:// when it serves TLS)
    priority: int
    # The name the broker's server certificate must carry, when the URL dials something else: a
    # pod's IP, verified as the pod's DNS name ``<pod>.<cluster>-brokers.<ns>.svc.<domain>``
    # (pki/names.py). None: plain HTTP, or a URL whose host is the name to verify.
    tls_server_name: str | None = None


@dataclass(frozen=True)
class PodFacts:
    """What Kubernetes says about a broker's pod; the only evidence of death besides the lease."""

    exists: bool
    container_terminated: bool
    # The pod's node is being drained (cordoned, or marked for removal): the broker must not stay
    # or become active there, and an active moves off it by a planned switchover.
    node_draining: bool = False

    @property
    def dead(self) -> bool:
        return not self.exists or self.container_terminated


def _duration(
    section: Mapping[str, Any], field: IntegerField | NumberField, problems: list[str], *, crd_bounds: bool
) -> float:
    """A duration field: within the CRD's type and bounds (decimal seconds for a ``NumberField``, whole
    seconds for an ``IntegerField``), or with ``crd_bounds=False`` any number of seconds up to the
    maximum (above 0 where the CRD's minimum is above 0)."""
    if isinstance(field, IntegerField) and not field.seconds:
        return field.read(section, problems)
    value = section.get(field.name, field.default)
    if crd_bounds or isinstance(value, bool) or not isinstance(value, int | float):
        return float(field.read(section, problems))
    low_ok = value > 0 if field.minimum > 0 else value >= field.minimum
    if not low_ok or value > field.maximum:
        above = "above 0" if field.minimum > 0 else f"at least {field.minimum:g}"
        problems.append(
            f"{field.parent}.{field.name} ({value!r}) must be a number of seconds {above} "
            f"and at most {field.maximum:g}"
        )
        return float(field.default or 0)
    return float(value)


def cel_number(value: float) -> str:
    """``value`` as the CRD's CEL messages write a number (``'%s'.format([double])``, Go's ``%g``).

    The shortest digits that read back as the same float, so 1.0 is "1", 0.2 is "0.2" and 0.1 * 3 is
    "0.30000000000000004" (Python's ``:g`` would round it to six digits); exponent form below 1e-4 and
    from 1e6 ("1e+06"). The parsers' messages use it so that they equal the API server's.
    """
    if not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
    shortest = Decimal(repr(float(value))).normalize()  # repr: the shortest round-tripping digits
    exponent = shortest.adjusted()
    if -4 <= exponent < 6:
        return f"{shortest:f}"
    sign, digits, _ = shortest.as_tuple()
    mantissa = str(digits[0]) + ("." + "".join(map(str, digits[1:])) if len(digits) > 1 else "")
    return f"{'-' if sign else ''}{mantissa}e{exponent:+03d}"


# A stopping operator sends its handover renewals within HANDOVER_SEND_SECONDS of the moment its
# first engine saw the exit, and never after; an engine that starts adds HANDOVER_WINDOW_SECONDS
# to the fence of every broker (start_fence_seconds). The second beyond the sending covers the
# exiting process's event-loop lag before it saw the exit and the requests' way to the brokers.
HANDOVER_SEND_SECONDS = 1.0
HANDOVER_WINDOW_SECONDS = 2.0


@dataclass(frozen=True)
class HeartbeatSettings:
    """The heartbeat and failback settings of one BrokerCluster, in seconds.

    The one typed view of ``spec.heartbeat``, ``spec.failback`` and ``spec.failbackStableSeconds``:
    the controller's ``ClusterSpec`` carries one, built by :meth:`from_spec`, the only parser of
    those fields. Durations are floats: the CRD takes decimal seconds for the interval, timeout and
    lease (down to 0.1), and the local runner fractions for every duration.
    """

    interval_seconds: float = float(HEARTBEAT_INTERVAL.default or 0)
    timeout_seconds: float = float(HEARTBEAT_TIMEOUT.default or 0)
    failure_threshold: int = FAILURE_THRESHOLD.default or 0
    lease_seconds: float = float(LEASE.default or 0)
    # Asked for by the handover renewal of a stopping operator (taken as at least the lease).
    handover_lease_seconds: float = float(HANDOVER_LEASE.default or 0)
    standby_probe_seconds: float = float(STANDBY_PROBE.default or 0)  # 0 = standbys are never probed
    failback: FailbackMode = FailbackMode.AUTOMATIC  # FAILBACK.default; test_crd checks they agree
    failback_stable_seconds: float = float(FAILBACK_STABLE.default or 0)
    # How much longer than the lease the engine waits before it counts a silent
    # active as self-fenced: covers the broker's lease-check granularity and the
    # drift between its clock and ours. Not in the CRD; derived from the lease.
    lease_margin_seconds: float = 0.5

    def __post_init__(self) -> None:
        problems = _rule_problems(
            self.interval_seconds, self.timeout_seconds, self.failure_threshold, self.lease_seconds
        )
        if self.interval_seconds <= 0:
            problems.insert(0, f"spec.heartbeat.intervalSeconds ({self.interval_seconds}) must be positive")
        if self.timeout_seconds <= 0:
            problems.insert(0, f"spec.heartbeat.timeoutSeconds ({self.timeout_seconds}) must be positive")
        if self.failure_threshold < 1:
            problems.insert(
                0, f"spec.heartbeat.failureThreshold ({self.failure_threshold}) must be at least 1"
            )
        if problems:
            raise SettingsError(problems)

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any], *, crd_bounds: bool = False) -> HeartbeatSettings:
        """Settings from a BrokerCluster ``spec``; raise ``SettingsError`` naming every bad field.

        Defaults, ranges and choices are the CRD's (``spec_fields``), and so are the two rules
        between fields, with the CEL rules' messages. ``crd_bounds=True`` (the controller, through
        ``parse_spec``) takes durations as the CRD does: intervalSeconds, timeoutSeconds and
        leaseSeconds decimal seconds from 0.1, standbyProbeSeconds and failbackStableSeconds whole
        seconds; without it (the local runner, whose manifests no API server checks) a duration may
        be any number of seconds above 0, so that the demo and tests run the same rules faster.
        """
        problems: list[str] = []
        heartbeat = spec.get("heartbeat") or {}
        if not isinstance(heartbeat, Mapping):
            problems.append(f"spec.heartbeat must be an object, got {heartbeat!r}")
            heartbeat = {}
        interval = _duration(heartbeat, HEARTBEAT_INTERVAL, problems, crd_bounds=crd_bounds)
        timeout = _duration(heartbeat, HEARTBEAT_TIMEOUT, problems, crd_bounds=crd_bounds)
        threshold = FAILURE_THRESHOLD.read(heartbeat, problems)
        lease = _duration(heartbeat, LEASE, problems, crd_bounds=crd_bounds)
        handover = _duration(heartbeat, HANDOVER_LEASE, problems, crd_bounds=crd_bounds)
        probe = _duration(heartbeat, STANDBY_PROBE, problems, crd_bounds=crd_bounds)
        stable = _duration(spec, FAILBACK_STABLE, problems, crd_bounds=crd_bounds)
        problems += _rule_problems(interval, timeout, threshold, lease)
        failback = FAILBACK.read(spec, problems)
        if problems:
            raise SettingsError(problems)
        return cls(
            interval_seconds=interval,
            timeout_seconds=timeout,
            failure_threshold=threshold,
            lease_seconds=lease,
            handover_lease_seconds=handover,
            standby_probe_seconds=probe,
            failback=FailbackMode(failback),
            failback_stable_seconds=stable,
            lease_margin_seconds=max(0.25, 0.1 * lease),
        )

    @property
    def fence_seconds(self) -> float:
        """After this long without a possibly-received ``active=true``, a broker is surely inactive."""
        return self.lease_seconds + self.lease_margin_seconds

    @property
    def granted_handover_seconds(self) -> float:
        """The lease a handover renewal asks for: ``handoverLeaseSeconds``, at least the lease."""
        return max(self.handover_lease_seconds, self.lease_seconds)

    @property
    def start_fence_seconds(self) -> float:
        """How long an engine that just started counts every broker possibly active.

        A predecessor it may never have heard of (a stopped process, a replica that handled
        before it) may have handed a broker over with the longest lease it could grant, within
        ``HANDOVER_WINDOW_SECONDS`` of its stop, and that stop came before this engine started
        (docs/failover-engine.md, "Operator restarts and upgrades: the fence").
        """
        return self.granted_handover_seconds + HANDOVER_WINDOW_SECONDS + self.lease_margin_seconds


def _rule_problems(interval: float, timeout: float, threshold: int, lease: float) -> list[str]:
    """The rules between heartbeat fields, worded as the CRD's CEL rules word them (numbers as CEL's
    ``%s`` writes a double: ``cel_number``)."""
    problems = []
    # A lease that runs out before the operator has even declared the active failed would let a
    # healthy active fence itself between two heartbeats, during the blips it is meant to ride out.
    if lease <= interval * threshold:
        problems.append(
            f"spec.heartbeat.leaseSeconds ({cel_number(lease)}) must exceed intervalSeconds × "  # noqa: RUF001
            f"failureThreshold ({cel_number(interval * threshold)})"
        )
    # A reply awaited longer than the interval would overlap the next heartbeat.
    if timeout > interval:
        problems.append(
            f"spec.heartbeat.timeoutSeconds ({cel_number(timeout)}) must not exceed intervalSeconds "
            f"({cel_number(interval)})"
        )
    return problems
