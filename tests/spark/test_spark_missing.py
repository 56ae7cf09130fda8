"""``--missing keep`` on the Spark engine (``resources/spark_ingest.py``, both the
one-stage and the split path of ``resources/spark_split.py``) on a real ``local[2]``
session gives exactly the in-process engine's shard, and the dict model's rows: JSON
Lines with left-out fields and placeholders cut into several splits, Parquet files of
several row groups without some columns (one column null throughout the first row
groups), deletes between a key's rows, both order scopes; and a Debezium shard with the
TOAST placeholder."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from resources.spark_ingest import SparkEngine
from tests.debezium_events import event
from tests.ingest.helpers import contents, memory_shard, snapshot_rows, write_jsonl
from tests.model import UpsertModel
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.landing import list_landing
from upsert_core.landing.splits import plan_splits
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard
from upsert_core.persist.testing import unreferenced_blobs

pytestmark = pytest.mark.spark

PH = "__debezium_unavailable_value"
SPLIT_BYTES = 4000


@pytest.fixture
def split_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    monkeypatch.setenv("UPSERT_SPARK_SPLIT", "on")
    monkeypatch.setenv("UPSERT_SPARK_SPLIT_BYTES", str(SPLIT_BYTES))
    yield monkeypatch


def _shard(root: Path) -> Shard:
    root.mkdir(parents=True, exist_ok=True)
    return Shard.open(
        open_consensus(f"sqlite:///{root}/c.db"), open_blob(f"file://{root}/blob"), "s")


def _jsonl_rows(rng: random.Random, n: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for _ in range(n):
        row: dict[str, Any] = {"key": rng.randrange(60), "offset": rng.randrange(8)}
        if rng.random() < 0.1:
            row["__deleted"] = True
        for col, values in (("v", ["a", "bb", None, PH]), ("w", [0.25, -1.5, None, PH]),
                            ("b", [True, False, None])):
            if rng.random() < 0.6:
                row[col] = rng.choice(values)
        rows.append(row)
    return rows


def _parquet_rows(rng: random.Random, n: int, columns: list[str]) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        row: dict[str, Any] = {"key": rng.randrange(60), "offset": rng.randrange(8),
                               "__deleted": rng.random() < 0.1}
        for col in columns:
            if col == "v":
                row[col] = rng.choice(["p", "q", None, PH])
            elif col == "w":
                row[col] = rng.choice([0.5, 3.0, None])
            else:  # "late": null throughout the first half of the file
                row[col] = None if i < n // 2 else rng.choice([1, 2])
        rows.append(row)
    return rows


def _write_parquet(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> None:
    types = {"key": pa.int64(), "offset": pa.int64(), "__deleted": pa.bool_(),
             "v": pa.string(), "w": pa.float64(), "late": pa.int64()}
    names = ["key", "offset", "__deleted", *columns]
    table = pa.table({c: pa.array([r[c] for r in rows], types[c]) for c in names})
    pq.write_table(table, path, row_group_size=40)


def _landing(root: Path) -> list[list[dict[str, Any]]]:
    """Four files (JSON Lines, Parquet without ``w``, JSON Lines, Parquet without ``v``
    whose ``late`` column is null in its first row groups); their rows in file order."""
    rng = random.Random(7)
    batches = []
    for i, kind in enumerate(["jsonl", "parquet", "jsonl", "parquet"]):
        name = root / f"{i:02d}.{kind}"
        if kind == "jsonl":
            rows = _jsonl_rows(rng, 400)
            write_jsonl(root, name.name, rows)
        else:
            columns = ["v"] if i == 1 else ["w", "late"]
            rows = _parquet_rows(rng, 300, columns)
            _write_parquet(name, rows, columns)
        batches.append(rows)
    return batches


@pytest.mark.parametrize("split", ["on", "off"])
def test_spark_matches_in_process_and_model(
    spark: SparkSession, tmp_path: Path, split_on: pytest.MonkeyPatch, split: str
) -> None:
    split_on.setenv("UPSERT_SPARK_SPLIT", split)
    landing = tmp_path / "landing"
    landing.mkdir()
    batches = _landing(landing)
    files = {f.name: f for f in list_landing(str(landing))}
    if split == "on":
        assert all(len(plan_splits(files[n], SPLIT_BYTES)) >= 3 for n in ("00.jsonl", "02.jsonl"))
    for scope in ("batch", "global"):
        engine = SparkEngine(spark)
        request = IngestRequest(buckets=4, order_scope=scope, missing="keep")
        shard = _shard(tmp_path / scope)
        report = ingest(shard, str(landing), request, engine=engine)
        local = memory_shard("local")
        ingest(local, str(landing), request)
        assert contents(shard) == contents(local)
        assert list(shard.errors()) == list(local.errors()) == []
        model = UpsertModel(scope, missing="keep")
        for rows in batches:
            model.apply(rows)
        for ts in range(len(batches)):
            assert snapshot_rows(shard, ts) == model.rows(ts), f"{scope}: snapshot at {ts}"
        if split == "on":
            # 02.jsonl is read by several read tasks (00.jsonl, the first file, may fall
            # back to one read: its splits may meet the columns in another order)
            tasks = {f.name: f.read_tasks for f in report.files}
            assert tasks["02.jsonl"] == len(plan_splits(files["02.jsonl"], SPLIT_BYTES))
        assert unreferenced_blobs(shard) == set()


def test_spark_debezium_toast_placeholder(spark: SparkSession, tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    write_jsonl(landing, "01.jsonl", [
        event("c", 1, after={"id": 1, "body": "long", "n": 1}),
        event("c", 2, after={"id": 2, "body": "text", "n": 2})])
    write_jsonl(landing, "02.jsonl", [
        event("u", 3, after={"id": 1, "body": PH, "n": 10}),
        event("u", 4, after={"id": 1, "body": PH, "n": 11}),
        event("d", 5, before={"id": 2}),
        event("c", 6, after={"id": 2, "body": PH, "n": 12}),
        event("u", 7, after={"id": PH, "body": "x", "n": 0})])
    request = IngestRequest(envelope="debezium", key=("id",), missing="keep", buckets=2)
    shard = _shard(tmp_path / "spark")
    ingest(shard, str(landing), request, engine=SparkEngine(spark))
    local = memory_shard("local")
    ingest(local, str(landing), request)
    assert contents(shard) == contents(local)
    assert [e["row"] for e in shard.errors()] == [e["row"] for e in local.errors()] == [5]
    rows = {dict(r)["id"]: dict(r) for r in snapshot_rows(shard, 1)}
    assert rows[1]["body"] == "long" and rows[1]["n"] == 11
    assert "body" not in rows[2]  # deleted in between: nothing to keep
