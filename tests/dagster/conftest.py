"""Fixtures for the Dagster tests: a temporary platform, and one SparkSession."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.dagster.helpers import Platform, platform


@pytest.fixture
def plat() -> Iterator[Platform]:
    with platform() as p:
        yield p


@pytest.fixture(scope="session")
def spark_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from resources.spark_session import get_spark

    log = tmp_path_factory.mktemp("spark") / "driver.log"  # not ./.upsert of the checkout
    session = get_spark("local[2]", app_name="upsert-dagster-tests", shuffle_partitions=4,
                        log=log)
    try:
        yield session
    finally:
        session.stop()
