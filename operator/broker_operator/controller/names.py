"""The Kubernetes names the controller and the CRD agree on: group, labels, ports, paths.

One place for every string that appears both in ``crds/`` and in the code that
builds or selects objects, so that a rename is one edit. This module holds
constants and the child-object naming functions only; no I/O.
"""

from __future__ import annotations

from typing import Final

from broker_contracts.soap import SOAP_PATH

GROUP: Final = "broker.failover.dev"
VERSION: Final = "v1alpha1"
PLURAL: Final = "brokerclusters"
KIND: Final = "BrokerCluster"
API_VERSION: Final = f"{GROUP}/{VERSION}"
# kopf's peering objects (crds/kopf.dev_peerings.yaml): one per watched namespace, or one cluster-wide.
KOPF_GROUP: Final = "kopf.dev"
KOPF_VERSION: Final = "v1"
PEERINGS: Final = "kopfpeerings"
CLUSTER_PEERINGS: Final = "clusterkopfpeerings"

# Labels on every managed pod. `role` follows the active for people and `kubectl get pods -l`;
# the `<name>-active` Service does not select on it (the operator writes its EndpointSlice).
LABEL_APP: Final = "app.kubernetes.io/name"
APP_BROKER: Final = "broker"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "broker-failover-operator"
LABEL_CLUSTER: Final = f"{GROUP}/cluster"
LABEL_ORDINAL: Final = f"{GROUP}/ordinal"
LABEL_ROLE: Final = "role"
ROLE_ACTIVE: Final = "active"
ROLE_STANDBY: Final = "standby"
# The opt-in a Secret must carry before the operator uses it as a credential (credentials.py): sends
# it as a bearer token or mounts it into a broker pod. Without it a BrokerCluster's author could
# name any Secret of the namespace and have the operator hand its value to a server of their own.
LABEL_CREDENTIAL: Final = f"{GROUP}/credential"
CREDENTIAL_OPT_IN: Final = "true"
# Who the BrokerCluster's events are from (`kubectl describe`), the engine's and kopf's alike.
EVENT_COMPONENT: Final = "broker-failover-operator"

# The pod template's hash: a spec change shows up as pods whose hash differs (see rollout.py).
ANNOTATION_TEMPLATE_HASH: Final = f"{GROUP}/template-hash"
# kopf keeps its handler progress in annotations under this prefix, not in status, so that the
# structural status schema stays exactly what ARCHITECTURE.md lists.
KOPF_ANNOTATION_PREFIX: Final = f"kopf.{GROUP}"

# The `<name>-active` Service's EndpointSlice, which the operator writes (active_service.py): the
# labels that tie it to its Service and keep the EndpointSlice controller away from it, and the
# epoch it was written under, the fence against an older term writing it back.
LABEL_SERVICE_NAME: Final = "kubernetes.io/service-name"
LABEL_SLICE_MANAGED_BY: Final = "endpointslice.kubernetes.io/managed-by"
SLICE_MANAGER: Final = "broker-failover-operator.broker.failover.dev"
SLICE_CONTROLLER: Final = "endpointslice-controller.k8s.io"  # the controller-manager's, on selector Services
ANNOTATION_EPOCH: Final = f"{GROUP}/epoch"
ANNOTATION_ACTIVE: Final = f"{GROUP}/active"

