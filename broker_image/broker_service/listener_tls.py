"""The broker's two TLS listeners' contexts, each following the mounted files (``--tls-dir``).

One :class:`~broker_contracts.tls.ReloadingServerContext` per port, built from the same
certificate and key and differing in whom they trust:

* **admin port** (the operator's calls, the watch stream): a client certificate is required and
  verified against the directory's ``ca.crt``; the operator's bearer credential is still checked
  after it, as a second factor (``server.py``);
* **main port** (``SendMessages`` from the backend through the ``-active`` Service, kubelet
  probes, ``/metrics``): with ``--client-ca-file`` a client certificate is asked for and verified
  when presented, but none is fine, since probes present none; whether ``SendMessages`` needs
  one is ``--allowed-client-subjects`` (``server.py``). Without it, no certificate is asked for.

:meth:`ListenerTls.poll` checks both every ``--tls-reload-seconds`` and keeps the metrics in step:
``broker_tls_serving_certificate{listener,serial}`` is 1 for the serial each listener serves now,
``broker_tls_reloads_total`` and ``broker_tls_reload_failures_total`` count swaps and contents that
did not load (the log says which and why, once per problem).

Not here: the swap itself (``broker_contracts.tls.reloading``), the sites (``listener.py``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import partial

from broker_contracts.tls import ClientCertificates, ReloadingServerContext, server_context
from broker_service.metrics import BrokerMetrics
from broker_service.tls_settings import ListenerTlsSettings


@dataclass
class ListenerTls:
    main: ReloadingServerContext
    admin: ReloadingServerContext
    settings: ListenerTlsSettings

    @classmethod
    def from_settings(cls, tls: ListenerTlsSettings, *, port: int, admin_port: int) -> ListenerTls:
        """Both contexts, built now (raises ``TlsFilesError`` if the files no longer load)."""
        files = tls.files
        served = [files.cert, files.key]
        main_mode = ClientCertificates.NONE if tls.client_ca_file is None else ClientCertificates.OPTIONAL
        main = ReloadingServerContext(
            f"main port {port}",
            partial(
                server_context,
                files.cert,
                files.key,
                client_certificates=main_mode,
                client_ca_file=tls.client_ca_file,
            ),
            served if tls.client_ca_file is None else [*served, tls.client_ca_file],
            files.cert,
        )
        admin = ReloadingServerContext(
            f"admin port {admin_port}",
            partial(
                server_context,
                files.cert,
                files.key,
                client_certificates=ClientCertificates.REQUIRED,
                client_ca_file=files.ca,
            ),
            [*served, files.ca],
            files.cert,
        )
        return cls(main=main, admin=admin, settings=tls)

    def _listeners(self) -> dict[str, ReloadingServerContext]:
        return {"main": self.main, "admin": self.admin}

    def export(self, metrics: BrokerMetrics) -> None:
        """Set the serving-certificate gauge to the serial each listener serves now."""
        metrics.tls_serving_certificate.clear()
        for listener, context in self._listeners().items():
            metrics.tls_serving_certificate.labels(listener=listener, serial=context.serial).set(1)

    async def poll(self, metrics: BrokerMetrics) -> None:
        """Check both listeners' files every ``--tls-reload-seconds``, until cancelled."""
        self.export(metrics)
        while True:
            await asyncio.sleep(self.settings.reload_seconds)
            for listener, context in self._listeners().items():
                failures = context.failures
                if context.check():
                    metrics.tls_reloads.labels(listener=listener).inc()
                    self.export(metrics)
                if context.failures > failures:
                    metrics.tls_reload_failures.labels(listener=listener).inc(context.failures - failures)
