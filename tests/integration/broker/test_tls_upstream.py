"""``https://`` backend and cloud URLs (real processes): verified against ``--upstream-ca-file``.

The simulators serve HTTPS (``--tls-dir``) with certificates of a CA of their own, naming their
loopback addresses. A broker given that CA activates and relays; one without it (the system's
trust store) refuses the targets' certificates, and says so in its heartbeat answer. And a broker
whose ``--upstream-ca-file`` gains the CA of a target's reissued certificate takes it up within a
check interval, with no restart and with its listeners on plain HTTP.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from broker_contracts.tls import TLS_CA_FILE
from broker_simulators.backend import build_envelope
from broker_simulators.local_processes import ProcessSet, RunningProcess, loopback_host
from local_cluster.broker_certificates import create_ca, tls_secret, write_secret_volume
from tests.integration.broker.helpers import get_text, heartbeat, post_bundle, wait_until
from tests.integration.broker.tls_helpers import readiness_ssl, sample

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


def _upstream_counts(broker: RunningProcess) -> tuple[float, float]:
    """``broker_tls_reloads_total`` and ``broker_tls_reload_failures_total`` for ``upstream``."""
    status, text = get_text(broker.url + "/metrics")
    assert status == 200, text[:300]
    return (
        sample(text, 'broker_tls_reloads_total{listener="upstream"}'),
        sample(text, 'broker_tls_reload_failures_total{listener="upstream"}'),
    )


def test_a_ca_added_to_the_upstream_ca_file_is_followed_without_a_restart(
    processes: ProcessSet, tmp_path: Path
) -> None:
    old_ca = create_ca(tmp_path / "old-pki", "targets-old")
    new_ca = create_ca(tmp_path / "new-pki", "targets-new")
    # The cloud's certificate is already reissued from the new CA; the broker trusts the old one only.
    host = loopback_host()
    tls_dir = tmp_path / "cloud-tls"
    write_secret_volume(
        tls_dir, tls_secret(new_ca.issue_server("cloud", ["cloud.test"], ip_addresses=[host]), [new_ca.cert])
    )
    cloud = processes.start_cloud_simulator(
        tmp_path, host=host, extra_args=["--tls-dir", str(tls_dir)], ready_context=readiness_ssl(new_ca.cert)
    )
    backend = processes.start_backend_simulator(tmp_path, streams=0)
    upstream = tmp_path / "upstream-ca"  # a Secret volume, updated as the kubelet does
    write_secret_volume(upstream, {TLS_CA_FILE: old_ca.cert.read_bytes()})
    broker = processes.start_broker(
        tmp_path,
        backend_url=backend.url,
        cloud_url=cloud.url,
        # No --tls-dir: the broker's own listeners serve plain HTTP, and the bundle is followed anyway.
        extra_args=["--upstream-ca-file", str(upstream / TLS_CA_FILE), "--tls-reload-seconds", "0.2"],
    )
    pid = broker.pid

    reply = heartbeat(broker, active=True, epoch=1)
    assert (reply.state, reply.unavailabilityCode) == ("Unavailable", "CLOUD_UNREACHABLE")
    assert "certificate verify failed" in reply.unavailabilityMessage, reply.unavailabilityMessage
    time.sleep(0.6)  # checks of a file that did not change: nothing is taken, still refused
    assert heartbeat(broker, active=True, epoch=1).state == "Unavailable"
    assert _upstream_counts(broker) == (0, 0)

    # Both CAs, as during a CA replacement; one check later the new trust is used, same process.
    write_secret_volume(upstream, {TLS_CA_FILE: old_ca.cert.read_bytes() + new_ca.cert.read_bytes()})
    wait_until(lambda: _upstream_counts(broker) == (1, 0), 10, 0.1, "the upstream bundle to be reloaded")
    assert heartbeat(broker, active=True, epoch=1).state == "Active"
    envelope = build_envelope("acme", "1000", [("orders-0000", 1, "m-1", "over the new trust")])
    assert post_bundle(broker.soap_url, envelope)[0] == 200
    trusted = ssl.create_default_context(cafile=str(new_ca.cert))
    wait_until(lambda: _get_json(cloud, "/sim/received", trusted).get("orders-0000") == [1], 20, 0.1)

    # A half-written bundle later: counted, logged once, and the trust in use stays.
    write_secret_volume(upstream, {TLS_CA_FILE: new_ca.cert.read_bytes()[:200]})
    wait_until(lambda: _upstream_counts(broker) == (1, 1), 10, 0.1, "the broken bundle to be refused")
    assert heartbeat(broker, active=True, epoch=1).state == "Active"
    assert broker.pid == pid and broker.popen.poll() is None
    assert broker.log_text().count("upstream: the TLS files cannot be loaded") == 1
