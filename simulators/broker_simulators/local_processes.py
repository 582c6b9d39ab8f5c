"""Start brokers and simulators as real processes on loopback, for tests, the demo and benchmarks.

Each process gets its own loopback address (``127.x.y.z``; the whole 127/8 is
loopback on Linux) and a free port on it, runs in its own session (so it and
anything it forks share one process group), logs to a file next to its data,
and is only returned once its health endpoint answers. :meth:`RunningProcess.stop`
sends SIGTERM to the group and escalates to SIGKILL; :meth:`RunningProcess.kill`
sends any signal to the group (``SIGKILL`` for crash tests, ``SIGSTOP`` /
``SIGCONT`` for partitions). :class:`ProcessSet` tracks everything a test
started and stops it all in teardown, so no process outlives its test.

Usage from any test, either with a :class:`ProcessSet` (the ``processes``
fixture in ``tests/integration/broker/conftest.py`` is one) or with the
module-level functions (then call :func:`stop_all_started` in teardown)::

    cloud = start_cloud_simulator(tmp_path)
    backend = start_backend_simulator(tmp_path, broker_urls=[...])   # sends after POST /sim/start
    broker = start_broker(tmp_path, name="b0", backend_url=backend.url, cloud_url=cloud.url,
                          token="secret", backend_token="other-secret", lease_seconds=3)
    broker.url, broker.soap_url, broker.pid, broker.kill(signal.SIGSTOP), broker.stop()

A broker activates only if its backend and cloud answer (the activation sends
the resend request and probes the cloud), so start both simulators for a
broker you want to heartbeat into Active. Heartbeat it with zeep built from
``broker.soap_url + "?wsdl"`` and ``Authorization: Bearer <token>``. The backend simulator
holds the backend's credential (:data:`DEFAULT_BACKEND_TOKEN` unless ``backend_token`` says
otherwise) and the broker its verifier only, as it does the operator token's;
``SendMessages`` needs the backend's, not the operator's token.

TLS: the ``start_*`` methods take the flags as ``extra_args`` and a ``ready_context`` to poll
readiness over; whoever issued the certificates records on the process how to call it
(:attr:`RunningProcess.caller_tls`, and a broker's :attr:`RunningProcess.admin_port`).
``local_cluster.run_pki`` issues one run's certificates and ``local_cluster.loopback_relay``
starts a broker and both simulators with TLS on every channel in one call.

Not here: assertions or SOAP clients; see ``tests/integration/broker/helpers.py``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker_contracts.environment import BROKER_BACKEND_TOKEN, BROKER_TOKEN
from broker_contracts.tls import client_context
from broker_contracts.token_verifier import token_verifier

PYTHON = sys.executable
_TOKEN_VARIABLES = frozenset({BROKER_TOKEN, BROKER_BACKEND_TOKEN})
DEFAULT_TOKEN = "integration-test-token"
DEFAULT_BACKEND_TOKEN = "integration-backend-token"
"""The backend's credential for SendMessages; brokers refuse it for anything else."""
TOKEN_VERIFIER_FILE = "token.sha256"
BACKEND_TOKEN_VERIFIER_FILE = "backend-token.sha256"
"""Where :meth:`ProcessSet.start_broker` writes the verifiers, in the broker's work directory."""


@dataclass(frozen=True)
class CallerTls:
    """How to call a process that serves TLS: the CA file its certificate chains to, and the client
    certificate to present (the operator's: a broker's admin port requires one). Paths, since
    ``requests`` (under zeep) takes paths; :meth:`context` for everything else."""

    ca_file: Path
    cert_file: Path | None = None
    key_file: Path | None = None

    def context(self) -> ssl.SSLContext:
        """Chain and host name verified (the run's certificates name the process's address)."""
        return client_context(ca_file=self.ca_file, cert_file=self.cert_file, key_file=self.key_file)


def loopback_host() -> str:
    """A random address in 127.0.0.0/8 (avoiding .0 and .255), so parallel processes rarely share one."""
    return f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(1, 254)}"


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel says is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


