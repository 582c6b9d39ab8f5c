"""The ``body`` fixture: BrokerCluster ``orders`` with a Healthy status (``support.cluster_body``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.unit.plugin.support import cluster_body


@pytest.fixture
def body() -> Iterator[dict[str, Any]]:
    yield cluster_body()
