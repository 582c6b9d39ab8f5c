"""TLS on every channel, as users run it on the sealed local cluster (issue 41's tests).

One relay for the module (``local_cluster.relay``, TLS on every leg as by default: the chart's
operator as a pod, with ``operator.brokerTls`` true; the backend simulator sending to
``https://orders-active.<ns>.svc:8080`` verified against the cluster's CA; the brokers calling
both simulators over verified TLS), with the ``-active`` Service a NodePort
(``spec.activeService``) and short-lived certificates (``validityDays: 2, renewBeforeDays: 1``),
so that a renewal can be made due. The tests run in file order; the kill -9 comes last.

- ``openssl s_client`` (the real CLI, in the cluster's network namespace) against the ``-active``
  Service: the chain verifies with the CA that ``kubectl broker ca`` (the real plugin) exports,
  under ``orders-active.<ns>.svc.cluster.local``; another CA and another name are refused with
  openssl's own words. The admin port refuses a client with no certificate and takes the
  operator's.
- Plain HTTP to the main and the admin port of a TLS broker gets no HTTP response, and no
  credential sent that way reaches the broker's credential check (``broker_auth_failures_total``
  and the accepted count stay; the same request over TLS moves the first).
- Rotation under load: the backend sends and the operator heartbeats while the serving leaf is
  aged into its renewal window (a certificate from the cluster's own CA with 12 hours left, written
  into ``orders-tls``), the operator renews it, and every broker serves the new serial on both
  listeners: no failed request, no failover, no new epoch, nothing lost, taken twice or reordered.
- An expired server certificate (mode Secrets, a user Secret holding one) is refused by
  ``openssl s_client`` with "certificate has expired", and by nothing else (the same chain
  verifies with ``-no_check_time``).
- The NodePort: reached at the node's address over TLS (verified under the Service's DNS name),
  it follows a kill -9 failover to the new active, and a deleted Service comes back as a NodePort
  on the same port.

Waits are bounded failure limits, not performance assertions; the failover time through the node
port is printed, not asserted.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from broker_operator.controller import names, verifiers
from broker_operator.controller.spec import parse_spec
from broker_operator.pki import KeyPair, certificate_info, issue_client, issue_server, new_ca
from local_cluster.broker_pod_calls import pod_call, secret_bytes, serving_ca
from local_cluster.relay import CLUSTER_NAME, Relay
from local_cluster.relay_tls import SIMULATORS_CA_SECRET, service_context
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import relay_in_new_namespace, traffic_undisturbed, wait_for
from tests.e2e.test_kubectl_plugin import plugin
from tests.e2e.test_tls_and_active_service_crd import free_node_port, node_address
from tests.e2e.test_tls_broker_pod import CLUSTER as BROKER_POD_CLUSTER
from tests.e2e.test_tls_broker_pod import broker_pod, secret

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

MAIN_PORT, ADMIN_PORT = 8080, 8081
BROKERS = (f"{CLUSTER_NAME}-0", f"{CLUSTER_NAME}-1")
LIFETIMES = {"validityDays": 2, "renewBeforeDays": 1}


@pytest.fixture(scope="module")
def node_port(sealed_cluster: SealedCluster) -> int:
    return free_node_port(sealed_cluster, "")


@pytest.fixture(scope="module")
def relay(sealed_cluster: SealedCluster, node_port: int) -> Iterator[Relay]:
    spec = {
        "failback": "Manual",  # the kill -9 test's new active stays while it looks
        "activeService": {"type": "NodePort", "nodePort": node_port},
        # The relay's tls (the simulators' CA) with short lifetimes, so a renewal can fall due.
        "tls": {"upstreamCASecretRef": {"name": SIMULATORS_CA_SECRET}, "certificates": LIFETIMES},
    }
    with relay_in_new_namespace(
        sealed_cluster, "tlsch", streams=2, messages_per_stream=10, spec=spec
    ) as relay:
        yield relay


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory both this process and the cluster's mount namespace see (the test's tmp)."""
    return tmp_path_factory.mktemp("tls-channels")


def active_service_name(relay: Relay) -> str:
    return f"{CLUSTER_NAME}-active.{relay.namespace}.svc.cluster.local"


