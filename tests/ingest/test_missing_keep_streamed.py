"""``--missing keep`` on a Parquet file read in chunks (``landing.chunks``; its rows held
or spilled by bucket, ``ingest.spill``) gives the whole-file read's shard and the
model's rows. The subtle case: a column the file has but that is null throughout the
first chunks is in no schema until a later chunk types it, so those chunks' bitmaps are
narrower; their rows' nulls there are explicit (the file has the column), not left out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.model import UpsertModel
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.landing.chunks import CHUNK_ROWS_ENV, STREAM_BYTES_ENV
from upsert_core.persist.shard import Shard

from .helpers import contents, memory_shard, snapshot_rows, write_jsonl

PH = "__debezium_unavailable_value"


def _write(root: Path) -> list[list[dict[str, Any]]]:
    first = [{"key": k, "offset": 1, "v": f"v{k}", "w": 1.5, "x": k} for k in (*range(6), 7)]
    write_jsonl(root, "a.jsonl", first)
    n = 20
    rows = [{"key": 7 if i == 1 else i % 6, "offset": 2 + i // 6, "__deleted": i % 9 == 8,
             "v": PH if i % 3 == 0 else (None if i % 4 == 0 else f"u{i}"),
             "x": None if i < 10 else i} for i in range(n)]  # x: null in the first chunks
    table = pa.table({
        "key": pa.array([r["key"] for r in rows], pa.int64()),
        "offset": pa.array([r["offset"] for r in rows], pa.int64()),
        "__deleted": pa.array([r["__deleted"] for r in rows]),
        "v": pa.array([r["v"] for r in rows], pa.string()),
        "x": pa.array([r["x"] for r in rows], pa.int64()),
    })  # no "w": left out by every row
    pq.write_table(table, root / "b.parquet", row_group_size=3)
    return [first, rows]


def _ingest(root: Path, monkeypatch: pytest.MonkeyPatch, streamed: bool, memory: str,
            scope: str) -> Shard:
    with monkeypatch.context() as env:
        env.setenv(STREAM_BYTES_ENV, "0" if streamed else str(1 << 40))
        env.setenv(CHUNK_ROWS_ENV, "3")
        env.setenv("UPSERT_INGEST_MEMORY_MB", memory)
        shard = memory_shard()
        ingest(shard, str(root), IngestRequest(buckets=3, missing="keep", order_scope=scope))
    return shard


@pytest.mark.parametrize("memory", ["", "0"], ids=["held", "spilled"])
@pytest.mark.parametrize("scope", ["batch", "global"])
def test_streamed_keep_equals_the_whole_file_and_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, memory: str, scope: str
) -> None:
    batches = _write(tmp_path)
    streamed = _ingest(tmp_path, monkeypatch, True, memory, scope)
    whole = _ingest(tmp_path, monkeypatch, False, memory, scope)
    assert contents(streamed) == contents(whole)
    model = UpsertModel(scope, missing="keep")
    for rows in batches:
        model.apply(rows)
    assert snapshot_rows(streamed, 1) == model.rows(1)
    # key 7's one row is in the first chunk, whose schema has no x yet: its null x is
    # explicit (x is not kept from a.jsonl), while w, a column the file lacks, is kept
    finals = {dict(r)["key"]: dict(r) for r in snapshot_rows(streamed, 1)}
    assert finals[7] == {"key": 7, "offset": 2, "v": "u1", "w": 1.5}
