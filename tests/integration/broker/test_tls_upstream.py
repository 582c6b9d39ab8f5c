"""``https://`` backend and cloud URLs (real processes): verified against ``--upstream-ca-file``.

The simulators serve HTTPS (``--tls-dir``) with certificates of a CA of their own, naming their
loopback addresses. A broker given that CA activates and relays; one without it (the system's
trust store) refuses the targets' certificates, and says so in its heartbeat answer.
"""

from __future__ import annotations

import json
import ssl
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from broker_simulators.backend import build_envelope
from broker_simulators.local_processes import ProcessSet, RunningProcess, loopback_host
from local_cluster.broker_certificates import create_ca, tls_secret, write_secret_volume
from tests.integration.broker.helpers import heartbeat, post_bundle, wait_until
from tests.integration.broker.tls_helpers import readiness_ssl

pytestmark = pytest.mark.integration


def _get_json(target: RunningProcess, path: str, context: ssl.SSLContext) -> Any:
    with urllib.request.urlopen(target.url + path, timeout=10, context=context) as response:
        return json.load(response)


def test_https_targets_are_verified_against_the_upstream_ca_file_or_else_the_system_store(
    processes: ProcessSet, tmp_path: Path
) -> None:
    ca = create_ca(tmp_path / "pki", "targets")
    readiness = readiness_ssl(ca.cert)
    started: dict[str, RunningProcess] = {}
    for name in ("cloud", "backend"):
        host = loopback_host()
        files = ca.issue_server(name, [f"{name}.test"], ip_addresses=[host])
        tls_dir = tmp_path / f"{name}-tls"
        write_secret_volume(tls_dir, tls_secret(files, [ca.cert]))
        options: dict[str, Any] = {
            "host": host,
            "extra_args": ["--tls-dir", str(tls_dir)],
            "ready_context": readiness,
        }
        if name == "cloud":
            started[name] = processes.start_cloud_simulator(tmp_path, **options)
        else:
            started[name] = processes.start_backend_simulator(tmp_path, streams=0, **options)
    cloud, backend = started["cloud"], started["backend"]
    assert cloud.url.startswith("https://") and backend.url.startswith("https://")

    trusting = processes.start_broker(
        tmp_path,
        name="trusting",
        backend_url=backend.url,
        cloud_url=cloud.url,
        extra_args=["--upstream-ca-file", str(ca.cert)],
    )
    assert heartbeat(trusting, active=True, epoch=1).state == "Active"
    envelope = build_envelope("acme", "1000", [("orders-0000", 1, "m-1", "over https")])
    assert post_bundle(trusting.soap_url, envelope)[0] == 200
    trusted = ssl.create_default_context(cafile=str(ca.cert))
    wait_until(lambda: _get_json(cloud, "/sim/received", trusted).get("orders-0000") == [1], 20, 0.1)

    # The system's trust store does not hold the targets' CA: activation fails on the certificate,
    # with the reason in the answer the operator records.
    system = processes.start_broker(
        tmp_path, name="system-trust", backend_url=backend.url, cloud_url=cloud.url
    )
    reply = heartbeat(system, active=True, epoch=2)
    assert (reply.state, reply.unavailabilityCode) == ("Unavailable", "CLOUD_UNREACHABLE")
    assert "certificate verify failed" in reply.unavailabilityMessage, reply.unavailabilityMessage
