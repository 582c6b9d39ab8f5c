"""``kubectl get <kind> [name] [-l sel] [--field-selector sel] -o json`` as one API request.

Tests, the soak and the benchmarks poll the cluster many times a second while they wait
(pods Ready, the status naming an active, a slice moving). Each ``kubectl`` is a process start, a
kubeconfig load and a TLS handshake, about 0.1 CPU-second on this machine, and one soak recovery
check made ten of them; on two cores that polling was a large part of what an e2e test cost.
``api_path`` turns the same arguments into the resource's API path and query, for a GET over
one long-lived client (``ClusterAccess.get_json``). Kinds not listed here, and any other flag, go
to ``kubectl`` as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from broker_operator.controller.names import GROUP, PLURAL, VERSION

# kubectl's names (singular, plural, short) of the namespaced kinds that are polled, and where
# their collection is: the API's prefix and the resource's plural.
_COLLECTIONS: dict[str, tuple[str, str]] = {}
for _names, _prefix, _resource in (
    (("pod", "pods", "po"), "/api/v1", "pods"),
    (("service", "services", "svc"), "/api/v1", "services"),
    (("pvc", "persistentvolumeclaim", "persistentvolumeclaims"), "/api/v1", "persistentvolumeclaims"),
    (("serviceaccount", "serviceaccounts", "sa"), "/api/v1", "serviceaccounts"),
    (("secret", "secrets"), "/api/v1", "secrets"),
    (("configmap", "configmaps", "cm"), "/api/v1", "configmaps"),
    (("event", "events", "ev"), "/api/v1", "events"),
    (("endpointslice", "endpointslices"), "/apis/discovery.k8s.io/v1", "endpointslices"),
    (("job", "jobs"), "/apis/batch/v1", "jobs"),
    (("cronjob", "cronjobs", "cj"), "/apis/batch/v1", "cronjobs"),
    (("networkpolicy", "networkpolicies", "netpol"), "/apis/networking.k8s.io/v1", "networkpolicies"),
    (("poddisruptionbudget", "poddisruptionbudgets", "pdb"), "/apis/policy/v1", "poddisruptionbudgets"),
    (("brokercluster", PLURAL, "bc"), f"/apis/{GROUP}/{VERSION}", PLURAL),
    (("kopfpeering", "kopfpeerings"), "/apis/kopf.dev/v1", "kopfpeerings"),
):
    for _name in _names:
        _COLLECTIONS[_name] = (_prefix, _resource)

_SELECTORS = {"-l": "labelSelector", "--selector": "labelSelector", "--field-selector": "fieldSelector"}


def api_path(namespace: str, what: Sequence[str]) -> tuple[str, dict[str, str]] | None:
    """The path and query that read what ``kubectl -n NAMESPACE get WHAT -o json`` prints, or None
    for what this does not translate (the caller runs kubectl)."""
    if not what or what[0] not in _COLLECTIONS:
        return None
    prefix, resource = _COLLECTIONS[what[0]]
    path = f"{prefix}/namespaces/{namespace}/{resource}"
    name: str | None = None
    query: dict[str, str] = {}
    rest = list(what[1:])
    while rest:
        word = rest.pop(0)
        if word in _SELECTORS and rest:
            query[_SELECTORS[word]] = rest.pop(0)
        elif not word.startswith("-") and name is None and "/" not in word:
            name = word
        else:
            return None
    if name is not None:
        if query:
            return None  # kubectl refuses a name with a selector; let it say so
        path = f"{path}/{name}"
    return path, query


# Asked for by ``ClusterAccess.get_table``: the server-side printing kubectl itself asks for.
TABLE_ACCEPT = "application/json;as=Table;v=v1;g=meta.k8s.io"


def table_rows(table: dict[str, Any]) -> list[dict[str, str]]:
    """The rows of a ``meta.k8s.io/v1`` Table as ``kubectl get`` prints them without ``-o wide``:
    {COLUMN: cell} for the columns of priority 0, an absent value as an empty cell."""
    columns = [
        (index, str(column["name"]).upper())
        for index, column in enumerate(table.get("columnDefinitions") or [])
        if not column.get("priority")
    ]
    return [
        {name: "" if (cell := row["cells"][index]) is None else str(cell) for index, name in columns}
        for row in table.get("rows") or []
    ]
