"""`make demo`, the README's first command: the user's path on the sealed local cluster.

Run as a user runs it (``python -m demo.kubernetes``, its own sealed cluster with a pod network),
smaller: it must install with helm, send through the ``orders-active`` Service (the brokers
calling both simulators over TLS, as the simulators count it), fail over after kill -9 with that
Service's EndpointSlice moving from the old active pod's address to the new one's, get the
validator's Passed verdict, copy the report out, exit 0, and leave no process of its cluster
behind.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from local_cluster.cluster import REPO_ROOT
from local_cluster.relay import BROKER_TLS
from tests.live_processes import processes_naming

pytestmark = [pytest.mark.e2e, pytest.mark.second_stream]  # its own cluster, beside the others


def test_make_demo_installs_fails_over_and_gets_the_validators_passed_verdict(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "demo.kubernetes", "--messages", "4000", "--report-dir", str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert "STATUS: deployed" in output  # helm install
    failover = re.search(r"failover: orders-0 -> orders-1 \(\w+, \d+ ms\), epoch 1 -> (\d+)", output)
    assert failover, output
    scheme = "https" if BROKER_TLS else "http"  # the backend -> broker leg follows relay.BROKER_TLS
    assert f"the backend sends to {scheme}://orders-active.demo.svc:8080" in output
    if BROKER_TLS:
        # The SAP admin's step: the real plugin exported the cluster's CA, and it is one.
        assert "$ kubectl broker ca orders -n demo --file" in output, output
        assert re.search(r"SHA-256:  ([0-9A-F]{2}:){31}[0-9A-F]{2}", output), output
        exported = (tmp_path / "orders-ca.pem").read_text()
        assert exported.startswith("-----BEGIN CERTIFICATE-----") and exported.count("BEGIN") == 1
    # The brokers called both simulators over TLS, as the simulators counted their calls.
    transports = re.search(r"the brokers' calls as the simulators took them, by transport: (.*)", output)
    assert transports and "TLSv1" in transports.group(1) and "plain" not in transports.group(1), output
    pod_ip = r"(10\.244\.0\.\d+)"
    moved = re.search(
        rf"Service orders-active: EndpointSlice {pod_ip} \(orders-0\) -> {pod_ip} \(orders-1\)", output
    )
    assert moved and moved.group(1) != moved.group(2), output
    assert '"result": "Passed", "violations": 0' in output
    assert result.stdout.rstrip().endswith("[demo] verdict: Passed"), result.stdout[-2000:]
    assert (tmp_path / "report.html").is_file() and (tmp_path / "report.json").is_file()
    work = re.search(r"cleaned up: cluster, pods, simulators and (\S+)", output)
    assert work, output
    assert not Path(work.group(1)).exists()
    assert processes_naming(work.group(1)) == []
