"""Certificates made once per test session by the module under test (RSA key generation is the
slow part: a few hundred milliseconds for each RSA-3072 CA)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from broker_operator.pki import KeyPair, issue_client, issue_server, new_ca, server_dns_names

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
NAMES = server_dns_names("orders", "shop", range(2))
ACTIVE = "orders-active.shop.svc.cluster.local"
OPERATOR = "broker-failover-operator.operators.svc"


@pytest.fixture(scope="session")
def ca() -> KeyPair:
    return new_ca("orders CA", days=3650, now=NOW)


@pytest.fixture(scope="session")
def other_ca() -> KeyPair:
    """A CA of the same name and another key: what a replaced or foreign CA looks like."""
    return new_ca("orders CA", days=3650, now=NOW)


@pytest.fixture(scope="session")
def server(ca: KeyPair) -> KeyPair:
    return issue_server(ca, NAMES, days=90, now=NOW)


@pytest.fixture(scope="session")
def client(ca: KeyPair) -> KeyPair:
    return issue_client(ca, OPERATOR, days=90, now=NOW)
