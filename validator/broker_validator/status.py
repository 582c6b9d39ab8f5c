"""Writes each validated BrokerCluster's ``status.ordering``, the ORDERING column of ``kubectl get bc``.

Which clusters: the report's, that is the store's top-level directory names, which are the names
of BrokerClusters in the validator's own namespace (brokers write ``<store>/<cluster>/...``). For
each, one JSON merge patch on the ``status`` subresource carrying ``status.ordering`` alone
(``lastCheckTime``, ``result``, ``violations``, ``report``): a merge patch replaces only the keys it
names, so the operator's fields (phase, active, epoch, brokers, conditions, ...) are never read,
sent or overwritten, and no resourceVersion race with the operator's own status writes can arise.

A directory whose BrokerCluster does not exist (deleted since, or a store shared by mistake) is
skipped with a warning: the report still holds its verdict. Any other API failure raises
:class:`OrderingStatusError` naming the cluster, the HTTP status and what to do; the CLI decides
the exit code. Authentication is the pod's service account (in-cluster config) or ``KUBECONFIG``.

What this module does not do: create or read BrokerClusters beyond the patch, write anything when
the report has no clusters, or decide the verdict (the report carries it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Final, TypedDict

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from urllib3.exceptions import HTTPError

from broker_validator.report_schema import Report

GROUP: Final = "broker.failover.dev"
VERSION: Final = "v1alpha1"
PLURAL: Final = "brokerclusters"
REQUEST_TIMEOUT_SECONDS: Final = 15
HTTP_FORBIDDEN: Final = 403
HTTP_NOT_FOUND: Final = 404

log = logging.getLogger(__name__)


class OrderingStatus(TypedDict):
    """``status.ordering`` of a BrokerCluster, as the CRD declares it."""

    lastCheckTime: str  # RFC 3339, UTC, whole seconds
    result: str  # Passed | Failed
    violations: int
    report: str  # where the report is, for people


class OrderingStatusError(RuntimeError):
    """``status.ordering`` could not be written (other than for a BrokerCluster that is gone)."""


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_time(report: Report) -> str:
    """When the run checked: the report's ``generatedAt``, normalised to RFC 3339 (now if unreadable)."""
    try:
        generated = datetime.fromisoformat(report["generatedAt"].replace("Z", "+00:00"))
    except (KeyError, TypeError, ValueError):
        return rfc3339(datetime.now(UTC))
    if generated.tzinfo is None:
        generated = generated.replace(tzinfo=UTC)
    return rfc3339(generated)


def ordering_statuses(report: Report, report_location: str) -> dict[str, OrderingStatus]:
    """BrokerCluster name -> the ``status.ordering`` its report section gives it."""
    checked = check_time(report)
    return {
        name: {
            "lastCheckTime": checked,
            "result": cluster["result"],
            "violations": int(cluster["violations"]),
            "report": report_location,
        }
        for name, cluster in sorted(report["clusters"].items())
    }


def default_api_client() -> client.ApiClient:
    """In-cluster config (the pod's service account), else ``KUBECONFIG`` / ``~/.kube/config``."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except ConfigException:
        try:
            return config.new_client_from_config()
        except (ConfigException, OSError) as error:
            raise OrderingStatusError(
                "no Kubernetes credentials to write status.ordering with: not in a pod with a "
                f"service account, and no usable KUBECONFIG ({error})"
            ) from error
    return client.ApiClient(configuration)


def _explain(error: ApiException, name: str, namespace: str) -> str:
    where = f"BrokerCluster {namespace}/{name}"
    if error.status == HTTP_FORBIDDEN:
        return (
            f"{where}: status.ordering not written: forbidden (403). The validator's service account "
            f"needs `patch` on {PLURAL}/status in {namespace} (the chart's validator Role grants it)"
        )
    return f"{where}: status.ordering not written: HTTP {error.status} {error.reason}: {error.body!r}"


def record_ordering(
    report: Report,
    namespace: str,
    report_location: str,
    *,
    api_client_factory: Callable[[], client.ApiClient] = default_api_client,
) -> list[str]:
    """Patch ``status.ordering`` of every BrokerCluster in ``report``; return the warnings.

    A missing BrokerCluster is a warning; any other failure raises :class:`OrderingStatusError`
    after the clusters before it were written (each patch stands alone, so a retry is harmless).
    """
    statuses = ordering_statuses(report, report_location)
    if not statuses:
        return []
    warnings: list[str] = []
    with api_client_factory() as api_client:
        custom = client.CustomObjectsApi(api_client)
        for name, ordering in statuses.items():
            try:
                custom.patch_namespaced_custom_object_status(
                    GROUP,
                    VERSION,
                    namespace,
                    PLURAL,
                    name,
                    {"status": {"ordering": dict(ordering)}},
                    _content_type="application/merge-patch+json",
                    _request_timeout=REQUEST_TIMEOUT_SECONDS,
                )
            except ApiException as error:
                if error.status == HTTP_NOT_FOUND:
                    warning = (
                        f"store directory {name!r} names no BrokerCluster in namespace {namespace}; "
                        "its verdict is in the report only"
                    )
                    log.warning(warning)
                    warnings.append(warning)
                    continue
                raise OrderingStatusError(_explain(error, name, namespace)) from error
            except (HTTPError, OSError) as error:
                raise OrderingStatusError(
                    f"BrokerCluster {namespace}/{name}: status.ordering not written: "
                    f"the API server did not answer ({error})"
                ) from error
    return warnings
