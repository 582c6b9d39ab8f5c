"""Replacing the CA's key on the sealed local cluster, under relay traffic (issue 41's second rotation test).

One relay (``local_cluster.relay``, TLS on every leg, as by default: the chart's operator as a pod,
the backend simulator sending to ``https://orders-active.<ns>.svc:8080`` and verifying it against
``ca.crt`` of ``orders-tls``, mounted as a volume the kubelet keeps in step with the Secret). The
backend simulator plays SAP here: it follows its trust file (``--broker-ca-file``) as SAP's admin
follows the operator's instructions, so "the new CA is imported into STRUST" is "the kubelet synced
``ca.crt`` holding both CAs and the simulator loaded it" (``/sim/status`` ``brokerTrustReloads``).

While the backend sends and the operator heartbeats, the test asks for a new key
(``broker.failover.dev/replace-ca-key``), waits for phase Trusting and for the SAP stand-in to trust
the new CA, confirms as a person would (``broker.failover.dev/replace-ca-key-trusted``), and waits
for Done. Asserted: the phases in order; no failed request (the backend's faults, timeout retries
and backoffs do not move), no failover, no new epoch, nothing lost, taken twice or reordered; at
the end every broker serves a certificate of the new CA, and ``kubectl broker ca`` exports that
CA alone, with a key other than the old one's.

Waits are bounded failure limits, not performance assertions; the phases' times are printed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography.hazmat.primitives.serialization import Encoding

from broker_operator.pki import bundle_certificates, certificate_info
from local_cluster.broker_pod_calls import secret_bytes
from local_cluster.relay import CLUSTER_NAME, Relay
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import relay_in_new_namespace, traffic_undisturbed, wait_for
from tests.e2e.test_kubectl_plugin import plugin
from tests.e2e.test_tls_channels import BROKERS, served_serials, serves

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

ANNOTATION = "broker.failover.dev/replace-ca-key"
TOKEN = "rekey-e2e-1"


@pytest.fixture(scope="module")
def relay(sealed_cluster: SealedCluster) -> Iterator[Relay]:
    with relay_in_new_namespace(
        sealed_cluster, "carekey", streams=2, messages_per_stream=10, spec={"failback": "Manual"}
    ) as relay:
        yield relay


def replacement(relay: Relay) -> dict[str, Any]:
    return dict((relay.status().get("tls") or {}).get("caReplacement") or {})


def annotate(relay: Relay, key: str, value: str) -> None:
    relay.cluster.kubectl(
        "-n", relay.namespace, "annotate", "--overwrite", f"brokercluster/{CLUSTER_NAME}", f"{key}={value}"
    )


def key_ids(pems: bytes) -> list[str]:
    """The subject key identifier of each CA in a PEM bundle, in order: which keys it trusts."""
    return [
        certificate_info(certificate.public_bytes(Encoding.PEM)).subject_key_id
        for certificate in bundle_certificates(pems)
    ]


def stored(relay: Relay, secret: str, key: str) -> bytes:
    """``key`` of the Secret ``orders-<secret>`` as the API server holds it now."""
    return secret_bytes(relay.cluster, relay.namespace, f"{CLUSTER_NAME}-{secret}", key)


def trust_reloads(relay: Relay) -> int:
    return int(relay.backend("/sim/status").get("brokerTrustReloads", 0))


def test_the_ca_key_is_replaced_under_load_with_no_failed_request_failover_or_epoch(relay: Relay) -> None:
    with traffic_undisturbed(relay, "the CA key replacement"):
        old_ca = stored(relay, "ca", "ca.crt")
        reloads = trust_reloads(relay)

        started = time.monotonic()
        phases: list[tuple[str, float]] = []

        def reached(phase: str) -> bool:
            now = replacement(relay).get("phase")
            if now and (not phases or phases[-1][0] != now):
                phases.append((now, time.monotonic() - started))
            return now == phase

        annotate(relay, ANNOTATION, TOKEN)
        wait_for("phase Trusting", lambda: reached("Trusting"), timeout=120, interval=0.5)
        # SAP's admin imports the new CA: the stand-in loads the two-CA ca.crt the kubelet synced.
        old_key = key_ids(old_ca)[0]
        both = wait_for(
            "orders-tls ca.crt holding the old and the new CA",
            lambda: len(ids := key_ids(stored(relay, "tls", "ca.crt"))) == 2 and old_key in ids and ids,
            timeout=240,
            interval=1,
        )
        new_key = next(key for key in both if key != old_key)
        wait_for(
            "the SAP stand-in (backend simulator) trusting the two-CA bundle",
            lambda: trust_reloads(relay) > reloads,
            timeout=240,
            interval=1,
        )
        assert reached("Trusting"), replacement(relay)  # nothing moves on before the person confirms
        annotate(relay, f"{ANNOTATION}-trusted", TOKEN)
        wait_for("phase Done", lambda: reached("Done"), timeout=420, interval=0.5)
        print("phases, seconds after the annotation:", phases)
        assert [phase for phase, _ in phases] == ["Trusting", "Reissuing", "Retiring", "Done"], phases

        new_ca = certificate_info(stored(relay, "ca", "ca.crt"))
        assert new_ca.subject_key_id == new_key  # the CA is now the one Trusting added
        serving = certificate_info(stored(relay, "tls", "tls.crt"))
        assert serving.signed_by(new_ca), (serving, new_ca)
        serial = serving.serial
        wait_for(
            f"every broker serving the new CA's leaf {serial} on both listeners",
            lambda: all(serves(relay, broker, serial) for broker in BROKERS) or served_serials(relay),
            timeout=180,
            interval=1,
        )
        exported = plugin(relay.cluster, "ca", CLUSTER_NAME, "-n", relay.namespace)
        assert exported.returncode == 0, exported.stderr
        assert key_ids(exported.stdout.encode()) == [new_key]  # SAP may now drop the old CA
