"""Small clients for the broker's integration tests: zeep for SOAP, urllib for the simulators' JSON.

The operator talks to brokers with zeep built from the shared WSDL, so the
tests do too: if zeep cannot consume the WSDL the broker serves, or a reply the
broker renders, these helpers fail. Hostile and malformed requests are sent raw
(zeep would refuse to build them). Every wait is bounded.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import requests
import zeep
from lxml import etree
from zeep.transports import Transport

from broker_contracts import soap
from tests.integration.processes import DEFAULT_TOKEN, RunningProcess

BINDING = f"{{{soap.NAMESPACE}}}BrokerBinding"


def soap_service(broker: RunningProcess, token: str | None = DEFAULT_TOKEN) -> Any:
    """A zeep service for ``broker``, built from the WSDL the broker itself serves at ``?wsdl``."""
    session = requests.Session()
    if token is not None:
        session.headers[soap.AUTH_HEADER] = f"{soap.AUTH_SCHEME} {token}"
    client = zeep.Client(broker.soap_url + "?wsdl", transport=Transport(session=session, timeout=10))
    return client.create_service(BINDING, broker.soap_url)


def heartbeat(broker: RunningProcess, active: bool, epoch: int, token: str | None = DEFAULT_TOKEN) -> Any:
    return soap_service(broker, token).Heartbeat(active=active, epoch=epoch, operatorId="test-operator")


def fault_code(fault: zeep.exceptions.Fault) -> str:
    detail = fault.detail
    assert detail is not None, f"fault without BrokerFault detail: {fault.message}"
    code = detail.find(f".//{{{soap.NAMESPACE}}}code")
    assert code is not None, etree.tostring(detail)
    return str(code.text)


def post_raw(url: str, body: bytes, token: str | None = DEFAULT_TOKEN) -> tuple[int, bytes]:
    headers = {"Content-Type": "text/xml; charset=utf-8"}
    if token is not None:
        headers[soap.AUTH_HEADER] = f"{soap.AUTH_SCHEME} {token}"
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def raw_fault_code(body: bytes) -> str:
    match = re.search(rb"<tns:code>([A-Z_]+)</tns:code>", body)
    assert match, body[:500]
    return match.group(1).decode()


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def post_json(url: str, body: object) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def get_text(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def metric(broker: RunningProcess, name: str) -> float:
    """One unlabelled sample from the broker's ``/metrics``."""
    _, text = get_text(broker.url + "/metrics")
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"metric {name} not in /metrics")


def wait_until(
    predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.1, what: str = ""
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}; last value {last!r}")


def start_sending(backend: RunningProcess) -> None:
    post_json(backend.url + "/sim/start", {})


def backend_status(backend: RunningProcess) -> dict[str, Any]:
    result: dict[str, Any] = get_json(backend.url + "/sim/status")
    return result


def cloud_received(cloud: RunningProcess) -> dict[str, list[int]]:
    result: dict[str, list[int]] = get_json(cloud.url + "/sim/received")
    return result


def assert_complete_and_ordered(
    received: dict[str, list[int]], streams: int, per_stream: int, prefix: str
) -> None:
    """Every stream got exactly 1..per_stream, in that order: no loss, no duplicate, no reordering."""
    expected_names = {f"{prefix}{i:04d}" for i in range(streams)}
    assert set(received) == expected_names, f"streams differ: {sorted(set(received) ^ expected_names)[:5]}"
    for name, seqs in received.items():
        assert seqs == list(range(1, per_stream + 1)), (
            f"{name}: first bad index {_first_bad(seqs)} in {seqs[:20]}..."
        )


def _first_bad(seqs: list[int]) -> int:
    for index, seq in enumerate(seqs):
        if seq != index + 1:
            return index
    return len(seqs)
