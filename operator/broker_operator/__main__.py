"""``broker-operator``: the kopf operator that runs BrokerClusters, with Prometheus metrics over HTTP.

Reads its settings once (flags, each with an environment variable; see
``controller/settings.py``), sets the log format and level for its own lines
and kopf's (``kopf_logging.py``), builds the Kubernetes client from the in-cluster
service account or the kubeconfig (``KUBECONFIG``), registers the controller's
handlers into a registry of its own, serves the failover engine's metrics on
``/metrics`` and hands control to kopf until SIGINT/SIGTERM.

It does not decide anything itself: see ``controller/`` for Kubernetes and
``engine.py`` for failover.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any

import kopf
import kubernetes
import prometheus_client

from broker_operator.controller.context import MEMO_KEY, ControllerContext
from broker_operator.controller.handlers import configure_kopf, register_handlers
from broker_operator.controller.kube import KubeApi
from broker_operator.controller.settings import ControllerSettings, parse_settings
from broker_operator.garbage_collection import freeze_long_lived_objects, tune_collector
from broker_operator.kopf_logging import configure_operator_logging

# Connections kept to the API server. The client's default (5 per CPU: 10 here) is fewer than the
# threads that may call it at once (asyncio's worker threads, kopf's executor), and each connection
# it cannot keep is a new TLS handshake: at 2,000 clusters that was a fifth of the operator's CPU.
API_CONNECTIONS = 32
# Threads for the engines' API calls (ControllerContext.engine_api), beside asyncio's for the reconciles.
ENGINE_API_THREADS = 4


def load_api_client() -> kubernetes.client.ApiClient:
    """The kubeconfig (``KUBECONFIG``, else ``~/.kube/config``) when there is one, else the in-cluster
    service account: the order of ``kubernetes.config.load_config``, which, in a pod, also prints a
    line of its own to stdout, outside the log format (a non-JSON line in a JSON log)."""
    kubeconfig = os.path.expanduser(kubernetes.config.KUBE_CONFIG_DEFAULT_LOCATION)
    if os.path.exists(kubeconfig):
        kubernetes.config.load_kube_config(config_file=kubeconfig)
    else:
        kubernetes.config.load_incluster_config()
    configuration = kubernetes.client.Configuration.get_default_copy()
    configuration.connection_pool_maxsize = API_CONNECTIONS
    return kubernetes.client.ApiClient(configuration)


def register_gc_freeze(registry: kopf.OperatorRegistry, clusters_started_within: float) -> None:
    """Freeze once kopf has started, and again once the existing clusters' engines have started.

    The first freeze covers the start-up objects; the engines of the BrokerClusters that
    already exist start within ``clusters_started_within`` seconds (the daemons' start-up
    grace, see ``controller/daemon.py``), and their long-lived state is frozen then.
    Not part of ``register_handlers``: tests run the handlers inside pytest's process,
    whose collector they have no business changing.
    """

    @kopf.on.startup(registry=registry)
    async def freeze_start_up_objects(**_: Any) -> None:
        freeze_long_lived_objects()
        asyncio.get_running_loop().call_later(clusters_started_within + 5.0, freeze_long_lived_objects)


def run_operator(settings: ControllerSettings, api_client: kubernetes.client.ApiClient) -> None:
    """Run kopf with the controller's handlers until it is told to stop."""
    # The process-wide registry is the one with kopf's fallback logins (kubeconfig, service account).
    registry = kopf.get_default_registry()
    register_handlers(registry, reconcile_seconds=settings.reconcile_seconds)
    register_gc_freeze(registry, settings.startup_grace_seconds)
    kopf_settings = kopf.OperatorSettings()
    configure_kopf(kopf_settings)
    if settings.metrics_port:
        # The engine's counters and gauges live in prometheus_client's default registry.
        import broker_operator.metrics  # noqa: F401  (registers the engine's metrics)

        prometheus_client.start_http_server(settings.metrics_port, settings.metrics_host)
    api = KubeApi(api_client)
    context = ControllerContext(
        settings=settings, api=api, engine_api=api.lane(ENGINE_API_THREADS, "kube-engine")
    )
    kopf.run(
        registry=registry,
        settings=kopf_settings,
        memo=kopf.Memo({MEMO_KEY: context}),
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        standalone=settings.peering is None,
        peering_name=settings.peering,
        liveness_endpoint=settings.liveness_endpoint,
    )


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse_settings(argv, os.environ)
    configure_operator_logging(settings.log)
    tune_collector()
    run_operator(settings, load_api_client())


if __name__ == "__main__":
    main()