BROKER_CONTAINER: Final = "broker"
BROKER_PORT: Final = 8080
BROKER_PORT_NAME: Final = "soap"
# The operator's port on managed pods: Heartbeat, the admin operations, /metrics. A port of its
# own so that the cluster's NetworkPolicy can admit it from the operator alone (docs/broker.md).
BROKER_ADMIN_PORT: Final = 8081
BROKER_ADMIN_PORT_NAME: Final = "admin"
# The label every namespace carries with its own name (Kubernetes sets it, users cannot change it):
# what a NetworkPolicy's namespaceSelector names the operator's namespace by.
LABEL_NAMESPACE_NAME: Final = "kubernetes.io/metadata.name"
DATA_MOUNT: Final = "/var/lib/broker/data"
# Where broker pods mount <cluster>-broker-verifiers: the SHA-256 of the operator's and of the
# backend's token (verifiers.py), never the tokens themselves, which stay in their own Secrets.
TOKEN_MOUNT: Final = "/var/run/secrets/broker-failover"
TOKEN_FILE_KEY: Final = "token"  # the key of a token in the Secrets the operator generates
VERIFIER_VOLUME: Final = "token-verifiers"
OPERATOR_VERIFIER_KEY: Final = "operator-token.sha256"
BACKEND_VERIFIER_KEY: Final = "backend-token.sha256"
JOURNAL_VOLUME: Final = "journal"
# The Secrets of spec.backend/cloud.credentialsSecretRef: what the brokers present to each target.
BACKEND_CREDENTIALS_MOUNT: Final = "/var/run/secrets/broker-failover-backend-credentials"
BACKEND_CREDENTIALS_VOLUME: Final = "backend-credentials"
CLOUD_CREDENTIALS_MOUNT: Final = "/var/run/secrets/broker-failover-cloud-credentials"
CLOUD_CREDENTIALS_VOLUME: Final = "cloud-credentials"
MESSAGE_LOG_VOLUME: Final = "message-log"
# TLS (spec.tls, docs/crd.md "TLS"): the brokers' TLS directory (tls.crt, tls.key, ca.crt, the names
# of broker_contracts.tls.layout), a Secret volume the kubelet updates in place (never a subPath:
# a subPath mount never sees a rotation); and the two CA bundles of spec.tls, each a file of its own.
TLS_MOUNT: Final = "/etc/broker/tls"
TLS_VOLUME: Final = "tls"
BACKEND_CLIENTS_CA_MOUNT: Final = "/etc/broker/backend-clients-ca"
BACKEND_CLIENTS_CA_VOLUME: Final = "backend-clients-ca"
UPSTREAM_CA_MOUNT: Final = "/etc/broker/upstream-ca"
UPSTREAM_CA_VOLUME: Final = "upstream-ca"
CA_BUNDLE_FILE: Final = "ca.crt"  # the file name of either bundle, whatever its key in the Secret
# The <name>-active Service's keys the operator set from spec.activeService, so that a key removed
# from the template is removed from the Service and a key someone else wrote (a cloud controller)
# is never touched (active_service_shape.py).
ANNOTATION_MANAGED_ANNOTATIONS: Final = f"{GROUP}/managed-annotations"
ANNOTATION_MANAGED_LABELS: Final = f"{GROUP}/managed-labels"


def cluster_labels(cluster: str) -> dict[str, str]:
    """Labels every managed pod carries; the headless Service, the spread and the NetworkPolicy
    select on these, so ``spec.podMetadata.labels`` may not set them (``pod_spec.py``)."""
    return {LABEL_APP: APP_BROKER, LABEL_MANAGED_BY: MANAGED_BY, LABEL_CLUSTER: cluster}


def pod_name(cluster: str, ordinal: int) -> str:
    """Managed pods are ``<cluster>-<ordinal>``; ordinal 0 has priority 0, the highest."""
    return f"{cluster}-{ordinal}"


def journal_claim_name(cluster: str, ordinal: int) -> str:
    return f"journal-{cluster}-{ordinal}"


def headless_service_name(cluster: str) -> str:
    return f"{cluster}-brokers"


def active_service_name(cluster: str) -> str:
    return f"{cluster}-active"


def disruption_budget_name(cluster: str) -> str:
    """The PodDisruptionBudget that holds back an eviction of the active broker."""
    return f"{cluster}-active"


def network_policy_name(cluster: str) -> str:
    return f"{cluster}-brokers-ingress"


def generated_token_secret_name(cluster: str) -> str:
    return f"{cluster}-broker-token"


def generated_backend_token_secret_name(cluster: str) -> str:
    return f"{cluster}-backend-token"


def verifier_secret_name(cluster: str) -> str:
    """The Secret the brokers mount: their tokens' verifiers, written by the operator."""
    return f"{cluster}-broker-verifiers"


def tls_secret_name(cluster: str) -> str:
    """Mode Operator: the brokers' TLS Secret (tls.crt, tls.key, ca.crt), written by the operator
    from its CA and mounted by every broker pod."""
    return f"{cluster}-tls"


def ca_secret_name(cluster: str) -> str:
    """Mode Operator: the cluster's CA, key included; the operator's alone, never mounted."""
    return f"{cluster}-ca"


def operator_client_secret_name(cluster: str) -> str:
    """Mode Operator: the operator's client certificate for the brokers' admin port (tls.crt,
    tls.key, ca.crt), apart from the CA's key so that RBAC can grant ``kubectl broker`` users this
    one Secret by name without the power to issue certificates; never mounted."""
    return f"{cluster}-operator-client"


def broker_soap_url(pod_ip: str, port: int = BROKER_PORT, *, tls: bool = False) -> str:
    """The engine's ``BrokerTarget.url`` for a pod: its IP, the port of the operator's calls (the
    admin port where the pod has one, see ``observed.admin_port``), the SOAP path; ``https`` when
    the pod serves TLS (``observed.serves_tls``)."""
    host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
    return f"{'https' if tls else 'http'}://{host}:{port}{SOAP_PATH}"
