"""The plain values the failover engine reasons about: targets, settings, replies, pod facts.

These are the nouns shared by the decision core (:mod:`broker_operator.core`), the
heartbeat client and the Kubernetes shell. They are frozen dataclasses so that a
decision can never change what it was given, and so that hypothesis can build them.

Why the settings are validated here: every consumer (the controller, the local
runner, the benchmarks) builds them through :meth:`HeartbeatSettings.from_spec`, so
the one place that applies the design's defaults is also the one place that refuses
a combination the failover rules cannot work with.

This module does no I/O and knows nothing of Kubernetes, zeep or asyncio.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from broker_contracts.soap import BrokerState


class FailbackMode(StrEnum):
    AUTOMATIC = "Automatic"  # return to the highest-priority healthy broker once it is stable
    MANUAL = "Manual"  # stay on the current active until it fails or a switchover is asked


class SettingsError(ValueError):
    """A BrokerCluster spec the failover rules cannot run with; the message names the field."""


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


@dataclass(frozen=True)
class HeartbeatReply:
    """A broker's answer to Heartbeat, as the WSDL's HeartbeatResponse."""

    state: BrokerState
    unavailability_code: str | None
    unavailability_message: str | None
    epoch: int


def _number(section: Mapping[str, Any], key: str, default: float, path: str) -> float:
    value = section.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SettingsError(f"BrokerCluster {path}.{key} ({value!r}) must be a number")
    if value < 0:
        raise SettingsError(f"BrokerCluster {path}.{key} ({value}) must not be negative")
    return float(value)


@dataclass(frozen=True)
class HeartbeatSettings:
    """The heartbeat and failback settings of one BrokerCluster, in seconds.

    Durations are floats so that the benchmarks and tests can run the same rules
    faster than the CRD's whole-second minimum allows.
    """

    interval_seconds: float = 1.0
    timeout_seconds: float = 1.0
    failure_threshold: int = 2
    lease_seconds: float = 5.0
    standby_probe_seconds: float = 10.0  # 0 = standbys are never probed
    failback: FailbackMode = FailbackMode.AUTOMATIC
    failback_stable_seconds: float = 30.0
    # How much longer than the lease the engine waits before it counts a silent
    # active as self-fenced: covers the broker's lease-check granularity and the
    # drift between its clock and ours. Not in the CRD; derived from the lease.
    lease_margin_seconds: float = 0.5

    def __post_init__(self) -> None:
        if self.interval_seconds <= 0:
            raise SettingsError(f"spec.heartbeat.intervalSeconds ({self.interval_seconds}) must be positive")
        if self.timeout_seconds <= 0:
            raise SettingsError(f"spec.heartbeat.timeoutSeconds ({self.timeout_seconds}) must be positive")
        if self.failure_threshold < 1:
            raise SettingsError(
                f"spec.heartbeat.failureThreshold ({self.failure_threshold}) must be at least 1"
            )
        if self.lease_seconds <= self.interval_seconds * self.failure_threshold:
            raise SettingsError(
                f"spec.heartbeat.leaseSeconds ({self.lease_seconds:g}) must exceed intervalSeconds"
                f" x failureThreshold ({self.interval_seconds * self.failure_threshold:g}),"
                " or the active fences itself during blips the operator is meant to ride out"
            )

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> HeartbeatSettings:
        """Settings from a BrokerCluster ``spec``, with the design's defaults for absent fields."""
        heartbeat = spec.get("heartbeat") or {}
        if not isinstance(heartbeat, Mapping):
            raise SettingsError(f"BrokerCluster spec.heartbeat must be an object, not {heartbeat!r}")
        defaults = cls()
        lease = _number(heartbeat, "leaseSeconds", defaults.lease_seconds, "spec.heartbeat")
        threshold = _number(heartbeat, "failureThreshold", defaults.failure_threshold, "spec.heartbeat")
        if threshold != int(threshold):
            raise SettingsError(f"spec.heartbeat.failureThreshold ({threshold:g}) must be a whole number")
        failback = spec.get("failback") or FailbackMode.AUTOMATIC.value
        try:
            mode = FailbackMode(failback)
        except ValueError:
            raise SettingsError(
                f"spec.failback ({failback!r}) must be one of {[m.value for m in FailbackMode]}"
            ) from None
        return cls(
            interval_seconds=_number(
                heartbeat, "intervalSeconds", defaults.interval_seconds, "spec.heartbeat"
            ),
            timeout_seconds=_number(heartbeat, "timeoutSeconds", defaults.timeout_seconds, "spec.heartbeat"),
            failure_threshold=int(threshold),
            lease_seconds=lease,
            standby_probe_seconds=_number(
                heartbeat, "standbyProbeSeconds", defaults.standby_probe_seconds, "spec.heartbeat"
            ),
            failback=mode,
            failback_stable_seconds=_number(
                spec, "failbackStableSeconds", defaults.failback_stable_seconds, "spec"
            ),
            lease_margin_seconds=max(0.25, 0.1 * lease),
        )

    @property
    def fence_seconds(self) -> float:
        """After this long without a possibly-received ``active=true``, a broker is surely inactive."""
        return self.lease_seconds + self.lease_margin_seconds
