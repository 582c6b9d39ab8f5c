"""No credential reaches what people and scrapers read: status, events, logs, metrics, /readyz.

A recognisable credential is planted in every place the brokers and the operator take one from:
the backend's and the cloud's URL userinfo, a query token in the cloud's URL, the credentials a
broker reads from mounted Secret keys (``--backend-credentials-dir`` / ``--cloud-credentials-dir``:
a username and password, a bearer token), the operator's token and the backend's token (the
brokers' token files), and the userinfo of an endpoint URL the operator heartbeats. Then every
error path is driven against real broker processes and real loopback targets (:mod:`target_standin`):
a target that answers 401 and echoes the request back (URL, query, ``Authorization``), one that never
answers (the relay timeout), one that is gone (connection refused), and an ``https://`` URL pointed at
a plain listener (a TLS failure); first by the real engine (``ClusterLoop`` with the local runner's
shell and the real heartbeat client), then by direct heartbeats, while Active (the relay loops'
retries and their log lines) and while activating (the heartbeat's ``unavailabilityMessage``).
Everything that came out is searched for every planted value, raw, percent-encoded and as the Basic
credential it makes: the heartbeat replies, the brokers' logs, their ``/metrics`` and ``/readyz``,
the engine's statuses, events and log records, the local runner's output and state file, and the
operator's metrics. The tests also check that each path was really driven (its code and a word of
its error are there), so a run that met no error cannot pass.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import re
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import prometheus_client
import pytest

from broker_operator.core.model import BrokerTarget
from broker_simulators.local_processes import ProcessSet, RunningProcess, free_port
from tests.integration.broker.helpers import get_text, heartbeat, wait_until
from tests.integration.broker.target_standin import Mode, TargetStandIn
from tests.integration.operator.conftest import BrokerTrio, eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

OPERATOR_TOKEN = "OpTok-leak-7f3a9c51"
BACKEND_TOKEN = "BkTok-leak-2b8e41d0"
URL_BACKEND_USER, URL_BACKEND_PASSWORD = "erpuser-leak-u1", "ErpPW-leak-5d2c9e"
URL_CLOUD_USER, URL_CLOUD_PASSWORD = "clouduser-leak-u2", "CloudPW-leak-a1b2c3"
URL_CLOUD_QUERY_TOKEN = "CloudSig-leak-44e0f7"
DIR_BACKEND_USER, DIR_BACKEND_PASSWORD = "diruser-leak-u3", "DirPW-leak-77aa01"
DIR_CLOUD_TOKEN = "DirTok-leak-c3d4e5"
ENDPOINT_USER, ENDPOINT_PASSWORD = "epuser-leak-u4", "EpPW-leak-9f9f12"

PLANTED = (
    OPERATOR_TOKEN,
    BACKEND_TOKEN,
    URL_BACKEND_USER,
    URL_BACKEND_PASSWORD,
    URL_CLOUD_USER,
    URL_CLOUD_PASSWORD,
    URL_CLOUD_QUERY_TOKEN,
    DIR_BACKEND_USER,
    DIR_BACKEND_PASSWORD,
    DIR_CLOUD_TOKEN,
    ENDPOINT_USER,
    ENDPOINT_PASSWORD,
)
PAIRS = (
    (URL_BACKEND_USER, URL_BACKEND_PASSWORD),
    (URL_CLOUD_USER, URL_CLOUD_PASSWORD),
    (DIR_BACKEND_USER, DIR_BACKEND_PASSWORD),
    (ENDPOINT_USER, ENDPOINT_PASSWORD),
)


def basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def forbidden() -> set[str]:
    """Every planted value in every form it could take in text."""
    forms = set(PLANTED)
    forms |= {urllib.parse.quote(value, safe="") for value in PLANTED}
    forms |= {basic(user, password) for user, password in PAIRS}
    return forms


# An echoed header cut short still gives away the credential's first characters.
PARTIAL_HEADER = re.compile(r"Authorization: (?:Basic|Bearer) (?!\*\*\*)[^\s'\\]+")


def leaks(where: str, text: str) -> list[str]:
    found = [f"{where} holds {value!r}" for value in sorted(forbidden()) if value in text]
    return found + [f"{where} holds {match!r}" for match in PARTIAL_HEADER.findall(text)]


@dataclass
class Targets:
    backend: TargetStandIn = field(default_factory=TargetStandIn)
    cloud: TargetStandIn = field(default_factory=TargetStandIn)
    plain: TargetStandIn = field(default_factory=TargetStandIn)  # https:// URLs point here

    def close(self) -> None:
        for standin in (self.backend, self.cloud, self.plain):
            standin.close()


@pytest.fixture
def targets() -> Iterator[Targets]:
    made = Targets()
    try:
        yield made
    finally:
        made.close()


def credentials_dir(root: Path, **keys: str) -> Path:
    """A directory as a mounted Secret makes it: one file per key."""
    root.mkdir(parents=True, exist_ok=True)
    for key, value in keys.items():
        (root / key).write_text(value)
    return root


def start_brokers(
    processes: ProcessSet, tmp_path: Path, targets: Targets, style: str
) -> dict[str, RunningProcess]:
    """Two brokers: ``b-http`` reaching the switchable stand-ins, ``b-tls`` reaching a plain
    listener through ``https://``. ``style`` is where their backend and cloud credentials live."""
    common = {"token": OPERATOR_TOKEN, "backend_token": BACKEND_TOKEN, "lease_seconds": 30.0}
    brokers = {}
    for name, (backend, cloud, scheme) in {
        "b-http": (targets.backend, targets.cloud, "http"),
        "b-tls": (targets.plain, targets.plain, "https"),
    }.items():
        extra = ["--relay-timeout-seconds", "1", "--retry-max-seconds", "0.2"]
        if style == "userinfo":
            backend_url = backend.url(
                scheme=scheme, userinfo=f"{URL_BACKEND_USER}:{URL_BACKEND_PASSWORD}", path="/erp"
            )
            cloud_url = cloud.url(
                scheme=scheme,
                userinfo=f"{URL_CLOUD_USER}:{URL_CLOUD_PASSWORD}",
                path="/cloud",
                query=f"sig={URL_CLOUD_QUERY_TOKEN}",
            )
        else:
            backend_url = backend.url(scheme=scheme, path="/erp")
            cloud_url = cloud.url(scheme=scheme, path="/cloud")
            backend_dir = credentials_dir(
                tmp_path / name / "backend-credentials",
                username=DIR_BACKEND_USER,
                password=DIR_BACKEND_PASSWORD,
            )
            cloud_dir = credentials_dir(tmp_path / name / "cloud-credentials", token=DIR_CLOUD_TOKEN)
            extra += [
                "--backend-credentials-dir",
                str(backend_dir),
                "--cloud-credentials-dir",
                str(cloud_dir),
            ]
        brokers[name] = processes.start_broker(
            tmp_path, name=name, backend_url=backend_url, cloud_url=cloud_url, extra_args=extra, **common
        )
    return brokers


