"""The Spark engine's split path with an order of several columns (order keys in the
rows shuffled by bucket) and a Parquet file without rows: the shard, its error rows and
counts equal the in-process engine's, in both scopes, with keys repeated across splits
(equal orders: the row later in the file wins)."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from resources.spark_ingest import SparkEngine
from tests.ingest.helpers import contents, memory_shard, schema_of, write_jsonl
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard
from upsert_core.persist.testing import unreferenced_blobs

pytestmark = pytest.mark.spark

FILES = ["", "a", "a\x00", "a\x00b", "b", "é"]


def _rows(rng: random.Random, n: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for i in range(n):
        row: dict[str, object] = {"key": rng.randrange(30), "file": rng.choice(FILES),
                                  "pos": rng.choice([-(2**63), -1, 0, 1, 2**63 - 1])}
        if i % 53 == 7:
            row["pos"] = None  # a null order: an error row
        if rng.random() < 0.15:
            row["__deleted"] = True
        else:
            row["v"] = f"r{i}"  # every row distinct: which one won shows
        rows.append(row)
    return rows


def test_the_split_path_with_several_order_columns_equals_the_in_process_engine(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UPSERT_SPARK_SPLIT", "on")
    monkeypatch.setenv("UPSERT_SPARK_SPLIT_BYTES", "3000")
    landing = tmp_path / "landing"
    landing.mkdir()
    rng = random.Random(7)
    pq.write_table(pa.table({"key": pa.array([], pa.int64()), "file": pa.array([], pa.string()),
                             "pos": pa.array([], pa.int64()), "w": pa.array([], pa.string())}),
                   landing / "00.parquet")
    write_jsonl(landing, "01.jsonl", _rows(rng, 400))
    rows = _rows(rng, 1200)
    pq.write_table(pa.table({
        "key": pa.array([r["key"] for r in rows], pa.int64()),
        "file": pa.array([r["file"] for r in rows], pa.string()),
        "pos": pa.array([r["pos"] for r in rows], pa.int64()),
        "v": pa.array([r.get("v") for r in rows], pa.string()),
        "__deleted": pa.array([r.get("__deleted") for r in rows], pa.bool_()),
    }), landing / "02.parquet", row_group_size=100)
    for scope in ("batch", "global"):
        shard = Shard.open(open_consensus(f"sqlite:///{tmp_path}/{scope}.db"),
                           open_blob(f"file://{tmp_path}/{scope}-blob"), "s")
        engine = SparkEngine(spark)
        request = IngestRequest(buckets=4, order_scope=scope, order="file,pos")
        report = ingest(shard, str(landing), request, engine=engine)
        local = memory_shard("local")
        local_report = ingest(local, str(landing), request)
        assert [(f.name, f.rows_read, f.inserts, f.retractions, f.errors)
                for f in report.files] == [
            (f.name, f.rows_read, f.inserts, f.retractions, f.errors)
            for f in local_report.files]
        assert report.files[1].read_tasks > 1 and report.files[2].read_tasks > 1
        assert engine.last_split is not None and not engine.last_split.fallback
        assert contents(shard) == contents(local)
        assert list(shard.errors()) == list(local.errors())
        assert schema_of(shard).to_json() == schema_of(local).to_json()
        assert "w" in schema_of(shard).to_json()  # typed by the file without rows
        assert unreferenced_blobs(shard) == set()
