"""The DNS names the brokers' server certificate carries, and the check every DNS name passes.

A client verifies the name it dialled against the certificate's subjectAltName, so the
certificate must carry every name a client may dial:

- the ``<cluster>-active`` Service, the backend's (SAP's) address, in all four forms a pod's
  resolver completes (``<svc>``, ``<svc>.<ns>``, ``<svc>.<ns>.svc``, ``<svc>.<ns>.svc.<domain>``):
  a client in the same namespace may use the short one;
- each broker pod under the headless Service (``<cluster>-<i>.<cluster>-brokers...``, the same
  four forms): the operator and peers reach one broker, not whichever is active;
- the headless Service itself, fully qualified.

The fully qualified ``-active`` name comes first: ``authority.issue_server`` makes the first name
the commonName, which older clients compare. The cluster domain is a setting
(``cluster.local`` unless the cluster was set up otherwise); a change of it, or of the brokers,
changes the names and so makes ``renewal`` reissue the certificate.

Pod IPs are left out on purpose: they change with every restart, and a certificate that had to
follow them would be reissued at every failover. A caller that connects by IP verifies the pod's
DNS name instead (``server_hostname`` in Python's ``ssl``).

What it does not do: resolve anything, or know how many brokers there are (the caller passes
the ordinals the spec has).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from broker_operator.controller import names as k8s_names

__all__ = ["DEFAULT_CLUSTER_DOMAIN", "check_dns_names", "server_dns_names"]

DEFAULT_CLUSTER_DOMAIN: Final = "cluster.local"
_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_NAME_MAX: Final = 253


def check_dns_names(dns_names: Iterable[str]) -> tuple[str, ...]:
    """``dns_names`` lowercased, duplicates dropped, order kept; a ValueError names a bad one.

    Only plain hostnames (RFC 1123 labels): no wildcard, no IP address, no trailing dot, which is
    all the names above need and keeps a SAN comparison a set comparison.
    """
    checked: dict[str, None] = {}
    for raw in dns_names:
        if not isinstance(raw, str):
            raise ValueError(f"a DNS name must be a string, got {type(raw).__name__}: {raw!r}")
        name = raw.lower()
        labels = name.split(".")
        if len(name) > _NAME_MAX or not all(_LABEL.fullmatch(label) for label in labels):
            raise ValueError(
                f"{raw!r} is not a DNS name a certificate can carry: labels of a-z, 0-9 and '-' "
                f"(1 to 63 characters, no '-' at either end), {_NAME_MAX} characters in all"
            )
        checked[name] = None
    return tuple(checked)


def _service_forms(host: str, namespace: str, cluster_domain: str) -> list[str]:
    return [
        f"{host}.{namespace}.svc.{cluster_domain}",
        f"{host}.{namespace}.svc",
        f"{host}.{namespace}",
        host,
    ]


def server_dns_names(
    cluster: str,
    namespace: str,
    ordinals: Iterable[int],
    *,
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN,
) -> tuple[str, ...]:
    """Every name of ``cluster``'s brokers in ``namespace``, the ``-active`` Service's first."""
    (domain,) = check_dns_names([cluster_domain])
    headless = k8s_names.headless_service_name(cluster)
    wanted = _service_forms(k8s_names.active_service_name(cluster), namespace, domain)
    wanted.append(f"{headless}.{namespace}.svc.{domain}")
    for ordinal in sorted(set(ordinals)):
        if ordinal < 0:
            raise ValueError(f"a broker ordinal ({ordinal}) is never negative")
        wanted += _service_forms(f"{k8s_names.pod_name(cluster, ordinal)}.{headless}", namespace, domain)
    return check_dns_names(wanted)