@dataclass
class Seen:
    """Everything that came out of the run, by where it came from."""

    texts: dict[str, str] = field(default_factory=dict)

    def add(self, where: str, text: object) -> None:
        self.texts[where] = self.texts.get(where, "") + "\n" + str(text)

    def all_leaks(self) -> list[str]:
        return [leak for where, text in self.texts.items() for leak in leaks(where, text)]


async def run_engine(
    processes: ProcessSet, tmp_path: Path, brokers: dict[str, RunningProcess], targets: Targets, seen: Seen
) -> None:
    """The real engine over the two brokers and an endpoint whose URL carries userinfo (nothing
    listens there), with the cloud stand-in answering 401 and echoing: every activation fails."""
    targets.cloud.mode = Mode.ECHO_401
    port = free_port("127.0.0.1")
    endpoint = BrokerTarget(
        "ep-gone", f"http://{ENDPOINT_USER}:{ENDPOINT_PASSWORD}@127.0.0.1:{port}/soap", len(brokers)
    )
    trio = BrokerTrio(processes, brokers, tmp_path)
    loop, shell = await trio.start_loop(targets=[*trio.targets(), endpoint], token=OPERATOR_TOKEN)
    try:
        await eventually(
            lambda: (
                {b.name: b.unavailability_code for b in loop.status.brokers}.get("b-tls")
                == "CLOUD_UNREACHABLE"
                and {b.name: b.unavailability_code for b in loop.status.brokers}.get("b-http")
                == "CLOUD_UNREACHABLE"
                and any(b.name == "ep-gone" and b.unavailability_message for b in loop.status.brokers)
            ),
            30,
            "every broker's failed activation in the status",
        )
        await eventually(lambda: "NoBrokerAvailable" in shell.reasons(), 15, "the NoBrokerAvailable event")
    finally:
        await trio.stop_loops()
    messages = {b.name: b.unavailability_message or "" for b in loop.status.brokers}
    assert "401" in messages["b-http"], messages
    for status in shell.statuses:
        seen.add("engine status", status.to_status_patch())
    seen.add("engine events", shell.events)
    seen.add("local runner output", shell._out.getvalue())  # type: ignore[attr-defined]
    seen.add("local runner state file", (tmp_path / "state.json").read_text())
    seen.add("operator metrics", prometheus_client.generate_latest().decode())
    targets.cloud.mode = Mode.OK