@dataclass
class RunningProcess:
    name: str
    argv: list[str]
    host: str
    port: int
    log_path: Path
    popen: subprocess.Popen[bytes]
    ready_path: str = "/healthz"
    env: dict[str, str] = field(default_factory=dict)
    # Set for a process that serves TLS: its URLs are https:// and its readiness is asked over TLS
    # with this context (the test's CA; host names are the test's to check, not readiness's).
    ready_context: ssl.SSLContext | None = None
    # A broker's --admin-port (Heartbeat and the admin operations), when it has one.
    admin_port: int | None = None
    # For a process serving TLS: how tests, benchmarks and the operator's stand-ins call it.
    caller_tls: CallerTls | None = None

    @property
    def url(self) -> str:
        scheme = "http" if self.ready_context is None else "https"
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def admin_url(self) -> str:
        """Where the operator calls: the admin port if there is one, else the main port."""
        if self.admin_port is None:
            return self.url
        scheme = "http" if self.ready_context is None else "https"
        return f"{scheme}://{self.host}:{self.admin_port}"

    @property
    def soap_url(self) -> str:
        return f"{self.url}/soap"

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (the process runs in its own session)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)
        if sig == signal.SIGKILL:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=10)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM the group (SIGCONT first, in case a test stopped it), then SIGKILL after ``timeout``."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGCONT)
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill(signal.SIGKILL)
        # Children that ignored SIGTERM still die with the group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        return self.popen.returncode

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_ready(self, timeout: float = 20.0, path: str | None = None) -> None:
        """Poll ``path`` (default the health endpoint) until HTTP 200, or fail with the process log."""
        deadline = time.monotonic() + timeout
        target = self.url + (path or self.ready_path)
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                code = self.popen.returncode
                raise RuntimeError(
                    f"{self.name} exited with {code} before it was ready; log:\n{self.log_text()}"
                )
            try:
                with urllib.request.urlopen(target, timeout=1, context=self.ready_context) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready at {target} within {timeout}s; log:\n{self.log_text()}")

    def restart(self, timeout: float = 20.0) -> RunningProcess:
        """Start the same command again (same address, port, data); for crash/restart tests."""
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.popen = subprocess.Popen(
            self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=self.env or None
        )
        log.close()
        self.wait_ready(timeout)
        return self


def _launch(
    name: str,
    argv: list[str],
    host: str,
    port: int,
    workdir: Path,
    *,
    ready_context: ssl.SSLContext | None = None,
    caller_tls: CallerTls | None = None,
    admin_port: int | None = None,
) -> RunningProcess:
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / f"{name}.log"
    # No token from the caller's environment: a broker refuses to start with one there.
    full_env = {key: value for key, value in os.environ.items() if key not in _TOKEN_VARIABLES}
    full_env["PYTHONUNBUFFERED"] = "1"
    log = open(log_path, "ab")  # noqa: SIM115 - handed to the child
    popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=full_env)
    log.close()
    return RunningProcess(
        name=name,
        argv=argv,
        host=host,
        port=port,
        log_path=log_path,
        popen=popen,
        env=full_env,
        ready_context=ready_context,
        caller_tls=caller_tls,
        admin_port=admin_port,
    )


def broker_argv(
    *,
    host: str,
    port: int,
    name: str,
    data_dir: Path,
    backend_url: str,
    cloud_url: str,
    token_verifier_file: Path,
    backend_token_verifier_file: Path,
    cluster: str,
    account: str,
    company: str,
    lease_seconds: float,
    max_deliveries: int,
    on_poison: str,
    message_log_dir: Path | None,
    extra: Sequence[str],
    max_lease_seconds: float | None = None,
) -> list[str]:
    argv = [
        PYTHON,
        "-m",
        "broker_service",
        "--host",
        host,
        "--port",
        str(port),
        "--name",
        name,
        "--cluster",
        cluster,
        "--account",
        account,
        "--company",
        company,
        "--data-dir",
        str(data_dir),
        "--backend-url",
        backend_url,
        "--cloud-url",
        cloud_url,
        "--token-verifier-file",
        str(token_verifier_file),
        "--backend-token-verifier-file",
        str(backend_token_verifier_file),
        "--lease-seconds",
        str(lease_seconds),
        "--max-deliveries",
        str(max_deliveries),
        "--on-poison",
        on_poison,
    ]
    if message_log_dir is not None:
        argv += ["--message-log-dir", str(message_log_dir)]
    if max_lease_seconds is not None:  # the longest lease a handover renewal may grant
        argv += ["--max-lease-seconds", str(max_lease_seconds)]
    return argv + list(extra)


