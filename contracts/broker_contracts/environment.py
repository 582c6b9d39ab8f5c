"""The broker's environment variables: the names the operator's pod builder sets and the broker reads.

The broker is configured through the environment of its CLI (each variable also has a flag; see
docs/broker.md), and the operator configures every broker pod it runs through exactly these
variables. A name typed on each side could drift apart silently (the pod would set a variable
nobody reads, and the broker would run with its default), so both sides take it from here, and
``tests/unit/test_contracts.py`` checks that every name is one the broker's settings read.

Names only: what each value means and its default are the broker's settings' (docs/broker.md).
"""

from typing import Final

BROKER_HOST: Final = "BROKER_HOST"
BROKER_PORT: Final = "BROKER_PORT"
# The operator's port (Heartbeat, admin operations, /metrics), apart from SendMessages on BROKER_PORT.
BROKER_ADMIN_PORT: Final = "BROKER_ADMIN_PORT"
BROKER_NAME: Final = "BROKER_NAME"
BROKER_CLUSTER: Final = "BROKER_CLUSTER"
BROKER_ACCOUNT: Final = "BROKER_ACCOUNT"
BROKER_COMPANY: Final = "BROKER_COMPANY"
BROKER_DATA_DIR: Final = "BROKER_DATA_DIR"
BROKER_MESSAGE_LOG_DIR: Final = "BROKER_MESSAGE_LOG_DIR"
BROKER_BACKEND_URL: Final = "BROKER_BACKEND_URL"
BROKER_CLOUD_URL: Final = "BROKER_CLOUD_URL"
# Directories holding the Secret keys (token, or username and password) the broker presents to
# the backend and the cloud: spec.backend/cloud.credentialsSecretRef, mounted.
BROKER_BACKEND_CREDENTIALS_DIR: Final = "BROKER_BACKEND_CREDENTIALS_DIR"
BROKER_CLOUD_CREDENTIALS_DIR: Final = "BROKER_CLOUD_CREDENTIALS_DIR"
# The tokens' verifiers (broker_contracts.token_verifier) as files: a broker never holds a token.
BROKER_TOKEN_VERIFIER_FILE: Final = "BROKER_TOKEN_VERIFIER_FILE"
BROKER_BACKEND_TOKEN_VERIFIER_FILE: Final = "BROKER_BACKEND_TOKEN_VERIFIER_FILE"
# How long an Active broker stays Active without an active=true heartbeat: spec.heartbeat.leaseSeconds.
BROKER_LEASE_SECONDS: Final = "BROKER_LEASE_SECONDS"
# The longest lease a handover renewal (WSDL leaseSeconds) may grant, at least the lease; unset =
# the lease: spec.heartbeat.handoverLeaseSeconds (its effective value, max(it, leaseSeconds)).
BROKER_MAX_LEASE_SECONDS: Final = "BROKER_MAX_LEASE_SECONDS"
BROKER_MAX_DELIVERIES: Final = "BROKER_MAX_DELIVERIES"
BROKER_ON_POISON: Final = "BROKER_ON_POISON"
# TLS (docs/broker.md, "TLS"): the mounted TLS Secret's directory (tls.crt, tls.key, ca.crt; unset =
# plain HTTP), how often it is read for a rotation, the CA of the backend's client certificates,
# the subjects allowed to send bundles (one RFC 4514 subject per line), and the CA bundle for
# https:// backend and cloud URLs (unset = the system's trust store).
BROKER_TLS_DIR: Final = "BROKER_TLS_DIR"
BROKER_TLS_RELOAD_SECONDS: Final = "BROKER_TLS_RELOAD_SECONDS"
BROKER_CLIENT_CA_FILE: Final = "BROKER_CLIENT_CA_FILE"
BROKER_ALLOWED_CLIENT_SUBJECTS: Final = "BROKER_ALLOWED_CLIENT_SUBJECTS"
BROKER_UPSTREAM_CA_FILE: Final = "BROKER_UPSTREAM_CA_FILE"
# The log format (text, json) and level (DEBUG, INFO, WARNING, ERROR): read by every component,
# not the broker alone (broker_contracts.logs), and set in broker pods to the operator's own.
BROKER_FAILOVER_LOG_FORMAT: Final = "BROKER_FAILOVER_LOG_FORMAT"
BROKER_FAILOVER_LOG_LEVEL: Final = "BROKER_FAILOVER_LOG_LEVEL"

# Read by the broker but never set by the operator in a pod, which mounts the verifiers as files
# (the *_FILE names above) and leaves the grace period at its default.
BROKER_TOKEN_VERIFIER: Final = "BROKER_TOKEN_VERIFIER"  # the operator's token's verifier as a value
BROKER_BACKEND_TOKEN_VERIFIER: Final = "BROKER_BACKEND_TOKEN_VERIFIER"
BROKER_TOKEN_GRACE_SECONDS: Final = "BROKER_TOKEN_GRACE_SECONDS"

# The tokens themselves, read by their holders only: the local runner (the operator's token) and
# the backend simulator (the backend's, with its file in BROKER_BACKEND_TOKEN_FILE). A broker that
# finds either in its environment refuses to start: it holds verifiers only.
BROKER_TOKEN: Final = "BROKER_TOKEN"
BROKER_BACKEND_TOKEN: Final = "BROKER_BACKEND_TOKEN"
BROKER_BACKEND_TOKEN_FILE: Final = "BROKER_BACKEND_TOKEN_FILE"

POD_ENVIRONMENT: Final = (
    BROKER_HOST,
    BROKER_PORT,
    BROKER_ADMIN_PORT,
    BROKER_NAME,
    BROKER_CLUSTER,
    BROKER_ACCOUNT,
    BROKER_COMPANY,
    BROKER_DATA_DIR,
    BROKER_MESSAGE_LOG_DIR,
    BROKER_BACKEND_URL,
    BROKER_CLOUD_URL,
    BROKER_BACKEND_CREDENTIALS_DIR,
    BROKER_CLOUD_CREDENTIALS_DIR,
    BROKER_TOKEN_VERIFIER_FILE,
    BROKER_BACKEND_TOKEN_VERIFIER_FILE,
    BROKER_LEASE_SECONDS,
    BROKER_MAX_LEASE_SECONDS,
    BROKER_MAX_DELIVERIES,
    BROKER_ON_POISON,
    BROKER_TLS_DIR,
    BROKER_TLS_RELOAD_SECONDS,
    BROKER_CLIENT_CA_FILE,
    BROKER_ALLOWED_CLIENT_SUBJECTS,
    BROKER_UPSTREAM_CA_FILE,
    BROKER_FAILOVER_LOG_FORMAT,
    BROKER_FAILOVER_LOG_LEVEL,
)
"""Every variable the operator may set in a broker pod."""
