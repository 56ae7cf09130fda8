"""The model-based random driver (``tests.ingest.random_histories``) on the Spark engine:
the same generated histories (JSON Lines, CSV and Parquet files, row errors, ``gc`` and
``gc --retain``, typed and plain parts) ingested by Spark tasks into SQLite and a local
blob directory, checked against the dict model after every ingest."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from pyspark.sql import SparkSession

from resources.spark_ingest import SparkEngine
from tests.ingest.random_histories import History, histories, run_history
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard


@settings(max_examples=4, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=histories(max_steps=3, buckets=(1, 4)))
def test_random_histories_on_the_spark_engine(spark: SparkSession, history: History) -> None:
    engine = SparkEngine(spark)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        run_history(history, lambda: Shard.open(open_consensus(f"sqlite:///{root}/c.db"),
                                                open_blob(f"file://{root}/blob"), "h"),
                    engines=[engine])
