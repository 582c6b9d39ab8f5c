"""The installer's allowlist of endpoint hosts (issue 39, finding 3): which spec.endpoints[].url the
operator may heartbeat. A BrokerCluster's author could otherwise point the operator (and the token
it sends) at any URL, inside the cluster or out, and read the reply back from the status."""

from __future__ import annotations

import asyncio

import kmock
import pytest

from broker_operator.controller.endpoint_hosts import EndpointHosts
from broker_operator.controller.kube import KubeApi
from broker_operator.controller.settings import parse_settings
from tests.unit.controller.conftest import cluster_body, events_of, eventually, running_operator
from tests.unit.controller.test_credentials import condition, create_cluster, endpoints_at, recording_brokers


@pytest.mark.parametrize(
    ("patterns", "url", "allowed"),
    [
        (("*.erp.example.com",), "https://broker-1.erp.example.com:8443/soap", True),
        (("*.erp.example.com",), "https://erp.example.com.evil.test/soap", False),
        (("*.erp.example.com",), "https://BROKER-1.ERP.EXAMPLE.COM/soap", True),  # host names ignore case
        (("broker-1.erp.example.com",), "https://broker-2.erp.example.com/soap", False),
        (("10.20.0.0/16",), "http://10.20.3.4:8080/soap", True),
        (("10.20.0.0/16",), "http://10.21.3.4:8080/soap", False),
        (("10.20.0.0/16",), "http://broker.10.20.0.0/soap", False),  # a CIDR matches addresses only
        (("fd00::/8",), "http://[fd00::1]:8080/soap", True),
        (("*",), "http://169.254.169.254/latest/meta-data", True),  # "*": the installer allows all
        ((), "http://127.0.0.1:9/soap", False),  # an empty list allows nothing
        (
            ("*.example.com",),
            "http://user:pw@a.example.com@10.0.0.1/soap",
            False,
        ),  # the real host is 10.0.0.1
    ],
)
def test_the_allowlist_matches_the_urls_host(patterns: tuple[str, ...], url: str, allowed: bool) -> None:
    assert EndpointHosts.parse(patterns).allows(url) is allowed


def test_a_bad_pattern_is_refused_at_start_naming_it() -> None:
    with pytest.raises(ValueError, match=r"'10\.0\.0\.0/33'"):
        EndpointHosts.parse(("10.0.0.0/33",))


def test_the_setting_comes_from_the_flag_or_the_environment() -> None:
    assert parse_settings([], {}).endpoint_hosts is None  # unset: no restriction (a bare operator)
    given = parse_settings([], {"OPERATOR_ENDPOINT_HOSTS": "*.erp.example.com, 10.0.0.0/8"}).endpoint_hosts
    assert given == EndpointHosts.parse(("*.erp.example.com", "10.0.0.0/8"))
    assert parse_settings([], {"OPERATOR_ENDPOINT_HOSTS": ""}).endpoint_hosts == EndpointHosts.parse(())
    flagged = parse_settings(["--endpoint-hosts", "a.example"], {"OPERATOR_ENDPOINT_HOSTS": "*"})
    assert flagged.endpoint_hosts == EndpointHosts.parse(("a.example",))


@pytest.mark.looptime
async def test_an_endpoint_outside_the_allowlist_is_never_heartbeated_and_is_named(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    runner, port, heard = await recording_brokers()
    try:
        async with running_operator(kmock, kube_api, endpoint_hosts=EndpointHosts.parse(("10.0.0.0/8",))):
            await create_cluster(kmock, cluster_body("probe", endpoints=endpoints_at(port, "probe")))
            await eventually(lambda: condition(kmock, "probe", "EndpointsAllowed") is not None or bool(heard))
            await asyncio.sleep(3.0)  # the daemon's waits and another reconcile pass
            assert heard == [], "the operator heartbeated a URL outside the installer's allowlist"
            refused = condition(kmock, "probe", "EndpointsAllowed")
            assert refused is not None and refused["status"] == "False"
            assert refused["reason"] == "EndpointNotAllowed"
            assert "spec.endpoints url host 127.0.0.1 (endpoint a)" in refused["message"]
            assert "operator.endpointHosts" in refused["message"]
            assert any(e["reason"] == "EndpointNotAllowed" for e in events_of(kmock, "probe"))
    finally:
        await runner.cleanup()


@pytest.mark.looptime
async def test_an_endpoint_inside_the_allowlist_is_heartbeated(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    runner, port, heard = await recording_brokers()
    try:
        async with running_operator(kmock, kube_api, endpoint_hosts=EndpointHosts.parse(("127.0.0.0/8",))):
            await create_cluster(kmock, cluster_body("near", endpoints=endpoints_at(port, "near")))
            await eventually(lambda: bool(heard))
            await eventually(lambda: condition(kmock, "near", "EndpointsAllowed") is not None)
            allowed = condition(kmock, "near", "EndpointsAllowed")
            assert allowed is not None and allowed["status"] == "True"
    finally:
        await runner.cleanup()
