"""Small clients for the broker's integration tests: zeep for SOAP, urllib for the simulators' JSON.

The operator talks to brokers with zeep built from the shared WSDL, so the
tests do too: if zeep cannot consume the WSDL the broker serves, or a reply the
broker renders, these helpers fail. Hostile and malformed requests are sent raw
(zeep would refuse to build them). Every wait is bounded.

Processes started with TLS (``local_cluster.loopback_relay``) are called over it: the SOAP
helpers go to a broker's admin port with the operator's certificate when it has one
(``admin_url``, ``caller_tls``), and the simulators' JSON helpers verify against the run's CA.
"""

from __future__ import annotations

import http.client
import json
import re
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import requests
import zeep
from lxml import etree
from zeep.transports import Transport

from broker_contracts import soap, wsdl_path
from broker_simulators.local_processes import DEFAULT_BACKEND_TOKEN, DEFAULT_TOKEN, RunningProcess

BINDING = f"{{{soap.NAMESPACE}}}BrokerBinding"


def soap_service(broker: RunningProcess, token: str | None = DEFAULT_TOKEN) -> Any:
    """A zeep service for ``broker``'s operator calls, built from the WSDL the broker itself serves at
    ``?wsdl``: on its admin port if it has one, over TLS with the operator's certificate if it
    serves TLS."""
    session = requests.Session()
    if token is not None:
        session.headers[soap.AUTH_HEADER] = f"{soap.AUTH_SCHEME} {token}"
    tls = broker.caller_tls
    if tls is not None:
        # requests lets REQUESTS_CA_BUNDLE (set on this machine) override a session's own CA file.
        session.trust_env = False
        session.verify = str(tls.ca_file)
        if tls.cert_file is not None and tls.key_file is not None:
            session.cert = (str(tls.cert_file), str(tls.key_file))
    transport = Transport(session=session, timeout=10, operation_timeout=30)  # every wait bounded
    url = broker.admin_url + soap.SOAP_PATH
    client = zeep.Client(url + "?wsdl", transport=transport)
    return client.create_service(BINDING, url)


def heartbeat(
    broker: RunningProcess,
    active: bool,
    epoch: int,
    token: str | None = DEFAULT_TOKEN,
    *,
    renew: bool | None = None,
) -> Any:
    """One Heartbeat through zeep; ``renew=False`` sends ``renewLease=false`` (a check), ``None`` omits it."""
    extra = {} if renew is None else {"renewLease": renew}
    return soap_service(broker, token).Heartbeat(
        active=active, epoch=epoch, operatorId="test-operator", **extra
    )


def heartbeat_envelope(active: bool, epoch: int, *, renew: bool | None = None) -> bytes:
    """The Heartbeat request zeep builds from the shared WSDL, to send raw (:class:`QueuedRequest`)."""
    extra = {} if renew is None else {"renewLease": renew}
    client = zeep.Client(str(wsdl_path()))
    message = client.create_message(
        client.service, "Heartbeat", active=active, epoch=epoch, operatorId="test-operator", **extra
    )
    return bytes(etree.tostring(message))


