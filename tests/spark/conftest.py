"""One SparkSession for the whole test session (starting one costs 6-15 s), and a Spark
Connect server on ``local[2]`` for the tests that need one (started once, ~10 s, on a
free loopback port, and stopped at the end)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from resources.connect_server import connect_server
from resources.spark_session import get_spark
from upsert_core.errors import ConfigError


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    master = os.environ.get("SPARK_MASTER", "local[2]")  # a cluster when one is configured
    log = tmp_path_factory.mktemp("spark") / "driver.log"  # not ./.upsert of the checkout
    session = get_spark(master, app_name="upsert-tests", shuffle_partitions=4, log=log)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``sc://127.0.0.1:PORT`` of a Spark Connect server on ``local[2]``, started from the
    pyspark package in a process group of its own (its Python workers import this
    checkout: ``PYTHONPATH`` has it first)."""
    log = tmp_path_factory.mktemp("connect") / "connect-server.log"
    try:
        with connect_server("local[2]", log=log, name="upsert-tests-connect",
                            conf={"spark.sql.shuffle.partitions": "4"}) as url:
            yield url
    except ConfigError as exc:
        pytest.fail(str(exc))
