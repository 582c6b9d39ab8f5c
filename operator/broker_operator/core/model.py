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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from broker_contracts.soap import HeartbeatReply
from broker_operator.core.spec_fields import (
    FAILBACK,
    FAILBACK_STABLE,
    FAILURE_THRESHOLD,
    HEARTBEAT_INTERVAL,
    HEARTBEAT_TIMEOUT,
    LEASE,
    STANDBY_PROBE,
    IntegerField,
)

__all__ = [
    "BrokerTarget",
    "FailbackMode",
    "HeartbeatReply",  # the contract's (broker_contracts.soap), re-exported for the core's users
    "HeartbeatSettings",
    "PodFacts",
    "SettingsError",
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
    url: str  # the broker's SOAP endpoint, http://<ip>:<port>/soap
    priority: int


@dataclass(frozen=True)
class PodFacts:
    """What Kubernetes says about a broker's pod; the only evidence of death besides the lease."""

    exists: bool
    container_terminated: bool

    @property
    def dead(self) -> bool:
        return not self.exists or self.container_terminated


def _duration(
    section: Mapping[str, Any], field: IntegerField, problems: list[str], *, whole_seconds: bool
) -> float:
    """A duration field: whole seconds within the CRD's bounds, or with ``whole_seconds=False`` any
    number of seconds up to the maximum (above 0 where the CRD's minimum is 1)."""
    if not field.seconds:
        return field.read(section, problems)
    value = section.get(field.name, field.default)
    if whole_seconds or isinstance(value, bool) or not isinstance(value, int | float):
        return field.read(section, problems)
    low_ok = value > 0 if field.minimum > 0 else value >= field.minimum
    if not low_ok or value > field.maximum:
        above = "above 0" if field.minimum > 0 else f"at least {field.minimum}"
        problems.append(
            f"{field.parent}.{field.name} ({value!r}) must be a number of seconds {above} "
            f"and at most {field.maximum}"
        )
        return float(field.default or 0)
    return float(value)


@dataclass(frozen=True)
class HeartbeatSettings:
    """The heartbeat and failback settings of one BrokerCluster, in seconds.

    The one typed view of ``spec.heartbeat``, ``spec.failback`` and ``spec.failbackStableSeconds``:
    the controller's ``ClusterSpec`` carries one, built by :meth:`from_spec`, the only parser of
    those fields. Durations are floats so that the benchmarks and tests can run the same rules
    faster than the CRD's whole-second minimum allows.
    """

    interval_seconds: float = float(HEARTBEAT_INTERVAL.default or 0)
    timeout_seconds: float = float(HEARTBEAT_TIMEOUT.default or 0)
    failure_threshold: int = FAILURE_THRESHOLD.default or 0
    lease_seconds: float = float(LEASE.default or 0)
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
    def from_spec(cls, spec: Mapping[str, Any], *, whole_seconds: bool = False) -> HeartbeatSettings:
        """Settings from a BrokerCluster ``spec``; raise ``SettingsError`` naming every bad field.

        Defaults, ranges and choices are the CRD's (``spec_fields``), and so are the two rules
        between fields, with the CEL rules' messages. ``whole_seconds=True`` (the controller,
        through ``parse_spec``) takes durations as the CRD does, whole seconds; without it (the
        local runner, whose manifests no API server checks) a duration may be any number of seconds
        above 0, so that the demo and tests run the same rules faster.
        """
        problems: list[str] = []
        heartbeat = spec.get("heartbeat") or {}
        if not isinstance(heartbeat, Mapping):
            problems.append(f"spec.heartbeat must be an object, got {heartbeat!r}")
            heartbeat = {}
        interval = _duration(heartbeat, HEARTBEAT_INTERVAL, problems, whole_seconds=whole_seconds)
        timeout = _duration(heartbeat, HEARTBEAT_TIMEOUT, problems, whole_seconds=whole_seconds)
        threshold = FAILURE_THRESHOLD.read(heartbeat, problems)
        lease = _duration(heartbeat, LEASE, problems, whole_seconds=whole_seconds)
        probe = _duration(heartbeat, STANDBY_PROBE, problems, whole_seconds=whole_seconds)
        stable = _duration(spec, FAILBACK_STABLE, problems, whole_seconds=whole_seconds)
        problems += _rule_problems(interval, timeout, threshold, lease)
        failback = FAILBACK.read(spec, problems)
        if problems:
            raise SettingsError(problems)
        return cls(
            interval_seconds=interval,
            timeout_seconds=timeout,
            failure_threshold=threshold,
            lease_seconds=lease,
            standby_probe_seconds=probe,
            failback=FailbackMode(failback),
            failback_stable_seconds=stable,
            lease_margin_seconds=max(0.25, 0.1 * lease),
        )

    @property
    def fence_seconds(self) -> float:
        """After this long without a possibly-received ``active=true``, a broker is surely inactive."""
        return self.lease_seconds + self.lease_margin_seconds


def _rule_problems(interval: float, timeout: float, threshold: int, lease: float) -> list[str]:
    """The rules between heartbeat fields, worded as the CRD's CEL rules word them."""
    problems = []
    # A lease that runs out before the operator has even declared the active failed would let a
    # healthy active fence itself between two heartbeats, during the blips it is meant to ride out.
    if lease <= interval * threshold:
        problems.append(
            f"spec.heartbeat.leaseSeconds ({lease:g}) must exceed intervalSeconds × failureThreshold "  # noqa: RUF001
            f"({interval * threshold:g})"
        )
    # A reply awaited longer than the interval would overlap the next heartbeat.
    if timeout > interval:
        problems.append(
            f"spec.heartbeat.timeoutSeconds ({timeout:g}) must not exceed intervalSeconds ({interval:g})"
        )
    return problems
