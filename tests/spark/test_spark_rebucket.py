"""Spark-engine ingests after a rebucket: the Spark tasks plan, drain and commit on the new
bucket count on all three paths (one stage, split, a group of small files), equal to the
model; and the model-based driver with rebuckets runs on the Spark engine."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from pyspark.sql import SparkSession

from resources.spark_ingest import SparkEngine
from tests.ingest.random_histories import History, histories, run_history
from tests.ingest.test_rebucket import Landing, _rows, assert_matches, labels
from upsert_core.ingest import InProcessEngine
from upsert_core.ingest.rebucket import rebucket
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard
from upsert_core.persist.testing import unreferenced_blobs

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("scope", ["batch", "global"])
def test_spark_ingests_after_a_rebucket_match_the_model(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scope: str
) -> None:
    stores, landing_dir = tmp_path / "stores", tmp_path / "landing"
    stores.mkdir()
    landing_dir.mkdir()
    shard = Shard.open(open_consensus(f"sqlite:///{stores}/c.db"),
                       open_blob(f"file://{stores}/blob"), "s")
    landing = Landing(landing_dir, scope)
    for _ in range(2):
        landing.add()
        landing.ingest(shard, engine=InProcessEngine(cache="new"), buckets=4)
    assert rebucket(shard, 16).changed

    engine = SparkEngine(spark)
    # One file on its own: the one-stage path, 16 buckets over the slices.
    landing.add([{"key": k, "offset": 2, "v": "old"} for k in range(60)])
    report = landing.ingest(shard, engine=engine)
    assert [f.ts for f in report.files] == [2]
    assert_matches(shard, landing)
    # A run of three small files: one job, each file at its own ts.
    for _ in range(3):
        landing.add()
    report = landing.ingest(shard, engine=engine)
    assert [f.ts for f in report.files] == [3, 4, 5]
    assert_matches(shard, landing)
    # A file split among read tasks, its rows shuffled to one drain task per bucket.
    monkeypatch.setenv("UPSERT_SPARK_SPLIT", "on")
    monkeypatch.setenv("UPSERT_SPARK_SPLIT_BYTES", "400")
    landing.add(_rows(7, keys=200))
    report = landing.ingest(shard, engine=engine)
    assert engine.last_split is not None and not engine.last_split.fallback
    assert report.files[0].read_tasks > 1 and report.files[0].drain_tasks > 4
    assert_matches(shard, landing)
    assert labels(shard) == {16}
    # Down again, and Spark goes on.
    assert rebucket(shard, 2).changed
    monkeypatch.setenv("UPSERT_SPARK_SPLIT", "off")
    landing.add()
    landing.ingest(shard, engine=engine)
    assert labels(shard) == {2}
    assert_matches(shard, landing)
    shard.gc(leak_grace_ms=0)
    assert unreferenced_blobs(shard) == set()


@settings(max_examples=3, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=histories(max_steps=4, buckets=(1, 4), rebucket_one_in=2,
                         rebucket_to=(2, 8, 16)))
def test_random_histories_with_rebuckets_on_the_spark_engine(
    spark: SparkSession, history: History
) -> None:
    engine = SparkEngine(spark)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        run_history(history, lambda: Shard.open(open_consensus(f"sqlite:///{root}/c.db"),
                                                open_blob(f"file://{root}/blob"), "h"),
                    engines=[engine])