class QueuedRequest:
    """A POST sent from a thread; to a stopped broker it waits in the socket buffer until SIGCONT.

    The kernel completes the TCP handshake and buffers the request while the process is
    stopped, so :meth:`wait_sent` returns as soon as the bytes are out; the answer (or the
    client's timeout, as an operator's heartbeat would give up) comes later.
    """

    def __init__(self, url: str, body: bytes, *, timeout: float, token: str | None = DEFAULT_TOKEN) -> None:
        self.url = urllib.parse.urlsplit(url)
        self.body = body
        self.timeout = timeout
        self.token = token
        self.sent = threading.Event()
        self.status: int | None = None
        self.reply = b""
        self.error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="queued-request", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        headers = {"Content-Type": "text/xml; charset=utf-8"}
        if self.token is not None:
            headers[soap.AUTH_HEADER] = f"{soap.AUTH_SCHEME} {self.token}"
        connection = http.client.HTTPConnection(self.url.hostname or "", self.url.port, timeout=self.timeout)
        try:
            connection.request("POST", self.url.path, body=self.body, headers=headers)
            self.sent.set()
            response = connection.getresponse()
            self.status, self.reply = response.status, response.read()
        except OSError as error:  # a timeout included
            self.error = error
        finally:
            self.sent.set()
            connection.close()

    def wait_sent(self, timeout: float = 10.0) -> None:
        assert self.sent.wait(timeout), f"request to {self.url.geturl()} not sent within {timeout}s"

    @property
    def pending(self) -> bool:
        return self._thread.is_alive()

    def answer(self, timeout: float = 30.0) -> tuple[int | None, bytes]:
        """``(HTTP status, body)``, or ``(None, b"")`` if the client gave up first."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"no answer from {self.url.geturl()} within {timeout}s"
        return self.status, self.reply


def reply_state(body: bytes) -> tuple[str, str | None]:
    """``(state, unavailabilityCode)`` of a raw HeartbeatResponse."""
    state = re.search(rb"<tns:state>(\w+)</tns:state>", body)
    assert state, body[:500]
    code = re.search(rb"<tns:unavailabilityCode>(\w+)</tns:unavailabilityCode>", body)
    return state.group(1).decode(), code.group(1).decode() if code else None


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


def post_bundle(url: str, body: bytes) -> tuple[int, bytes]:
    """A SendMessages request as the backend sends it: with the backend's credential."""
    return post_raw(url, body, token=DEFAULT_BACKEND_TOKEN)


def raw_fault_code(body: bytes) -> str:
    match = re.search(rb"<tns:code>([A-Z_]+)</tns:code>", body)
    assert match, body[:500]
    return match.group(1).decode()


def get_json(url: str, context: ssl.SSLContext | None = None) -> Any:
    with urllib.request.urlopen(url, timeout=10, context=context) as response:
        return json.load(response)


def post_json(url: str, body: object, context: ssl.SSLContext | None = None) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        return json.load(response)


def caller_context(process: RunningProcess) -> ssl.SSLContext | None:
    """How to call ``process``: its run's CA (and client certificate) if it serves TLS, else None."""
    return None if process.caller_tls is None else process.caller_tls.context()


def sim_json(process: RunningProcess, path: str) -> Any:
    """``GET path`` of a simulator, over TLS if it serves TLS."""
    return get_json(process.url + path, caller_context(process))


def get_text(url: str, context: ssl.SSLContext | None = None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def metric(broker: RunningProcess, name: str) -> float:
    """One unlabelled sample from the broker's ``/metrics``."""
    _, text = get_text(broker.url + "/metrics", caller_context(broker))
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
    post_json(backend.url + "/sim/start", {}, caller_context(backend))


def backend_status(backend: RunningProcess) -> dict[str, Any]:
    result: dict[str, Any] = sim_json(backend, "/sim/status")
    return result


def cloud_received(cloud: RunningProcess) -> dict[str, list[int]]:
    result: dict[str, list[int]] = sim_json(cloud, "/sim/received")
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


class Renewals:
    """The operator's part in a test without one: ``active=true`` heartbeats to ``broker`` every
    0.2 s on a thread, from entering the ``with`` block until :meth:`stop` or its end.

    One zeep service serves every renewal: building one per call fetches and parses the WSDL,
    which on a loaded machine can stretch a gap past a 1 s lease and fence the broker. A failed
    renewal is retried at the next tick, as an operator would, and counted in ``failures``.
    """

    def __init__(self, broker: RunningProcess, epoch: int) -> None:
        self._stop = threading.Event()
        self._service = soap_service(broker)
        self.failures: list[Exception] = []
        self._thread = threading.Thread(target=self._run, args=(epoch,), daemon=True)

    def _run(self, epoch: int) -> None:
        while not self._stop.wait(0.2):
            try:
                self._service.Heartbeat(active=True, epoch=epoch, operatorId="test-operator")
            except Exception as error:  # a renewal that failed is retried next tick
                self.failures.append(error)

    def start(self) -> Renewals:
        self._thread.start()
        return self

    def __enter__(self) -> Renewals:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
