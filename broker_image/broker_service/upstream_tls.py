"""The trust the broker's calls to the backend and the cloud verify against, following its file.

``https://`` backend and cloud URLs are verified against ``--upstream-ca-file`` (a mounted Secret
volume, ``spec.tls.upstreamCASecretRef``), or the system's trust store without it
(:func:`upstream_trust`). The file is followed like the listeners' files are: when the customer's
CA changes (a new CA beside the old one, then certificates of the new one), the broker must take
it without a restart, since a restart of the active broker is a failover. So
:func:`follow_upstream_trust` checks the file every ``--tls-reload-seconds`` (whether or not the
listeners serve TLS) and the relay client takes the newest context for every call
(``relay_client.py``). A swap is counted in ``broker_tls_reloads_total{listener="upstream"}``, a
changed file that did not load in ``broker_tls_reload_failures_total{listener="upstream"}`` (and
logged once per problem, keeping the trust it had; ``broker_contracts.tls.reloading_client``).

Not here: the listeners' files (``listener_tls.py``), checking the file at start
(``tls_settings.py``).
"""

from __future__ import annotations

import asyncio
from typing import Final

from broker_contracts.tls import ReloadingClientContext
from broker_service.metrics import BrokerMetrics
from broker_service.settings import BrokerSettings

UPSTREAM: Final = "upstream"  # the metrics' listener label, and the name in log lines


def upstream_trust(settings: BrokerSettings) -> ReloadingClientContext | None:
    """The context ``https://`` targets are verified with; None when no target URL is ``https://``
    (then building one, and reading the system's store, is work for nothing). Raises
    ``TlsFilesError`` if ``--upstream-ca-file`` no longer loads (``parse_settings`` checked it)."""
    urls = (settings.backend_url, settings.cloud_url)
    if not any(url.lower().startswith("https://") for url in urls):
        return None
    return ReloadingClientContext(UPSTREAM, ca_file=settings.upstream_ca_file)


async def follow_upstream_trust(
    trust: ReloadingClientContext, reload_seconds: float, metrics: BrokerMetrics
) -> None:
    """Check the upstream bundle every ``reload_seconds`` and count what happened, until cancelled."""
    while True:
        await asyncio.sleep(reload_seconds)
        failures = trust.failures
        if trust.check():
            metrics.tls_reloads.labels(listener=UPSTREAM).inc()
        if trust.failures > failures:
            metrics.tls_reload_failures.labels(listener=UPSTREAM).inc(trust.failures - failures)
