"""A RabbitMQ node of its own for the broker benchmark: Debian's ``rabbitmq-server`` on loopback.

Everything the node writes (Mnesia and message store, logs, the Erlang cookie) lives under one
scratch directory, and every address it opens is on 127.0.0.1: the AMQP listener, the Erlang
distribution port and an ``epmd`` started here on a port of its own (so a system epmd, if any,
is neither used nor left behind). Debian's ``/usr/sbin/rabbitmq-server`` wrapper would switch to
the ``rabbitmq`` user and read ``/etc/rabbitmq``; the script it wraps runs as we are, with only
the environment given here. No plugin is enabled (no management listener). With a
:class:`~bench.rabbitmq_tls.RabbitTls` it also listens for AMQPS (mutual TLS) on a port of its own,
and :attr:`RabbitNode.uri` names that listener.

:class:`RabbitNode` is a context manager: leaving it (normally, on an exception or on Ctrl-C)
stops the node with SIGTERM (RabbitMQ's orderly shutdown), then SIGKILLs the process groups of
the node and of its epmd, each after a bounded wait.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from bench.rabbitmq_tls import RabbitTls
from broker_simulators.local_processes import free_port

SERVER_SCRIPT = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
CTL_SCRIPT = Path("/usr/lib/rabbitmq/bin/rabbitmqctl")
EPMD = "epmd"
HOST = "127.0.0.1"
START_TIMEOUT_SECONDS = 90.0
STOP_TIMEOUT_SECONDS = 30.0

CONFIG = """\
listeners.tcp.1 = {host}:{port}
# One node, nothing to cluster with; a small disk limit so a busy scratch disk does not block it.
disk_free_limit.absolute = 100MB
log.file.level = warning
log.console = false
"""


class RabbitNodeError(RuntimeError):
    """The node did not start or did not stay on loopback; the message says what was seen."""


class RabbitNode:
    """One RabbitMQ node under ``workdir``, started on entry and stopped on exit."""

    def __init__(self, workdir: Path, name: str | None = None, tls: RabbitTls | None = None) -> None:
        self.workdir = workdir
        self.tls = tls
        self.tls_port = free_port(HOST) if tls is not None else None
        self.nodename = name or f"bench-{os.getpid()}@localhost"
        self.port = free_port(HOST)
        self.dist_port = free_port(HOST)
        self.epmd_port = free_port(HOST)
        self._epmd: subprocess.Popen[bytes] | None = None
        self._server: subprocess.Popen[bytes] | None = None
        self.beam_pid = 0

    @property
    def uri(self) -> str:
        if self.tls_port is not None:
            return f"amqps://guest:guest@{HOST}:{self.tls_port}/%2F"
        return f"amqp://guest:guest@{HOST}:{self.port}/%2F"

    @property
    def log_dir(self) -> Path:
        return self.workdir / "log"

    def env(self) -> dict[str, str]:
        """The node's environment: our files, our ports, loopback only, and nothing from /etc."""
        w = self.workdir
        keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TERM")}
        return {
            **keep,
            "HOME": str(w),  # the Erlang cookie goes here, not in root's home
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_USE_LONGNAME": "false",
            "RABBITMQ_NODE_IP_ADDRESS": HOST,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_ADDRESS": HOST,
            "ERL_EPMD_PORT": str(self.epmd_port),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "RABBITMQ_CONF_ENV_FILE": str(w / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(w / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(w / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(w / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(w / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.log_dir),
            "RABBITMQ_PID_FILE": str(w / "rabbitmq.pid"),
        }

    def _write_files(self) -> None:
        for sub in ("mnesia", "log"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        (self.workdir / "rabbitmq-env.conf").write_text("# empty: the environment says it all\n")
        config = CONFIG.format(host=HOST, port=self.port)
        if self.tls is not None and self.tls_port is not None:
            config += self.tls.config(HOST, self.tls_port)
        (self.workdir / "rabbitmq.conf").write_text(config)
        (self.workdir / "advanced.config").write_text("[].\n")
        (self.workdir / "enabled_plugins").write_text("[].\n")

    def __enter__(self) -> RabbitNode:
        if not SERVER_SCRIPT.exists():
            raise RabbitNodeError(
                f"{SERVER_SCRIPT} not found: install Debian's rabbitmq-server (`make bench-packages`)"
            )
        self._write_files()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def _start(self) -> None:
        env = self.env()
        with (self.workdir / "epmd.log").open("wb") as epmd_log:  # the child keeps its own copy
            self._epmd = subprocess.Popen(
                [EPMD, "-port", str(self.epmd_port), "-address", HOST],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=epmd_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for_port(self.epmd_port, 10.0, self._epmd, "epmd")
        with (self.workdir / "server.out").open("wb") as server_log:
            self._server = subprocess.Popen(
                [str(SERVER_SCRIPT)],
                cwd=self.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=server_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_for_port(self.port, START_TIMEOUT_SECONDS, self._server, "rabbitmq-server")
        except RabbitNodeError as error:
            raise RabbitNodeError(f"{error}\n{self.log_tail()}") from None
        if self.tls_port is not None:  # opened with the TCP listener; a bad ssl_options fails the boot
            wait_for_port(self.tls_port, 10.0, self._server, "rabbitmq-server's TLS listener")
        self.beam_pid = find_beam(self._server.pid)
        self.check_loopback_only()

    def check_loopback_only(self) -> list[str]:
        """The listening addresses of the node and its epmd; raises unless every one is loopback."""
        pids = [p for p in (self.beam_pid, self._epmd.pid if self._epmd else 0) if p]
        listening = listening_addresses(pids)
        outside = [a for a in listening if not a.startswith(("127.", "[::1]"))]
        if outside or not listening:
            raise RabbitNodeError(f"the node listens on {listening or 'nothing'}; only 127.0.0.1 is allowed")
        return listening

    def queue_counts(self, timeout: float = 60.0) -> dict[str, int]:
        """Messages in each queue, from ``rabbitmqctl list_queues`` (its own Erlang node, which
        must reach ours through our epmd and listen on loopback too)."""
        port = free_port(HOST)
        env = {
            **self.env(),
            "RABBITMQ_CTL_DIST_PORT_MIN": str(port),
            "RABBITMQ_CTL_DIST_PORT_MAX": str(port),
            "RABBITMQ_CTL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }
        argv = [str(CTL_SCRIPT), "-n", self.nodename, "list_queues", "--quiet", "name", "messages"]
        try:
            done = subprocess.run(
                argv, check=False, cwd=self.workdir, env=env, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            raise RabbitNodeError(f"{' '.join(argv)} did not finish in {timeout:.0f}s") from None
        if done.returncode != 0:
            raise RabbitNodeError(f"{' '.join(argv)} exited {done.returncode}: {done.stdout}{done.stderr}")
        rows = [line.split("\t") for line in done.stdout.splitlines()]
        return {row[0]: int(row[1]) for row in rows if len(row) == 2 and row[1].isdigit()}

    def log_tail(self, lines: int = 40) -> str:
        texts = []
        for path in [self.workdir / "server.out", *sorted(self.log_dir.glob("*.log"))]:
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                texts.append(f"--- {path} (end) ---\n" + "\n".join(tail))
        return "\n".join(texts)

    def stop(self) -> None:
        """SIGTERM the node (orderly), then SIGKILL whatever of it and of its epmd is left."""
        if self._server is not None:
            # A node still booting does not act on SIGTERM for a long while: kill it at once.
            stop_group(self._server, STOP_TIMEOUT_SECONDS if self.beam_pid else 0.0)
            self._server = None
        if self._epmd is not None:
            stop_group(self._epmd, 5.0)
            self._epmd = None


def wait_for_port(port: int, timeout: float, process: subprocess.Popen[bytes], what: str) -> None:
    """Until ``HOST:port`` accepts a connection; fails at ``timeout`` or when ``process`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RabbitNodeError(f"{what} exited with {process.returncode} before listening on {port}")
        try:
            with socket.create_connection((HOST, port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.2)
    raise RabbitNodeError(f"{what} did not listen on {HOST}:{port} within {timeout:.0f}s")


def find_beam(script_pid: int, timeout: float = 10.0) -> int:
    """The Erlang VM's pid: the script runs ``erl`` in a child that execs into ``beam.smp``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in [script_pid, *children(script_pid)]:
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "beam.smp":
                    return pid
            except OSError:
                continue
        time.sleep(0.1)
    raise RabbitNodeError(f"no beam.smp among the children of {script_pid} within {timeout:.0f}s")


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def listening_addresses(pids: list[int]) -> list[str]:
    """``host:port`` of each TCP socket in LISTEN state that one of ``pids`` holds."""
    inodes: set[str] = set()
    for pid in pids:
        fd_dir = Path(f"/proc/{pid}/fd")
        try:
            links = [os.readlink(fd) for fd in fd_dir.iterdir()]
        except OSError:
            continue
        inodes |= {link[8:-1] for link in links if link.startswith("socket:[")}
    found = []
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: TCP_LISTEN
                found.append(decode_address(fields[1], v6))
    return sorted(found)


def decode_address(text: str, v6: bool) -> str:
    """``/proc/net/tcp``'s hex ``address:port`` as ``a.b.c.d:port`` (``[v6]:port``)."""
    address, port = text.split(":")
    raw = bytes.fromhex(address)
    if not v6:
        return f"{socket.inet_ntop(socket.AF_INET, raw[::-1])}:{int(port, 16)}"
    # Four little-endian 32-bit words.
    ordered = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return f"[{socket.inet_ntop(socket.AF_INET6, ordered)}]:{int(port, 16)}"


def stop_group(process: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM ``process``, wait up to ``timeout``, then SIGKILL its whole process group."""
    if process.poll() is None and timeout > 0:
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=timeout)
    # Its own session (start_new_session), so the group is the process's pid: whatever it left
    # (beam.smp, erl_child_setup, inet_gethost) goes too.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5.0)
