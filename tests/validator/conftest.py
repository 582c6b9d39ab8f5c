"""One real Spark session (``local[2]``) for every validator test; real processes for the log tests.

Session scope because a JVM takes seconds to start; each test gets its own store directory, so
tests stay independent while sharing the session.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from broker_validator.spark import local_session
from tests.integration.broker.conftest import processes  # noqa: F401  # real brokers for the log tests


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = local_session(2)
    try:
        yield session
    finally:
        session.stop()
