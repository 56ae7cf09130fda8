"""Late rows on the Spark engine (``resources/spark_ingest.py``, both paths) record
exactly the late collection of the in-process engine, and the ``upsert`` data source's
``read=late`` equals ``open_shard().late()``."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from resources.spark_ingest import SparkEngine
from resources.spark_source import read_shard
from tests.ingest.helpers import contents, memory_shard, write_jsonl
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard
from upsert_core.persist.testing import unreferenced_blobs
from upsert_core.shard_table import ShardTable

pytestmark = pytest.mark.spark


def _rows(rng: random.Random, n: int, top: int, several: bool) -> list[object]:
    rows: list[object] = []
    for i in range(n):
        row: dict[str, Any] = {"key": rng.randrange(60), "offset": rng.randrange(top)}
        if several:
            row["log"] = rng.choice(["bin.1", "bin.2"])
        if i % 31 == 7:
            row["offset"] = None  # an error row, never late
        if rng.random() < 0.2:
            row["__deleted"] = True
        else:
            row["v"] = rng.choice(["a", "b", "c" * rng.randrange(1, 40)])
        rows.append(row)
    return rows


def _landing(root: Path, several: bool) -> None:
    rng = random.Random(5)
    for i, top in enumerate((40, 20, 60, 30)):  # lower offsets later: many late rows
        write_jsonl(root, f"{i:02d}.jsonl", _rows(rng, 400, top, several))


def _bag(rows: list[dict[str, Any]]) -> Counter[str]:
    return Counter(json.dumps(r, sort_keys=True, default=str) for r in rows)


@pytest.mark.parametrize(("split", "several"), [("off", False), ("on", False), ("off", True)])
def test_the_spark_engine_records_the_in_process_late_rows(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, split: str,
    several: bool,
) -> None:
    monkeypatch.setenv("UPSERT_SPARK_SPLIT", split)
    monkeypatch.setenv("UPSERT_SPARK_SPLIT_BYTES", "4000")
    landing = tmp_path / "landing"
    landing.mkdir()
    _landing(landing, several)
    consensus, blob = f"sqlite:///{tmp_path}/c.db", f"file://{tmp_path}/blob"
    shard = Shard.open(open_consensus(consensus), open_blob(blob), "s")
    request = IngestRequest(buckets=4, order_scope="global",
                            order="log,offset" if several else "offset")
    engine = SparkEngine(spark)
    report = ingest(shard, str(landing), request, engine=engine)
    if split == "on":
        assert engine.last_split is not None and not engine.last_split.fallback
    local = memory_shard("local")
    local_report = ingest(local, str(landing), request)
    assert contents(shard) == contents(local)
    late = list(ShardTable(shard).late_records())
    assert late == list(ShardTable(local).late_records())
    assert len(late) > 100  # the landing makes many
    assert [f.late_rows for f in report.files] == [f.late_rows for f in local_report.files]
    assert sum(f.late_rows for f in report.files) == len(late)
    assert unreferenced_blobs(shard) == set()

    frame = read_shard(spark, "s", late=True, consensus=consensus, blob=blob, partitions=3)
    got = [r.asDict(recursive=True) for r in frame.collect()]
    assert _bag(got) == _bag(ShardTable(shard).late().to_pylist())
    assert set(frame.columns) == {"file", "row", "key", "order", "stored_order"}
