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
did not load (the log says which and why, once per problem); ``broker_tls_trust_bundle{listener,
version}`` is 1 for the version of the admin port's ``ca.crt`` its live context trusts.

:meth:`ListenerTls.trust_bundle_version` is that version, which the admin port's replies carry in
the ``X-Broker-Trust-Bundle`` header (``server.py``): the operator waits for it during a CA key
replacement (``broker_operator.pki.replacement``), since only the broker knows when the kubelet's
update of the Secret volume has reached its live context.

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
            trust_file=files.ca,
        )
        return cls(main=main, admin=admin, settings=tls)

    def _listeners(self) -> dict[str, ReloadingServerContext]:
        return {"main": self.main, "admin": self.admin}

    @property
    def trust_bundle_version(self) -> str | None:
        """The version of the CA bundle the admin port's live context verifies client certificates by."""
        return self.admin.trust_bundle_version

    def export(self, metrics: BrokerMetrics) -> None:
        """Set the serving-certificate gauge to the serial each listener serves now, and the
        trust-bundle gauge to the bundle the admin port trusts."""
        metrics.tls_serving_certificate.clear()
        metrics.tls_trust_bundle.clear()
        for listener, context in self._listeners().items():
            metrics.tls_serving_certificate.labels(listener=listener, serial=context.serial).set(1)
            trusted = context.trust_bundle_version
            if trusted is not None:
                metrics.tls_trust_bundle.labels(listener=listener, version=trusted).set(1)

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