class ProcessSet:
    """Everything one test started; :meth:`stop_all` in teardown leaves nothing running."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.started: list[RunningProcess] = []

    def _track(self, process: RunningProcess, timeout: float) -> RunningProcess:
        self.started.append(process)
        process.wait_ready(timeout)
        return process

    def start_broker(
        self,
        tmp_path: Path | None = None,
        *,
        name: str = "broker-0",
        backend_url: str = "",
        cloud_url: str = "",
        token: str = DEFAULT_TOKEN,
        backend_token: str = DEFAULT_BACKEND_TOKEN,
        lease_seconds: float = 5.0,
        max_lease_seconds: float | None = None,
        cluster: str = "acme-1000",
        account: str = "acme",
        company: str = "1000",
        max_deliveries: int = 5,
        on_poison: str = "BlockStream",
        data_dir: Path | None = None,
        message_log_dir: Path | None = None,
        extra_args: Sequence[str] = (),
        host: str | None = None,
        port: int | None = None,
        timeout: float = 20.0,
        ready_context: ssl.SSLContext | None = None,
        admin_port: int | None = None,
        caller_tls: CallerTls | None = None,
    ) -> RunningProcess:
        """A ``broker-service`` process, Inactive, with its own data dir under ``tmp_path/name``.

        ``ready_context``: the broker serves TLS (``--tls-dir`` in ``extra_args``); readiness is
        asked over it, and ``caller_tls`` says how to call it. ``admin_port``: the operator's calls
        go there (``--admin-port``; :attr:`RunningProcess.admin_url`)."""
        workdir = (tmp_path or self.root) / name
        workdir.mkdir(parents=True, exist_ok=True)
        # The broker gets the tokens' verifiers, never the tokens (broker_contracts.token_verifier).
        token_verifier_file = workdir / TOKEN_VERIFIER_FILE
        token_verifier_file.write_text(token_verifier(token) + "\n")
        backend_token_verifier_file = workdir / BACKEND_TOKEN_VERIFIER_FILE
        backend_token_verifier_file.write_text(token_verifier(backend_token) + "\n")
        host = host or loopback_host()
        port = port or free_port(host)
        argv = broker_argv(
            host=host,
            port=port,
            name=name,
            data_dir=data_dir or workdir / "data",
            backend_url=backend_url,
            cloud_url=cloud_url,
            token_verifier_file=token_verifier_file,
            backend_token_verifier_file=backend_token_verifier_file,
            cluster=cluster,
            account=account,
            company=company,
            lease_seconds=lease_seconds,
            max_lease_seconds=max_lease_seconds,
            max_deliveries=max_deliveries,
            on_poison=on_poison,
            message_log_dir=message_log_dir,
            extra=[*extra_args, *(() if admin_port is None else ("--admin-port", str(admin_port)))],
        )
        launched = _launch(
            name,
            argv,
            host,
            port,
            workdir,
            ready_context=ready_context,
            caller_tls=caller_tls,
            admin_port=admin_port,
        )
        return self._track(launched, timeout)

    def start_backend_simulator(
        self,
        tmp_path: Path | None = None,
        *,
        name: str = "backend",
        broker_urls: Sequence[str] = (),
        streams: int = 4,
        messages_per_stream: int = 100,
        bundle_size: int = 100,
        per_stream_in_bundle: int = 10,
        payload_bytes: int = 100,
        lanes: int = 4,
        account: str = "acme",
        company: str = "1000",
        autostart: bool = False,
        poison: Sequence[str] = (),
        backend_token: str = DEFAULT_BACKEND_TOKEN,
        extra_args: Sequence[str] = (),
        timeout: float = 20.0,
        host: str | None = None,
        ready_context: ssl.SSLContext | None = None,
        caller_tls: CallerTls | None = None,
    ) -> RunningProcess:
        """A ``backend-simulator``; it sends only after ``POST /sim/start`` unless ``autostart``.
        ``ready_context``: it serves HTTPS (``--tls-dir`` in ``extra_args``); ``caller_tls``: how to
        call it then."""
        workdir = (tmp_path or self.root) / name
        workdir.mkdir(parents=True, exist_ok=True)
        token_file = workdir / "backend-token"
        token_file.write_text(backend_token + "\n")
        host = host or loopback_host()
        port = free_port(host)
        argv = [
            PYTHON,
            "-m",
            "broker_simulators.backend",
            "--host",
            host,
            "--port",
            str(port),
            "--account",
            account,
            "--company",
            company,
            "--streams",
            str(streams),
            "--messages-per-stream",
            str(messages_per_stream),
            "--bundle-size",
            str(bundle_size),
            "--per-stream-in-bundle",
            str(per_stream_in_bundle),
            "--payload-bytes",
            str(payload_bytes),
            "--lanes",
            str(lanes),
            "--record-dir",
            str(workdir),
            "--backend-token-file",
            str(token_file),
        ]
        for url in broker_urls:
            argv += ["--broker-url", url]
        for spec in poison:
            argv += ["--poison", spec]
        if autostart:
            argv.append("--autostart")
        return self._track(
            _launch(
                name,
                argv + list(extra_args),
                host,
                port,
                workdir,
                ready_context=ready_context,
                caller_tls=caller_tls,
            ),
            timeout,
        )

    def start_cloud_simulator(
        self,
        tmp_path: Path | None = None,
        *,
        name: str = "cloud",
        inbound_streams: int = 0,
        inbound_messages_per_stream: int = 0,
        poison: Sequence[str] = (),
        extra_args: Sequence[str] = (),
        timeout: float = 20.0,
        host: str | None = None,
        ready_context: ssl.SSLContext | None = None,
        caller_tls: CallerTls | None = None,
    ) -> RunningProcess:
        """A ``cloud-simulator``; ``ready_context``: it serves HTTPS (``--tls-dir`` in ``extra_args``),
        ``caller_tls``: how to call it then."""
        workdir = (tmp_path or self.root) / name
        host = host or loopback_host()
        port = free_port(host)
        argv = [
            PYTHON,
            "-m",
            "broker_simulators.cloud",
            "--host",
            host,
            "--port",
            str(port),
            "--inbound-streams",
            str(inbound_streams),
            "--inbound-messages-per-stream",
            str(inbound_messages_per_stream),
            "--record-dir",
            str(workdir),
        ]
        for spec in poison:
            argv += ["--poison", spec]
        return self._track(
            _launch(
                name,
                argv + list(extra_args),
                host,
                port,
                workdir,
                ready_context=ready_context,
                caller_tls=caller_tls,
            ),
            timeout,
        )

    def stop_all(self) -> None:
        for process in reversed(self.started):
            process.stop()
        self.started.clear()


@contextlib.contextmanager
def running(root: Path) -> Iterator[ProcessSet]:
    """A :class:`ProcessSet` that stops everything it started on exit (for scripts and benchmarks)."""
    processes = ProcessSet(root)
    try:
        yield processes
    finally:
        processes.stop_all()


# Module-level conveniences with the promised signatures: ``start_broker(tmp_path, name=..., ...)``.
# Processes started this way are tracked here; stop them with ``.stop()`` or :func:`stop_all_started`
# (call it in your fixture's teardown). An atexit hook stops any that are left, as a last resort.
_STARTED = ProcessSet(Path("."))
atexit.register(_STARTED.stop_all)


def start_broker(tmp_path: Path, **options: Any) -> RunningProcess:
    """A broker process (Inactive) under ``tmp_path/<name>``; see :meth:`ProcessSet.start_broker`."""
    return _STARTED.start_broker(tmp_path, **options)


def start_backend_simulator(tmp_path: Path, **options: Any) -> RunningProcess:
    """See :meth:`ProcessSet.start_backend_simulator`."""
    return _STARTED.start_backend_simulator(tmp_path, **options)


def start_cloud_simulator(tmp_path: Path, **options: Any) -> RunningProcess:
    """See :meth:`ProcessSet.start_cloud_simulator`."""
    return _STARTED.start_cloud_simulator(tmp_path, **options)


def stop_all_started() -> None:
    """Stop every process the module-level ``start_*`` functions started."""
    _STARTED.stop_all()
