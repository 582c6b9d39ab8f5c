"""The NetworkPolicy each BrokerCluster gets, ``<cluster>-brokers-ingress``: who may reach the
brokers' two ports, and where the brokers may send (issue 39: on by default, with egress rules).
docs/operator.md has the rules and why; ``reconcile.ensure_network_policy`` writes it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from broker_operator.controller import names
from broker_operator.controller.builders import Manifest, cluster_labels, owned_meta
from broker_operator.controller.spec import ClusterSpec


@dataclass(frozen=True)
class OperatorPods:
    """Who the operator is on the pod network: its pods' namespace and labels (from its settings)."""

    namespace: str
    labels: tuple[tuple[str, str], ...] = ()

    def peer(self) -> Manifest:
        """The NetworkPolicyPeer of the operator's pods; every pod of its namespace without labels."""
        peer: Manifest = {"namespaceSelector": {"matchLabels": {names.LABEL_NAMESPACE_NAME: self.namespace}}}
        if self.labels:
            peer["podSelector"] = {"matchLabels": dict(self.labels)}
        return peer


# Where brokers may send when spec.networkPolicy.egressTo lists nothing: the backend, the cloud and
# an S3 message-log store may be anywhere, in the cluster (any pod: the peers' own policies decide)
# or outside it, so every address except the link-local ranges, where clouds serve instance
# metadata and with it the node's credentials (169.254.169.254, fd00:ec2::254).
DEFAULT_EGRESS_PEERS: Final[tuple[Manifest, ...]] = (
    {"namespaceSelector": {}},
    {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16"]}},
    {"ipBlock": {"cidr": "::/0", "except": ["fe80::/10", "fd00:ec2::254/128"]}},
)
# DNS to any address: CoreDNS behind its Service, or a node-local cache on a link-local address.
DNS_EGRESS: Final[Manifest] = {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}


def build_network_policy(owner: Mapping[str, Any], spec: ClusterSpec, operator: OperatorPods) -> Manifest:
    """``<cluster>-brokers-ingress``: the admin port from the operator only, the main port from the
    listed sources (``spec.networkPolicy.sendMessagesFrom``; every source when it is absent); and
    egress to DNS and, over TCP, to ``spec.networkPolicy.egressTo`` (the backend, the cloud, an S3
    message-log store), or when that is absent to :data:`DEFAULT_EGRESS_PEERS`.

    The operator is admitted to the main port too when sources are listed: it sends nothing there
    (its token opens no SendMessages), but a pod created before brokers had an admin port takes
    its heartbeats there until the rollout replaces it. Ports are named, so the policy follows the
    container's ports. Probes come from the kubelet on the node, which most network plugins admit
    whatever the policy says (docs/crd.md). A message-log volume (RWX) is mounted by the kubelet,
    not reached by the pod, so it needs no egress rule.
    """
    cluster = owner["metadata"]["name"]
    policy = spec.network_policy
    if policy is None:
        raise ValueError(f"BrokerCluster {cluster} has no spec.networkPolicy enabled: no policy to build")
    main_rule: Manifest = {"ports": [{"protocol": "TCP", "port": names.BROKER_PORT_NAME}]}
    if policy.send_messages_from is not None:
        main_rule["from"] = [*(dict(peer) for peer in policy.send_messages_from), operator.peer()]
    destinations = DEFAULT_EGRESS_PEERS if policy.egress_to is None else policy.egress_to
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": owned_meta(owner, names.network_policy_name(cluster), cluster_labels(cluster)),
        "spec": {
            "podSelector": {"matchLabels": cluster_labels(cluster)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": [operator.peer()],
                    "ports": [{"protocol": "TCP", "port": names.BROKER_ADMIN_PORT_NAME}],
                },
                main_rule,
            ],
            "egress": [
                copy.deepcopy(DNS_EGRESS),
                {"to": copy.deepcopy([dict(peer) for peer in destinations]), "ports": [{"protocol": "TCP"}]},
            ],
        },
    }
