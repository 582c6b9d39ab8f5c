"""A broker and both simulators on loopback, wired to each other, with TLS on every channel or none.

The relay path as the integration tests and ``make bench-broker`` run it: backend simulator →
broker main port (``SendMessages``) → cloud simulator, and back (the broker's resend request,
confirmations and inbound deliveries to the backend simulator). With a :class:`LocalPki` every
leg is TLS, as ARCHITECTURE.md "Channels and trust" has it in a cluster:

* the broker serves both ports with the run's certificate, its admin port requiring the operator's
  client certificate, and (``allowed_subjects``, the default) its main port the backend's;
* the backend simulator calls ``https://`` broker URLs, verifying against the run's CA and
  presenting the backend's client certificate (``--broker-ca-file``, ``--client-cert-file``);
* both simulators serve HTTPS, and the broker verifies them (``--upstream-ca-file``).

Every listener then speaks TLS only, so a leg that went plain would fail, not pass unnoticed.
Without a PKI each ``start_*`` here is exactly :class:`~broker_simulators.local_processes.ProcessSet`'s.

Each process gets its address first, then its certificate (which names that address), then is
started: a client verifies the address it dialled. The returned processes carry
``caller_tls`` (the broker's with the operator's certificate) and the broker its ``admin_port``,
so that a caller heartbeats ``broker.admin_url`` with ``broker.caller_tls``.

Not here: assertions, SOAP clients (``tests/integration/broker/helpers.py``), or the operator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker_simulators.local_processes import ProcessSet, RunningProcess, free_port, loopback_host
from local_cluster.run_pki import LocalPki


@dataclass(frozen=True)
class LoopbackRelay:
    backend: RunningProcess
    cloud: RunningProcess
    broker: RunningProcess
    pki: LocalPki | None  # None: plain HTTP on every leg


def _with_args(options: dict[str, Any], tls_args: list[str]) -> dict[str, Any]:
    return {**options, "extra_args": [*tls_args, *options.get("extra_args", ())]}


def start_broker(
    processes: ProcessSet, root: Path, pki: LocalPki | None, *, allowed_subjects: bool = True, **options: Any
) -> RunningProcess:
    """:meth:`ProcessSet.start_broker`; with ``pki``, serving TLS on its main and admin ports."""
    if pki is None:
        return processes.start_broker(root, **options)
    host = options.pop("host", None) or loopback_host()
    admin_port = options.pop("admin_port", None) or free_port(host)
    tls_dir = pki.serving_dir(options.get("name", "broker-0"), host)
    return processes.start_broker(
        root,
        host=host,
        admin_port=admin_port,
        ready_context=pki.readiness_context(),
        caller_tls=pki.caller(operator=True),
        **_with_args(options, pki.broker_args(tls_dir, allowed_subjects=allowed_subjects)),
    )


def start_backend_simulator(
    processes: ProcessSet,
    root: Path,
    pki: LocalPki | None,
    *,
    client_certificate: bool = True,
    **options: Any,
) -> RunningProcess:
    """:meth:`ProcessSet.start_backend_simulator`; with ``pki``, serving HTTPS and calling
    ``https://`` brokers with the backend's client certificate (unless ``client_certificate``
    is false)."""
    if pki is None:
        return processes.start_backend_simulator(root, **options)
    host = options.pop("host", None) or loopback_host()
    tls_dir = pki.serving_dir(options.get("name", "backend"), host)
    tls_args = ["--tls-dir", str(tls_dir.path), *pki.backend_args(client_certificate=client_certificate)]
    return processes.start_backend_simulator(
        root,
        host=host,
        ready_context=pki.readiness_context(),
        caller_tls=pki.caller(),
        **_with_args(options, tls_args),
    )


def start_cloud_simulator(
    processes: ProcessSet, root: Path, pki: LocalPki | None, **options: Any
) -> RunningProcess:
    """:meth:`ProcessSet.start_cloud_simulator`; with ``pki``, serving HTTPS."""
    if pki is None:
        return processes.start_cloud_simulator(root, **options)
    host = options.pop("host", None) or loopback_host()
    tls_dir = pki.serving_dir(options.get("name", "cloud"), host)
    return processes.start_cloud_simulator(
        root,
        host=host,
        ready_context=pki.readiness_context(),
        caller_tls=pki.caller(),
        **_with_args(options, ["--tls-dir", str(tls_dir.path)]),
    )


def start_relay(
    processes: ProcessSet,
    root: Path,
    *,
    pki: LocalPki | None = None,
    streams: int = 4,
    messages_per_stream: int = 50,
    backend_args: Mapping[str, Any] | None = None,
    cloud_args: Mapping[str, Any] | None = None,
    broker_args: Mapping[str, Any] | None = None,
) -> LoopbackRelay:
    """The cloud simulator, the backend simulator pointed at a broker, and that broker (Inactive),
    in that order (the broker needs both URLs, the backend the broker's address)."""
    broker_options = dict(broker_args or {})
    host = broker_options.pop("host", None) or loopback_host()
    port = broker_options.pop("port", None) or free_port(host)
    scheme = "http" if pki is None else "https"
    cloud = start_cloud_simulator(processes, root, pki, **(cloud_args or {}))
    backend = start_backend_simulator(
        processes,
        root,
        pki,
        broker_urls=[f"{scheme}://{host}:{port}"],
        streams=streams,
        messages_per_stream=messages_per_stream,
        **(backend_args or {}),
    )
    broker = start_broker(
        processes,
        root,
        pki,
        backend_url=backend.url,
        cloud_url=cloud.url,
        host=host,
        port=port,
        **broker_options,
    )
    return LoopbackRelay(backend=backend, cloud=cloud, broker=broker, pki=pki)