def s_client(cluster: SealedCluster, address: str, port: int, *args: str, send: str = "") -> tuple[int, str]:
    """``openssl s_client`` to ``address:port`` from the cluster's network namespace, sending
    ``send`` and waiting for the server to close (``-ign_eof``); its exit status and everything
    it printed. ``-verify_return_error``: a chain that does not verify ends the handshake."""
    argv = ["openssl", "s_client", "-connect", f"{address}:{port}", "-verify_return_error", "-ign_eof"]
    result = subprocess.run(
        cluster.node_command([*argv, *args]),
        input=send, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    output = result.stdout + result.stderr
    print(f"$ {' '.join(argv + list(args))}  (exit {result.returncode})\n{output[-3000:]}")
    return result.returncode, output


HEALTHZ = "GET /healthz HTTP/1.1\r\nHost: broker\r\nConnection: close\r\n\r\n"


def cluster_ip(relay: Relay, service: str) -> str:
    return str(relay.get("service", service)["spec"]["clusterIP"])


def exported_ca(relay: Relay, files: Path) -> Path:
    """``kubectl broker ca orders`` (the real plugin, through kubectl), written where openssl reads it."""
    result = plugin(relay.cluster, "ca", CLUSTER_NAME, "-n", relay.namespace)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("-----BEGIN CERTIFICATE-----"), result.stdout
    path = files / "exported-ca.pem"
    path.write_text(result.stdout)
    return path


def test_openssl_verifies_the_active_service_with_the_exported_ca_and_refuses_others(
    relay: Relay, files: Path
) -> None:
    ca = exported_ca(relay, files)
    assert ca.read_bytes() == serving_ca(relay.cluster, relay.namespace, CLUSTER_NAME)
    name = active_service_name(relay)
    address = cluster_ip(relay, f"{CLUSTER_NAME}-active")
    verified = ("-CAfile", str(ca), "-servername", name, "-verify_hostname", name)

    code, output = s_client(relay.cluster, address, MAIN_PORT, *verified, send=HEALTHZ)
    assert code == 0 and "Verify return code: 0 (ok)" in output, output
    assert "HTTP/1.1 200" in output, output

    # Another CA (the simulators', a real CA of this run): the chain does not verify.
    other_ca = files / "simulators-ca.pem"
    other_ca.write_bytes(relay.simulators_ca or b"")
    code, output = s_client(
        relay.cluster,
        address,
        MAIN_PORT,
        "-CAfile",
        str(other_ca),
        "-servername",
        name,
        "-verify_hostname",
        name,
    )
    assert code != 0 and "unable to get local issuer certificate" in output, output
    assert "HTTP/1.1" not in output

    # The right CA, another name: refused for the name.
    wrong = f"{CLUSTER_NAME}-active.elsewhere.svc.cluster.local"
    code, output = s_client(
        relay.cluster, address, MAIN_PORT, "-CAfile", str(ca), "-servername", wrong, "-verify_hostname", wrong
    )
    assert code != 0 and "hostname mismatch" in output, output


def test_the_admin_port_refuses_a_client_without_a_certificate_and_takes_the_operators(
    relay: Relay, files: Path
) -> None:
    ca = files / "ca.pem"
    ca.write_bytes(serving_ca(relay.cluster, relay.namespace, CLUSTER_NAME))
    active = relay.pod(str(relay.status()["active"]))
    address = active["status"]["podIP"]
    name = f"{active['spec']['hostname']}.{active['spec']['subdomain']}.{relay.namespace}.svc.cluster.local"
    verified = ("-CAfile", str(ca), "-servername", name, "-verify_hostname", name)

    # No client certificate: the broker's chain verified (so trust is not what fails), and the
    # request never answered. TLS 1.3 ends the handshake on the client's side before the server
    # has judged its (empty) certificate, so the refusal is a close or an alert after it.
    code, output = s_client(relay.cluster, address, ADMIN_PORT, *verified, send=HEALTHZ)
    assert "Verify return code: 0 (ok)" in output and "HTTP/1." not in output, output
    # The same from Python's ssl, as any client would meet it: an error, never a response.
    bare = pod_call(relay.cluster, active, ADMIN_PORT, "/healthz")
    with pytest.raises(OSError) as refused:
        relay.cluster.call_in_network(bare)
    print(f"admin port without a client certificate: {refused.value!r}")

    # The operator's own client certificate (<name>-operator-client, which the operator and the
    # kubectl broker held users read): the handshake completes and the admin port answers HTTP.
    cert, key = files / "operator.crt", files / "operator.key"
    client_secret = f"{CLUSTER_NAME}-operator-client"
    cert.write_bytes(secret_bytes(relay.cluster, relay.namespace, client_secret, "tls.crt"))
    key.write_bytes(secret_bytes(relay.cluster, relay.namespace, client_secret, "tls.key"))
    key.chmod(0o600)
    code, output = s_client(
        relay.cluster, address, ADMIN_PORT, *verified, "-cert", str(cert), "-key", str(key), send=HEALTHZ
    )
    assert code == 0 and "Verify return code: 0 (ok)" in output, output
    assert "HTTP/1.1 " in output, output


# ---- plain HTTP to a TLS listener ------------------------------------------------------------


def metric_samples(relay: Relay, broker: str, *prefixes: str) -> dict[str, float]:
    """The broker's own samples whose names start with one of ``prefixes`` (over TLS, verified)."""
    text = relay.cluster.call_in_network(pod_call(relay.cluster, relay.pod(broker), MAIN_PORT, "/metrics"))
    samples = (line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {name: float(value) for name, value in samples if name.startswith(prefixes)}


def plain_request(relay: Relay, address: str, port: int, token: str) -> bytes:
    """A plain-HTTP SOAP POST with ``token`` as its bearer credential; every byte the listener
    sent back before it closed (or stopped answering for 5 s)."""
    body = (
        b'<?xml version="1.0"?><Envelope xmlns="http://schemas.xmlsoap.org/soap/envelope/"><Body/></Envelope>'
    )
    request = (
        f"POST /soap HTTP/1.1\r\nHost: {address}\r\nContent-Type: text/xml; charset=utf-8\r\n"
        f"Authorization: Bearer {token}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body

    def call() -> bytes:
        received = b""
        with socket.create_connection((address, port), timeout=5) as connection:
            connection.sendall(request)
            try:
                while chunk := connection.recv(4096):
                    received += chunk
            except OSError:
                pass  # a reset or the 5 s without a byte: nothing more is coming
        return received

    return bytes(relay.cluster.call_in_network(call, timeout=30))


def test_plain_http_gets_no_http_answer_and_no_credential_is_taken_over_it(relay: Relay) -> None:
    active_name = str(relay.status()["active"])
    active = relay.pod(active_name)
    watched = ("broker_auth_failures", "broker_messages_accepted_total", "broker_messages_duplicate")
    backend_token = secret_bytes(relay.cluster, relay.namespace, "erp-broker-credential", "token").decode()
    operator_token = secret_bytes(relay.cluster, relay.namespace, f"{CLUSTER_NAME}-broker-token", "token")
    before = metric_samples(relay, active_name, *watched)

    targets = [
        (cluster_ip(relay, f"{CLUSTER_NAME}-active"), MAIN_PORT, backend_token),  # the Service
        (active["status"]["podIP"], ADMIN_PORT, operator_token.decode().strip()),  # the admin port
    ]
    for address, port, token in targets:
        for credential in (token, "not-the-token-" + uuid.uuid4().hex):
            answer = plain_request(relay, address, port, credential)
            # Nothing HTTP: at most a TLS alert record (content type 21) before the close.
            assert not answer.startswith(b"HTTP/"), (address, port, answer[:200])
            assert answer == b"" or answer[0] == 0x15, (address, port, answer[:200])
    assert metric_samples(relay, active_name, *watched) == before  # never reached a credential check

    # The control: the same wrong credential over TLS reaches the check and is counted.
    wrong = pod_call(
        relay.cluster, active, MAIN_PORT, "/soap", data=b"<x/>",
        headers={"Authorization": "Bearer not-the-token", "Content-Type": "text/xml"},
    )  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as refused:  # 401, or a SOAP fault
        relay.cluster.call_in_network(wrong)
    print(f"over TLS, a wrong token: {refused.value!r}")
    after = metric_samples(relay, active_name, *watched)
    failures = sum(v for k, v in after.items() if k.startswith("broker_auth_failures_total"))
    assert failures == sum(v for k, v in before.items() if k.startswith("broker_auth_failures_total")) + 1


# ---- rotation under load --------------------------------------------------------------------


def serial_of(relay: Relay, secret_name: str) -> str:
    return certificate_info(secret_bytes(relay.cluster, relay.namespace, secret_name, "tls.crt")).serial


def same_serial(a: str, b: str) -> bool:
    """Serials compared as numbers: the broker's metric labels them as OpenSSL prints them
    (upper-case, two digits an octet), ``certificate_info`` in lower case without padding."""
    return int(a, 16) == int(b, 16)


def serves(relay: Relay, broker: str, serial: str) -> bool:
    """Both listeners of ``broker`` serve ``serial`` to new connections (its own gauge)."""
    try:
        samples = metric_samples(relay, broker, "broker_tls_serving_certificate")
    except OSError:
        return False
    served = {}
    for name, value in samples.items():
        labels = dict(part.split("=", 1) for part in name[name.index("{") + 1 : -1].split(","))
        if value == 1:
            served[labels["listener"].strip('"')] = labels["serial"].strip('"')
    return all(same_serial(served.get(listener, "-1"), serial) for listener in ("main", "admin"))


def served_serials(relay: Relay) -> bool:
    """Print what each broker serves (for a failure's output); always False, to keep waiting."""
    for broker in BROKERS:
        try:
            print(
                broker, metric_samples(relay, broker, "broker_tls_serving_certificate", "broker_tls_reload")
            )
        except OSError as error:
            print(broker, repr(error))
    return False


def test_a_leaf_renewed_under_load_is_served_with_no_failed_request_failover_or_epoch(relay: Relay) -> None:
    with traffic_undisturbed(relay, "the rotation"):
        original = serial_of(relay, f"{CLUSTER_NAME}-tls")
        # The Secret's files reach a running broker through the kubelet's sync and the broker's
        # reload (10 s each here): a Secret written after a pod started is served a little later.
        wait_for(
            f"every broker serving the Secret's serial {original}",
            lambda: all(serves(relay, broker, original) for broker in BROKERS) or served_serials(relay),
            timeout=60,
        )
        assert all(serves(relay, broker, original) for broker in BROKERS), served_serials(relay)

        # A server certificate as the operator would have issued it 36 hours ago, from the
        # cluster's own CA: 12 hours left, inside renewBeforeDays. The brokers may serve it a
        # moment; the operator must renew it.
        ca = KeyPair(
            secret_bytes(relay.cluster, relay.namespace, f"{CLUSTER_NAME}-ca", "ca.crt"),
            secret_bytes(relay.cluster, relay.namespace, f"{CLUSTER_NAME}-ca", "ca.key"),
        )
        dns = certificate_info(
            secret_bytes(relay.cluster, relay.namespace, f"{CLUSTER_NAME}-tls", "tls.crt")
        ).dns_names
        aged = issue_server(ca, dns, days=2, now=datetime.now(UTC) - timedelta(hours=36))
        patch = {
            "data": {
                "tls.crt": base64.b64encode(aged.certificate_pem).decode(),
                "tls.key": base64.b64encode(aged.key_pem).decode(),
            }
        }
        relay.cluster.kubectl(
            "-n",
            relay.namespace,
            "patch",
            "secret",
            f"{CLUSTER_NAME}-tls",
            "--type=merge",
            "-p",
            json.dumps(patch),
        )
        renewed = wait_for(
            "the operator's renewal of the aged leaf",
            lambda: (
                (s := serial_of(relay, f"{CLUSTER_NAME}-tls")) not in (original, aged.info().serial) and s
            ),
            timeout=240,
            interval=1,
        )
        started = time.monotonic()
        wait_for(
            f"every broker serving serial {renewed} on both listeners",
            lambda: all(serves(relay, broker, renewed) for broker in BROKERS),
            timeout=180,
            interval=1,
        )
        print(
            f"renewed serial {renewed} served by every broker "
            f"{time.monotonic() - started:.1f}s after the operator wrote it"
        )


# ---- an expired server certificate -----------------------------------------------------------


def test_an_expired_server_certificate_is_refused_by_openssl(relay: Relay, files: Path) -> None:
    now = datetime.now(UTC)
    ca = new_ca("expired-test-ca", days=30, now=now - timedelta(days=10))
    server_name = "expired-0.example.test"
    expired = issue_server(ca, [server_name], days=2, now=now - timedelta(days=5))
    assert expired.info().not_after < now
    client = issue_client(ca, "broker-failover-operator", days=30, now=now)
    cluster = BROKER_POD_CLUSTER  # the name tests.e2e.test_tls_broker_pod.broker_pod builds with
    spec = parse_spec(
        cluster,
        {
            "account": "acme",
            "company": "1000",
            "backend": {"url": "http://backend.invalid:9"},
            "cloud": {"url": "http://cloud.invalid:9"},
            "tls": {
                "mode": "Secrets",
                "secrets": {"server": "expired-tls", "operatorClient": "expired-operator"},
            },
        },
    )
    namespace = relay.namespace
    objects = [
        secret(
            namespace,
            "expired-tls",
            {"tls.crt": expired.certificate_pem, "tls.key": expired.key_pem, "ca.crt": ca.certificate_pem},
        ),
        secret(
            namespace,
            "expired-operator",
            {"tls.crt": client.certificate_pem, "tls.key": client.key_pem, "ca.crt": ca.certificate_pem},
        ),
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": names.verifier_secret_name(cluster), "namespace": namespace},
            "stringData": verifiers.verifier_data("o" * 32, "b" * 32),
        },
        *broker_pod(namespace, "expired-0", spec),
    ]
    relay.cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    )
    try:
        ready = wait_for(
            "expired-0 Ready (the kubelet's HTTPS probe verifies nothing)",
            lambda: relay.pod_ready("expired-0"),
            120,
        )
        assert ready
        address = relay.pod("expired-0")["status"]["podIP"]
        ca_file = files / "expired-test-ca.pem"
        ca_file.write_bytes(ca.certificate_pem)
        verified = ("-CAfile", str(ca_file), "-servername", server_name, "-verify_hostname", server_name)
        code, output = s_client(relay.cluster, address, MAIN_PORT, *verified, send=HEALTHZ)
        assert code != 0 and "certificate has expired" in output, output
        assert "HTTP/1.1" not in output
        # The same chain and name with the time check off verify: expiry is the one thing wrong.
        code, output = s_client(relay.cluster, address, MAIN_PORT, *verified, "-no_check_time", send=HEALTHZ)
        assert code == 0 and "HTTP/1.1 200" in output, output
    finally:
        relay.cluster.kubectl("-n", namespace, "delete", "pod", "expired-0", "--wait=false", check=False)


# ---- the -active Service as a NodePort -------------------------------------------------------


def node_port_metrics(relay: Relay, context: ssl.SSLContext, url: str) -> dict[str, float] | None:
    """``broker_active`` and ``broker_epoch`` of whichever broker answers ``url`` over verified TLS."""

    def call() -> str:
        with urllib.request.urlopen(url, timeout=2, context=context) as reply:
            return str(reply.read().decode())

    try:
        text = relay.cluster.call_in_network(call, timeout=20)
    except OSError:
        return None
    samples = (line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {name: float(value) for name, value in samples if name in ("broker_active", "broker_epoch")}


def test_the_node_port_serves_tls_follows_a_kill_9_failover_and_comes_back_as_a_node_port(
    relay: Relay, node_port: int
) -> None:
    service = relay.get("service", f"{CLUSTER_NAME}-active")
    assert service["spec"]["type"] == "NodePort" and service["spec"]["ports"][0]["nodePort"] == node_port
    context = service_context(
        serving_ca(relay.cluster, relay.namespace, CLUSTER_NAME), active_service_name(relay)
    )
    url = f"https://{node_address(relay.cluster)}:{node_port}/metrics"
    status = relay.status()
    active, epoch = str(status["active"]), int(status["epoch"])
    first = wait_for("the node port answering over TLS", lambda: node_port_metrics(relay, context, url), 60)
    assert first == {"broker_active": 1.0, "broker_epoch": float(epoch)}, first

    relay.backend("/sim/produce", {"count": 50})
    killed = time.monotonic()
    relay.kill_9(active)
    after = wait_for(
        "a failover to the other broker",
        lambda: (s := relay.status()).get("active") not in (None, active) and s,
        timeout=90,
        interval=0.1,
    )
    new_epoch = int(after["epoch"])
    assert new_epoch > epoch
    wait_for(
        "the node port reaching the new active (Active, at the new epoch)",
        lambda: (
            node_port_metrics(relay, context, url) == {"broker_active": 1.0, "broker_epoch": float(new_epoch)}
        ),
        timeout=60,
        interval=0.05,
    )
    took = time.monotonic() - killed
    print(
        f"kill -9 of {active} to the node port answering from {after['active']} over TLS: "
        f"{took * 1000:.0f} ms "
        f"(status.lastFailover.durationMs {after.get('lastFailover', {}).get('durationMs')})"
    )

    uid = relay.get("service", f"{CLUSTER_NAME}-active")["metadata"]["uid"]
    relay.cluster.kubectl("-n", relay.namespace, "delete", "service", f"{CLUSTER_NAME}-active")
    remade = wait_for(
        "the -active Service made again",
        lambda: (s := relay.get("service", f"{CLUSTER_NAME}-active")) and s["metadata"]["uid"] != uid and s,
        timeout=60,
    )
    assert remade["spec"]["type"] == "NodePort" and remade["spec"]["ports"][0]["nodePort"] == node_port
    wait_for(
        "the node port answering again over TLS",
        lambda: (
            node_port_metrics(relay, context, url) == {"broker_active": 1.0, "broker_epoch": float(new_epoch)}
        ),
        timeout=60,
    )
    relay.wait_all_confirmed()
    assert relay.record_violations() == {"lost": 0, "twice": 0, "out-of-order": 0}
