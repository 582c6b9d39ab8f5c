"""Pod start read from the kubelet's log: first volume check to containers observed running."""

from __future__ import annotations

import pytest

from local_cluster.kubelet_log import pod_start_seconds


def verify(time: str, pod: str) -> str:
    return (
        f'I1125 {time}     113 reconciler_common.go:251] "operationExecutor.VerifyControllerAttachedVolume'
        f' started for volume \\"kube-api-access-x\\" (UniqueName: \\"kubernetes.io/projected/u-x\\") pod'
        f' \\"{pod}\\" (UID: \\"u\\") " pod="ns/{pod}"'
    )


def observed(time: str, pod: str, running: str) -> str:
    return (
        f'I1125 {time}     113 pod_startup_latency_tracker.go:104] "Observed pod startup duration"'
        f' pod="{pod}" podStartSLOduration=2.5 podStartE2EDuration="2.5s"'
        f' podCreationTimestamp="2026-11-25 22:56:54 +0000 UTC"'
        f' observedRunningTime="2026-11-25 {running} +0000 UTC m=+4.6"'
    )


def test_start_runs_from_the_first_volume_line_to_the_observed_running_time() -> None:
    lines = [
        verify("22:56:55.012823", "coredns-1"),
        verify("22:56:55.012877", "coredns-1"),  # a second volume: the first line counts
        'I1125 22:56:56.508177     113 kubelet.go:2643] "SyncLoop (probe)" pod="kube-system/coredns-1"',
        observed("22:56:56.559827", "kube-system/coredns-1", "22:56:56.410327003"),
    ]
    assert pod_start_seconds(lines) == {"kube-system/coredns-1": pytest.approx(1.397504)}


def test_a_name_reused_in_another_namespace_starts_afresh_and_later_lines_of_the_old_pod_do_not_count() -> (
    None
):
    lines = [
        verify("10:00:00.000000", "cloud"),
        observed("10:00:01.000000", "first/cloud", "10:00:00.500000"),
        'I1125 10:00:20.000000 1 prober.go:120] "Probe failed" pod="first/cloud" podUID="u"',
        verify("10:00:30.000000", "cloud"),
        observed("10:00:32.000000", "second/cloud", "10:00:31.250000"),
    ]
    assert pod_start_seconds(lines) == {"first/cloud": 0.5, "second/cloud": 1.25}


def test_a_pod_never_seen_running_or_without_volumes_is_left_out() -> None:
    lines = [verify("10:00:00.000000", "stuck"), observed("10:00:01.000000", "ns/novolumes", "10:00:00.9")]
    assert pod_start_seconds(lines) == {}
