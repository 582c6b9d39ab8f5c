"""The operator issues, renews and reports certificates, on a real kube-apiserver (issue 41).

The lightest fixture that runs the real operator against a real API server: etcd, kube-apiserver
and kube-controller-manager on loopback (``control_plane_only``; no kubelet: pods are objects
nothing runs, which is all the certificates need), and ``python -m broker_operator`` as its own
process watching one namespace, re-reading the certificate Secrets every second
(``--certificates-recheck-seconds 1``) so that changes made here are seen at once.

- mode Operator: ``<name>-ca``, ``<name>-tls`` and ``<name>-operator-client`` appear with a
  controller reference and the ownership label; the server certificate carries
  ``<name>-active.<ns>.svc.cluster.local`` and ``openssl verify`` (the real CLI) accepts it, and
  the operator's client certificate, against ``ca.crt``; ``status.tls`` names the serials openssl
  prints; passes with nothing due write nothing.
- a ``<name>-tls`` the operator does not own is never overwritten, and the condition says so.
- mode Secrets: the user's Secret is never written (its resourceVersion stays), a missing key is
  named in the condition, and a certificate ending within 14 days is ``ExpiringSoon`` with a
  Warning event.
- short-lived certificates (``validityDays: 2, renewBeforeDays: 1``): a server certificate issued
  36 hours ago (the test writes one, from the cluster's own CA, into ``<name>-tls``, as the operator
  would have a day and a half earlier) is renewed: a ``CertificateRenewed`` event with the reason,
  a new serial in ``status.tls``. The clock is real; the certificate's history is what is made up.
- two replicas' first passes at once (in-process, two API clients): one CA in the end, and the
  renewal's update conditional on the resourceVersion (the real API server's 409).

Waits are bounded failure limits, not performance assertions.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kopf
import pytest

from broker_operator.controller import names
from broker_operator.controller import tls_secrets as shapes
from broker_operator.controller.certificates import ensure_certificates
from broker_operator.controller.context import ControllerContext
from broker_operator.controller.kube import KubeApi
from broker_operator.controller.reconcile import ClusterRef
from broker_operator.controller.settings import ControllerSettings
from broker_operator.controller.spec import parse_spec
from broker_operator.pki import KeyPair, certificate_info, issue_client, issue_server, new_ca, verifies
from local_cluster.cluster import REPO_ROOT
from local_cluster.processes import ManagedProcess
from tests.e2e.support import PlaneAccess, control_plane_only, wait_for
from tests.e2e.test_operator import broker_cluster, new_namespace

pytestmark = pytest.mark.e2e

OPT_IN = {names.LABEL_CREDENTIAL: names.CREDENTIAL_OPT_IN}


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlaneAccess]:
    with control_plane_only(
        tmp_path_factory.mktemp("certificates"), ("broker.failover.dev_brokerclusters.yaml",)
    ) as access:
        yield access


@pytest.fixture(scope="module")
def namespace(plane: PlaneAccess) -> str:
    return new_namespace(plane, "certs")


@pytest.fixture(scope="module")
def operator(
    plane: PlaneAccess, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ManagedProcess]:
    argv = [sys.executable, "-m", "broker_operator", "--namespace", namespace, "--metrics-port", "0"]
    argv += ["--reconcile-seconds", "1", "--certificates-recheck-seconds", "1", "--operator-id", "e2e-certs"]
    env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig), "PYTHONUNBUFFERED": "1"}
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    process = ManagedProcess("operator", argv, log_path=log, env=env, cwd=REPO_ROOT)
    try:
        yield process
    finally:
        process.stop()
        print(process.log_tail(80))  # shown by pytest on failure


def apply(plane: PlaneAccess, namespace: str, manifest: dict[str, Any]) -> None:
    plane.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(manifest))


def secret(plane: PlaneAccess, namespace: str, name: str) -> dict[str, Any] | None:
    found = plane.get_json(namespace, "secret", name)
    return found if isinstance(found, dict) else None


def data_of(found: dict[str, Any]) -> dict[str, bytes]:
    return {key: base64.b64decode(value) for key, value in (found.get("data") or {}).items()}


def condition(plane: PlaneAccess, namespace: str, cluster: str) -> dict[str, Any]:
    status = (plane.get_json(namespace, "brokercluster", cluster) or {}).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == "CertificatesValid"), {})


def status_tls(plane: PlaneAccess, namespace: str, cluster: str) -> dict[str, Any]:
    status = (plane.get_json(namespace, "brokercluster", cluster) or {}).get("status") or {}
    return dict(status.get("tls") or {})


def events(plane: PlaneAccess, namespace: str, cluster: str, reason: str) -> list[dict[str, Any]]:
    listed = plane.get_json(namespace, "events") or {}
    return [
        e
        for e in listed.get("items") or []
        if e.get("involvedObject", {}).get("name") == cluster and e.get("reason") == reason
    ]


def openssl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=30, check=False)


def user_tls_secret(name: str, data: dict[str, bytes]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": name, "labels": OPT_IN},
        "data": {key: base64.b64encode(value).decode() for key, value in data.items()},
    }


def versions_stay(plane: PlaneAccess, namespace: str, *secrets: str, seconds: float = 4.0) -> None:
    """Several recheck passes (1 s each) go by without any of ``secrets`` being written."""
    before = {name: (secret(plane, namespace, name) or {})["metadata"]["resourceVersion"] for name in secrets}
    time.sleep(seconds)
    after = {name: (secret(plane, namespace, name) or {})["metadata"]["resourceVersion"] for name in secrets}
    assert after == before


def test_mode_operator_issues_owned_secrets_that_openssl_verifies(
    plane: PlaneAccess, namespace: str, operator: ManagedProcess, tmp_path: Path
) -> None:
    apply(plane, namespace, broker_cluster("orders", replicas=2))
    ca_found = wait_for("orders-ca", lambda: secret(plane, namespace, "orders-ca"))
    tls_found = wait_for("orders-tls", lambda: secret(plane, namespace, "orders-tls"))
    client_name = "orders-operator-client"
    client_found = wait_for(client_name, lambda: secret(plane, namespace, client_name))
    uid = plane.get_json(namespace, "brokercluster", "orders")["metadata"]["uid"]
    assert (ca_found["type"], tls_found["type"]) == ("Opaque", "kubernetes.io/tls")
    assert client_found["type"] == "kubernetes.io/tls" and set(ca_found["data"]) == {"ca.crt", "ca.key"}
    for found in (ca_found, tls_found, client_found):
        assert found["metadata"]["labels"][shapes.LABEL_CERTIFICATES_OWNER] == uid
        (reference,) = found["metadata"]["ownerReferences"]
        assert (reference["kind"], reference["name"], reference["uid"]) == ("BrokerCluster", "orders", uid)
        assert reference["controller"] is True
    files = {}
    for key, value in {**data_of(tls_found), "client.crt": data_of(client_found)["tls.crt"]}.items():
        files[key] = tmp_path / key
        files[key].write_bytes(value)
    active = f"orders-active.{namespace}.svc.cluster.local"
    sans = openssl("x509", "-in", str(files["tls.crt"]), "-noout", "-ext", "subjectAltName").stdout
    assert f"DNS:{active}" in sans and f"DNS:orders-1.orders-brokers.{namespace}.svc.cluster.local" in sans
    verified = openssl("verify", "-CAfile", str(files["ca.crt"]), str(files["tls.crt"]))
    assert verified.returncode == 0 and "tls.crt: OK" in verified.stdout, verified.stderr
    named = openssl(
        "verify", "-CAfile", str(files["ca.crt"]), "-purpose", "sslserver", "-verify_hostname", active,
        str(files["tls.crt"]),
    )  # fmt: skip
    assert named.returncode == 0, named.stderr
    client = openssl(
        "verify", "-CAfile", str(files["ca.crt"]), "-purpose", "sslclient", str(files["client.crt"])
    )
    assert client.returncode == 0, client.stderr
    assert "PRIVATE KEY" in data_of(ca_found)["ca.key"].decode()  # the CA key stays in <name>-ca only
    assert "ca.key" not in tls_found["data"] and "ca.key" not in client_found["data"]

    def reported() -> list[dict[str, Any]]:
        return list(status_tls(plane, namespace, "orders").get("certificates") or [])

    wait_for("status.tls.certificates", lambda: len(reported()) == 3)
    by_name = {entry["name"]: entry for entry in reported()}
    serial = openssl("x509", "-in", str(files["tls.crt"]), "-noout", "-serial").stdout.strip()
    assert serial.split("=", 1)[1].lower().lstrip("0") == by_name["server"]["serial"].lstrip("0")
    assert by_name["server"]["secret"] == "orders-tls" and by_name["ca"]["secret"] == "orders-ca"
    assert status_tls(plane, namespace, "orders")["mode"] == "Operator"
    wait_for("CertificatesValid", lambda: condition(plane, namespace, "orders").get("reason") == "Valid")
    issued = events(plane, namespace, "orders", "CertificateIssued")
    assert len(issued) == 3 and all("BEGIN" not in e["message"] for e in issued)
    assert by_name["operatorClient"]["secret"] == "orders-operator-client"
    versions_stay(plane, namespace, "orders-ca", "orders-tls", "orders-operator-client")  # nothing written


def test_a_tls_secret_the_operator_does_not_own_is_never_overwritten(
    plane: PlaneAccess, namespace: str, operator: ManagedProcess
) -> None:
    ca = new_ca("someone else's", days=30, now=datetime.now(UTC), key_bits=2048)
    theirs = user_tls_secret("legacy-tls", {"tls.crt": ca.certificate_pem, "tls.key": ca.key_pem})
    theirs["metadata"]["labels"] = {"team": "sap-basis"}
    apply(plane, namespace, theirs)
    apply(plane, namespace, broker_cluster("legacy", replicas=1, company="2000"))
    wait_for("NotOwned", lambda: condition(plane, namespace, "legacy").get("reason") == "NotOwned")
    found = condition(plane, namespace, "legacy")
    assert found["status"] == "False" and f"Secret {namespace}/legacy-tls" in found["message"]
    assert "does not overwrite it" in found["message"]
    wait_for("the Warning event", lambda: events(plane, namespace, "legacy", "CertificateNotOwned"))
    versions_stay(plane, namespace, "legacy-tls")
    assert data_of(secret(plane, namespace, "legacy-tls") or {})["tls.crt"] == ca.certificate_pem
    assert secret(plane, namespace, "legacy-ca") is None  # nothing issued while a Secret is not its own


def test_mode_secrets_reads_the_users_secrets_only_and_explains_them(
    plane: PlaneAccess, namespace: str, operator: ManagedProcess
) -> None:
    now = datetime.now(UTC)
    user_ca = new_ca("customer CA", days=365, now=now, key_bits=2048)
    server = issue_server(user_ca, [f"erp-active.{namespace}.svc.cluster.local"], days=5, now=now)
    client = issue_client(user_ca, "sap-operator", days=60, now=now)
    # The server's Secret without ca.crt: what SAP would have to trust is missing.
    apply(
        plane,
        namespace,
        user_tls_secret("erp-broker-tls", {"tls.crt": server.certificate_pem, "tls.key": server.key_pem}),
    )
    apply(
        plane, namespace,
        user_tls_secret("erp-operator-tls", {
            "tls.crt": client.certificate_pem, "tls.key": client.key_pem, "ca.crt": user_ca.certificate_pem,
        }),
    )  # fmt: skip
    secrets = {"server": "erp-broker-tls", "operatorClient": "erp-operator-tls"}
    apply(
        plane,
        namespace,
        broker_cluster("erp", replicas=1, company="3000", tls={"mode": "Secrets", "secrets": secrets}),
    )
    wait_for("Missing", lambda: condition(plane, namespace, "erp").get("reason") == "Missing")
    missing = condition(plane, namespace, "erp")
    assert missing["status"] == "False"
    assert (
        f"Secret {namespace}/erp-broker-tls (spec.tls.secrets.server) has no key ca.crt" in missing["message"]
    )
    wait_for("the Warning event", lambda: events(plane, namespace, "erp", "CertificateMissing"))
    versions_stay(plane, namespace, "erp-broker-tls", "erp-operator-tls")
    assert secret(plane, namespace, "erp-ca") is None and secret(plane, namespace, "erp-tls") is None

    patch = {"data": {"ca.crt": base64.b64encode(user_ca.certificate_pem).decode()}}
    plane.kubectl(
        "-n", namespace, "patch", "secret", "erp-broker-tls", "--type=merge", "-p", json.dumps(patch)
    )
    wait_for("ExpiringSoon", lambda: condition(plane, namespace, "erp").get("reason") == "ExpiringSoon")
    soon = condition(plane, namespace, "erp")
    assert soon["status"] == "True" and "server (Secret erp-broker-tls) expires at" in soon["message"]
    wait_for("the Warning event", lambda: events(plane, namespace, "erp", "CertificateExpiringSoon"))
    entries = {e["name"]: e for e in status_tls(plane, namespace, "erp")["certificates"]}
    assert entries["server"]["serial"] == server.info().serial
    assert entries["ca"]["secret"] == "erp-broker-tls:ca.crt"
    assert entries["operatorClient"]["serial"] == client.info().serial
    versions_stay(plane, namespace, "erp-broker-tls", "erp-operator-tls")  # read, never written


def test_short_lived_certificates_are_renewed_before_they_end(
    plane: PlaneAccess, namespace: str, operator: ManagedProcess
) -> None:
    lifetimes = {"validityDays": 2, "renewBeforeDays": 1}
    apply(
        plane, namespace, broker_cluster("brief", replicas=1, company="4000", tls={"certificates": lifetimes})
    )
    ca_found = wait_for("brief-ca", lambda: secret(plane, namespace, "brief-ca"))
    wait_for("brief-tls", lambda: secret(plane, namespace, "brief-tls"))
    wait_for("Valid", lambda: condition(plane, namespace, "brief").get("reason") == "Valid")
    issued = {e["name"]: e for e in status_tls(plane, namespace, "brief")["certificates"]}["server"]
    ends = datetime.fromisoformat(issued["notAfter"])
    assert timedelta(days=1, hours=23) < ends - datetime.now(UTC) <= timedelta(days=2)
    # A server certificate as the operator would have issued it a day and a half ago, from the
    # cluster's own CA: 12 hours left, within renewBeforeDays.
    held = data_of(ca_found)
    ca = KeyPair(held["ca.crt"], held["ca.key"])
    dns = certificate_info(data_of(secret(plane, namespace, "brief-tls") or {})["tls.crt"]).dns_names
    aged = issue_server(ca, dns, days=2, now=datetime.now(UTC) - timedelta(hours=36))
    patch = {
        "data": {
            "tls.crt": base64.b64encode(aged.certificate_pem).decode(),
            "tls.key": base64.b64encode(aged.key_pem).decode(),
        }
    }
    plane.kubectl("-n", namespace, "patch", "secret", "brief-tls", "--type=merge", "-p", json.dumps(patch))

    def renewed() -> list[dict[str, Any]]:
        return [
            e
            for e in events(plane, namespace, "brief", "CertificateRenewed")
            if e["message"].startswith("server:")
        ]

    (event,) = wait_for("CertificateRenewed", renewed)
    assert "expires in 12 hours" in event["message"] or "expires in 11 hours" in event["message"]
    assert event["type"] == "Normal" and "BEGIN" not in event["message"]
    current = data_of(secret(plane, namespace, "brief-tls") or {})
    assert current["tls.crt"] != aged.certificate_pem
    fresh = certificate_info(current["tls.crt"])
    wait_for(
        "the new serial in status.tls",
        lambda: (
            {e["name"]: e for e in status_tls(plane, namespace, "brief")["certificates"]}["server"]["serial"]
            == fresh.serial
        ),
    )
    assert fresh.not_after - datetime.now(UTC) > timedelta(days=1, hours=23)
    assert condition(plane, namespace, "brief").get("reason") == "Valid"


def test_two_replicas_at_once_agree_on_one_ca_and_a_stale_update_is_refused(
    plane: PlaneAccess, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two operator replicas' first passes over one new cluster, at the same moment, against the real
    API server (no operator process drives this cluster: it lives in a namespace of its own): one
    create wins, the other meets 409, reads what is there and uses it, so the Secrets hold one CA
    and a server certificate of it. And the update a renewal makes is conditional on the
    resourceVersion read: the API server refuses it once the Secret has changed."""
    monkeypatch.setattr(kopf, "info", lambda *_, **__: None)  # no kopf event loop here to post through
    monkeypatch.setattr(kopf, "warn", lambda *_, **__: None)
    alone = new_namespace(plane, "certs-race")
    apply(plane, alone, broker_cluster("twin", replicas=1, company="5000"))
    body = plane.get_json(alone, "brokercluster", "twin")

    async def both() -> None:
        contexts = [
            ControllerContext(settings=ControllerSettings(), api=KubeApi(plane.api_client()))
            for _ in range(2)
        ]
        spec = parse_spec("twin", body["spec"])
        ref = ClusterRef(alone, "twin", body, {})
        logger = logging.getLogger("e2e")
        await asyncio.gather(*(ensure_certificates(c, ref, spec, {}, logger) for c in contexts))
        # Each replica reports the CA that is stored: the loser of the create took the winner's.
        serials = {c.certificate_checks[(alone, "twin")].report.entries[0].info.serial for c in contexts}
        stored = await contexts[0].api.read_secret(alone, "twin-ca")
        assert stored is not None
        assert serials == {certificate_info(data_of(stored)["ca.crt"]).serial}

        api = contexts[0].api
        found = await api.read_secret(alone, "twin-tls")
        assert found is not None
        stale = found["metadata"]["resourceVersion"]
        assert await api.patch_secret(alone, "twin-tls", {"metadata": {"labels": {"touched": "1"}}})
        refused = await api.patch_secret(
            alone, "twin-tls", {"metadata": {"resourceVersion": stale}, "data": {"tls.crt": ""}}
        )
        assert refused is False

    asyncio.run(both())
    ca_pem = data_of(secret(plane, alone, "twin-ca") or {})["ca.crt"]
    tls = data_of(secret(plane, alone, "twin-tls") or {})
    assert tls["ca.crt"] == ca_pem
    assert verifies(
        tls["tls.crt"], ca_pem, dns_name=f"twin-active.{alone}.svc.cluster.local", now=datetime.now(UTC)
    )
    plane.kubectl("delete", "namespace", alone, "--wait=false", check=False)
