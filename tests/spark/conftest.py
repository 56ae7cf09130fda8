"""One SparkSession for the whole test session (starting one costs 6-15 s)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from resources.spark_session import get_spark


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    master = os.environ.get("SPARK_MASTER", "local[2]")  # a cluster when one is configured
    session = get_spark(master, app_name="upsert-tests", shuffle_partitions=4)
    try:
        yield session
    finally:
        session.stop()
