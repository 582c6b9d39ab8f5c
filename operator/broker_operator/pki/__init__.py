"""The operator's PKI: one CA per BrokerCluster, the brokers' server and the operator's client certificates.

Pure functions and frozen dataclasses, low layer first:

- ``material``: ``KeyPair`` (PEM, as a Secret holds it), ``CertificateInfo`` (the parsed view),
  bounded parsing that raises ``CertificateError``;
- ``names``: the DNS names the server certificate carries, and the DNS-name check;
- ``authority``: make a CA, renew it with the same key, issue server and client leaves;
- ``trust``: CA bundles, their version, and whether a leaf verifies against one;
- ``renewal``: what to issue or renew now and why (reasons that become events);
- ``replacement``: replacing the CA's key in phases (Trusting, Reissuing, Retiring, Done).

The controller asks ``renewal`` and ``replacement`` one question per reconcile and carries out
the answer; nothing here reads a clock (``now`` is passed in), a Secret or the network, imports
kopf or asyncio, so the rules can be tested exhaustively (``tests/unit/pki``). Key generation
draws from the OS's random source, the one side effect, and ``replacement`` takes it as a
callable so that its tests can hand in CAs made once.
"""

from broker_operator.pki.authority import (
    CA_KEY_BITS,
    CLOCK_SKEW,
    LEAF_KEY_BITS,
    issue_client,
    issue_server,
    new_ca,
    renew_ca,
)
from broker_operator.pki.material import (
    MAX_BUNDLE_CERTIFICATES,
    MAX_PEM_BYTES,
    CertificateError,
    CertificateInfo,
    KeyPair,
    certificate_info,
    load_certificate,
    load_certificates,
    load_key_pair,
    load_private_key,
)
from broker_operator.pki.names import DEFAULT_CLUSTER_DOMAIN, check_dns_names, server_dns_names
from broker_operator.pki.renewal import (
    ExpiryWarning,
    Materials,
    Renewal,
    RenewalPolicy,
    Target,
    Verb,
    describe_expiry,
    expiry_warnings,
    plan_renewal,
)
from broker_operator.pki.replacement import (
    ANNOTATION_REPLACE_CA_KEY,
    ReplacementPhase,
    ReplacementState,
    ReplacementStep,
    TrustObservations,
    advance,
)
from broker_operator.pki.trust import (
    bundle_certificates,
    bundle_version,
    trust_bundle,
    verification_error,
    verifies,
)

__all__ = [
    "ANNOTATION_REPLACE_CA_KEY",
    "CA_KEY_BITS",
    "CLOCK_SKEW",
    "DEFAULT_CLUSTER_DOMAIN",
    "LEAF_KEY_BITS",
    "MAX_BUNDLE_CERTIFICATES",
    "MAX_PEM_BYTES",
    "CertificateError",
    "CertificateInfo",
    "ExpiryWarning",
    "KeyPair",
    "Materials",
    "Renewal",
    "RenewalPolicy",
    "ReplacementPhase",
    "ReplacementState",
    "ReplacementStep",
    "Target",
    "TrustObservations",
    "Verb",
    "advance",
    "bundle_certificates",
    "bundle_version",
    "certificate_info",
    "check_dns_names",
    "describe_expiry",
    "expiry_warnings",
    "issue_client",
    "issue_server",
    "load_certificate",
    "load_certificates",
    "load_key_pair",
    "load_private_key",
    "new_ca",
    "plan_renewal",
    "renew_ca",
    "server_dns_names",
    "trust_bundle",
    "verification_error",
    "verifies",
]