def activation_failure(broker: RunningProcess) -> tuple[str, str]:
    """Ask ``broker`` to activate with the next epoch; the code and message it answers with."""
    current = heartbeat(broker, active=False, epoch=0, token=OPERATOR_TOKEN).epoch
    reply = heartbeat(broker, active=True, epoch=current + 1, token=OPERATOR_TOKEN)
    assert reply.state == "Unavailable", reply
    return reply.unavailabilityCode, reply.unavailabilityMessage or ""


def drive_broker_errors(brokers: dict[str, RunningProcess], targets: Targets, seen: Seen) -> None:
    http, tls = brokers["b-http"], brokers["b-tls"]
    # Active, then the cloud starts refusing and echoing: the poll loop's retries are logged.
    current = heartbeat(http, active=False, epoch=0, token=OPERATOR_TOKEN).epoch
    assert heartbeat(http, active=True, epoch=current + 1, token=OPERATOR_TOKEN).state == "Active"
    targets.cloud.mode = Mode.ECHO_401
    wait_until(lambda: "inbound relay failed" in http.log_text(), 20, what="the poll's failure in the log")
    targets.cloud.mode = Mode.SILENT
    wait_until(lambda: http.log_text().count("inbound relay failed") >= 3, 20, what="a timed-out poll")
    targets.cloud.mode = Mode.OK
    assert heartbeat(http, active=False, epoch=current + 1, token=OPERATOR_TOKEN).state == "Inactive"

    phases = [
        ("cloud 401", Mode.ECHO_401, Mode.OK, "CLOUD_UNREACHABLE", "401"),
        ("backend 401", Mode.OK, Mode.ECHO_401, "BACKEND_UNREACHABLE", "401"),
        ("cloud timeout", Mode.SILENT, Mode.OK, "CLOUD_UNREACHABLE", "imeout"),
        ("backend timeout", Mode.OK, Mode.SILENT, "BACKEND_UNREACHABLE", "imeout"),
    ]
    for what, cloud_mode, backend_mode, code, word in phases:
        targets.cloud.mode, targets.backend.mode = cloud_mode, backend_mode
        got_code, message = activation_failure(http)
        assert (got_code, word in message) == (code, True), (what, got_code, message)
        seen.add(f"heartbeat reply ({what})", message)
    targets.cloud.mode = targets.backend.mode = Mode.OK
    targets.backend.close()  # gone: its port refuses
    got_code, message = activation_failure(http)
    assert got_code == "BACKEND_UNREACHABLE" and "onnect" in message, message
    seen.add("heartbeat reply (backend refused)", message)
    got_code, message = activation_failure(tls)
    assert got_code == "CLOUD_UNREACHABLE" and "SSL" in message.upper(), message
    seen.add("heartbeat reply (TLS)", message)


@pytest.mark.parametrize("style", ["userinfo", "secret-keys"])
async def test_no_planted_credential_reaches_status_events_logs_or_metrics(
    processes: ProcessSet, tmp_path: Path, targets: Targets, style: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    brokers = await asyncio.to_thread(start_brokers, processes, tmp_path, targets, style)
    seen = Seen()
    await run_engine(processes, tmp_path, brokers, targets, seen)
    await asyncio.to_thread(drive_broker_errors, brokers, targets, seen)

    for name, broker in brokers.items():
        seen.add(f"{name} /metrics", (await asyncio.to_thread(get_text, broker.url + "/metrics"))[1])
        seen.add(f"{name} /readyz", (await asyncio.to_thread(get_text, broker.url + "/readyz"))[1])
    for name, broker in brokers.items():
        with contextlib.suppress(Exception):
            broker.stop()
        seen.add(f"{name} log", broker.log_text())
    seen.add("operator log records", caplog.text)

    # The credentials went where they belong: the targets were sent them.
    sent = "\n".join(targets.cloud.requests + targets.backend.requests)
    if style == "userinfo":
        assert f"Basic {basic(URL_BACKEND_USER, URL_BACKEND_PASSWORD)}" in sent
        assert f"Basic {basic(URL_CLOUD_USER, URL_CLOUD_PASSWORD)}" in sent
        assert f"sig={URL_CLOUD_QUERY_TOKEN}" in sent
    else:
        assert f"Basic {basic(DIR_BACKEND_USER, DIR_BACKEND_PASSWORD)}" in sent
        assert f"Bearer {DIR_CLOUD_TOKEN}" in sent
    assert seen.all_leaks() == []
