"""Failover through the ``<cluster>-active`` Service, on the sealed pod network, as users run it.

The chart's operator runs as a pod (in-cluster config through the ``kubernetes`` Service), the
brokers are the example's pods, and the SAP backend and the cloud are simulator pods
(``local_cluster.relay``): the backend sends to ``https://orders-active.<namespace>.svc:8080``
(the brokers serve TLS by default; the backend verifies them against ``ca.crt`` of ``orders-tls``)
through CoreDNS and kube-proxy, and the brokers reach both simulators by their Service names.
The active broker is killed with kill -9 mid-stream, or cut off by a real network partition
(nftables drops on its interface, both directions); the operator points the Service's
EndpointSlice at the other broker. Proof comes from the simulators' own records: every message
arrived, none twice, each stream in order, in both directions.

The brokers' legs to both simulators are TLS, as ``deploy_relay`` sets them up by default: the
simulators serve HTTPS only, with certificates from a CA made for the run, and the brokers verify
them against it (``spec.tls.upstreamCASecretRef``). Each test checks, from the simulators' side,
that every call the brokers made came over TLS (``/sim/status`` ``relayTransports``); one checks
that the simulators take nothing over plain HTTP.
"""

from __future__ import annotations

import base64
import http.client
import uuid
from collections.abc import Callable, Iterator

import pytest

from local_cluster.relay import CLUSTER_NAME, Relay, deploy_relay
from local_cluster.relay_tls import SIMULATORS_CA_SECRET
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import wait_for

STREAMS, MESSAGES = 4, 150  # per stream, per direction


@pytest.fixture
def relay(sealed_cluster: SealedCluster) -> Iterator[Relay]:
    namespace = f"svc-{uuid.uuid4().hex[:6]}"
    sealed_cluster.kubectl("create", "namespace", namespace)
    relay = deploy_relay(sealed_cluster, namespace, streams=STREAMS, messages_per_stream=MESSAGES)
    yield relay
    relay.uninstall()
    sealed_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _partition(relay: Relay, pod: str) -> None:
    relay.cluster.partition_pod(relay.pod(pod), "both")


def test_a_kill_9_of_the_active_broker_fails_over_through_the_active_service(relay: Relay) -> None:
    _fail_over_under_traffic(relay, Relay.kill_9)


def test_a_network_partition_of_the_active_broker_fails_over_through_the_active_service(
    relay: Relay,
) -> None:
    _fail_over_under_traffic(relay, _partition)


def _fail_over_under_traffic(relay: Relay, fault: Callable[[Relay, str], None]) -> None:
    active = str(relay.status()["active"])
    assert relay.active_service_addresses() == [relay.pod(active)["status"]["podIP"]]
    relay.backend("/sim/start", {})
    wait_for(
        "a third of the outbound messages confirmed through the Service",
        lambda: int(relay.backend("/sim/status")["confirmed"]) >= STREAMS * MESSAGES // 3,
        timeout=120,
        interval=0.1,
    )
    fault(relay, active)
    after = wait_for(
        "a failover to the other broker",
        lambda: (s := relay.status()).get("active") not in (None, active) and s,
        timeout=90,
    )
    relay.wait_all_confirmed()
    assert relay.active_service_addresses() == [relay.pod(str(after["active"]))["status"]["podIP"]]
    outbound, inbound = relay.cloud("/sim/received"), relay.backend("/sim/received")
    assert len(outbound) == STREAMS and len(inbound) == STREAMS
    for stream, seqs in [*outbound.items(), *inbound.items()]:
        assert seqs == list(range(1, MESSAGES + 1)), f"{stream}: lost, duplicated or out of order"
    _assert_brokers_called_over_tls(relay)


def _assert_brokers_called_over_tls(relay: Relay) -> None:
    """Every relay call either simulator took (the brokers' outbound, polls, confirmations, resend
    requests and inbound deliveries) came over TLS: none plain, and some."""
    for simulator in ("backend", "cloud"):
        transports = relay.sim(simulator, "/sim/status")["relayTransports"]
        assert transports and set(transports) <= {"TLSv1.2", "TLSv1.3"}, (simulator, transports)


def _plain_http(relay: Relay, simulator: str) -> str:
    """What a plain-HTTP GET of ``simulator``'s ``/sim/status`` at its ClusterIP gets."""
    host, port = getattr(relay, f"{simulator}_url").split("://")[1].rsplit(":", 1)  # the ClusterIP

    def call() -> str:
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            connection.request("GET", "/sim/status")
            return f"HTTP {connection.getresponse().status}"
        except OSError as error:
            return f"refused: {type(error).__name__}"
        finally:
            connection.close()

    return relay.cluster.call_in_network(call)


def test_the_simulators_take_only_https_and_the_brokers_verify_and_call_them_over_it(relay: Relay) -> None:
    endpoints = relay.get("secret", "erp-endpoints")["data"]
    namespace = relay.namespace
    assert {key: base64.b64decode(value).decode() for key, value in endpoints.items()} == {
        "backend": f"https://backend.{namespace}.svc:8080",
        "cloud": f"https://cloud.{namespace}.svc:8080",
    }
    spec = relay.get("brokercluster", CLUSTER_NAME)["spec"]
    assert spec["tls"]["upstreamCASecretRef"]["name"] == SIMULATORS_CA_SECRET
    broker_env = {
        e["name"]: e.get("value") for e in relay.pod(f"{CLUSTER_NAME}-0")["spec"]["containers"][0]["env"]
    }
    assert broker_env["BROKER_UPSTREAM_CA_FILE"].endswith("/ca.crt"), broker_env
    for simulator in ("backend", "cloud"):
        assert getattr(relay, f"{simulator}_url").startswith("https://")
        assert relay.sim(simulator, "/sim/status")["relayTransports"] is not None  # verified, by name
        assert _plain_http(relay, simulator).startswith("refused"), simulator

    relay.backend("/sim/start", {})
    relay.wait_all_confirmed()
    assert relay.record_violations() == {"lost": 0, "twice": 0, "out-of-order": 0}
    _assert_brokers_called_over_tls(relay)
