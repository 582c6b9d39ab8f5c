"""Pod start as the kubelet saw it, read from its log (``--v=1``): the local cluster's figure.

A pod's start on the node runs from the kubelet's first line about it (it verifies and mounts the
pod's volumes before it asks containerd for the sandbox; at ``--v=1`` that is the first line) to
its ``Observed pod startup duration`` line's ``observedRunningTime``, when the kubelet saw every
container running: volumes, sandbox
(network namespace, CNI, pause), and the containers' create and start. The API's timestamps
cannot say this (whole seconds), and the kubelet's own ``podStartSLOduration`` counts from the
pod's creation, which includes the scheduler. Standard library only.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable
from pathlib import Path

# klog's header: severity, MMDD, time of day with microseconds.
HEADER = re.compile(r"^[IWEF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{6}) ")
OBSERVED = re.compile(
    r'"Observed pod startup duration" pod="(?P<pod>[^"]+)".*?'
    r'observedRunningTime="(?P<date>\d{4}-\d{2}-\d{2}) (?P<time>\d{2}:\d{2}:\d{2})(?:\.(?P<fraction>\d+))?'
)


def _line_time(line: str, year: int) -> dt.datetime | None:
    match = HEADER.match(line)
    if match is None:
        return None
    month, day, hour, minute, second, micro = (int(group) for group in match.groups())
    return dt.datetime(year, month, day, hour, minute, second, micro, tzinfo=dt.UTC)


# The kubelet's first step for a pod it admitted: verifying its volumes, one line per volume,
# which names the pod without its namespace.
ADMITTED = re.compile(r'VerifyControllerAttachedVolume started.* pod \\"(?P<name>[^\\"]+)\\"')


def pod_start_seconds(lines: Iterable[str]) -> dict[str, float]:
    """Per pod (``namespace/name``), seconds from the kubelet's first line about it to its
    containers observed running; pods the kubelet has not seen running, or that have no volume
    (no service-account token either), are left out.

    One pass in log order: a pod's name is taken as new again once it was observed running (the
    volume lines carry no namespace, and tests reuse names such as ``backend`` in each one)."""
    first_seen: dict[str, dt.datetime] = {}
    starts: dict[str, float] = {}
    year = dt.datetime.now(dt.UTC).year
    for line in lines:
        found = OBSERVED.search(line)
        if found is not None:
            fraction = (found["fraction"] or "0")[:6].ljust(6, "0")
            running = dt.datetime.fromisoformat(f"{found['date']}T{found['time']}.{fraction}+00:00")
            year = running.year
            pod = found["pod"]
            first = first_seen.pop(pod.split("/", 1)[-1], None)
            if first is not None and first <= running:
                starts[pod] = (running - first).total_seconds()
            continue
        admitted = ADMITTED.search(line)
        when = _line_time(line, year) if admitted else None
        if admitted and when:
            first_seen.setdefault(admitted["name"], when)
    return starts


def pod_starts(log: Path) -> dict[str, float]:
    return pod_start_seconds(log.read_text(errors="replace").splitlines()) if log.exists() else {}
