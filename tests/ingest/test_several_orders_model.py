"""Orders of several columns (``--order file,pos``) through the in-process ingest,
against the dict model with tuple orders: JSON Lines, CSV and Parquet files with
in-batch duplicates, order ties, late data, deletes (tombstones) and null order values
in either column, both order scopes, several bucket counts, several runs, and the
checkpoints lost between runs (the global scope then rebuilds each key's order key from
its row's order columns and its tombstones from the tombstone sets). The snapshot as of
every ts, the changes at every ts, the error rows and ``check`` must agree with the
model."""

from __future__ import annotations

import csv
import io
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.model import UpsertModel
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.shard_config import checkpoint_ref_name
from upsert_core.ingest.verify import compare_state
from upsert_core.persist.shard import Shard
from upsert_core.persist.testing import unreferenced_blobs

from .helpers import (
    change_rows,
    memory_shard,
    schema_of,
    snapshot_rows,
    write_jsonl,
    write_parquet,
)

ORDER = ("file", "pos")
FILES = ["mysql-bin.000001", "mysql-bin.000002", "mysql-bin.000010", "a", ""]


@st.composite
def source_rows(draw: st.DrawFn) -> dict[str, Any]:
    row: dict[str, Any] = {
        "key": draw(st.integers(0, 5)),
        # one row in ten may have a null in this column: a null order (error row)
        "file": draw(st.one_of(st.sampled_from(FILES), st.none()))
        if draw(st.integers(0, 9)) == 0 else draw(st.sampled_from(FILES)),
        "pos": draw(st.one_of(st.integers(-3, 6), st.none()))
        if draw(st.integers(0, 9)) == 0 else draw(st.integers(-3, 6)),
    }
    if draw(st.integers(0, 4)) == 0:
        row["__deleted"] = True
    else:
        row["v"] = draw(st.sampled_from(["a", "b", "c"]))
    return row


def _write(root: Path, name: str, fmt: str, rows: list[dict[str, Any]]) -> None:
    if fmt == "jsonl":
        write_jsonl(root, f"{name}.jsonl", rows)
        return
    columns = ["key", "file", "pos", "v", "__deleted"]
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(columns)
        for r in rows:
            # CSV has no null string: an empty file name would read as null, so the
            # generator's "" is written as "" only in JSON Lines and Parquet.
            writer.writerow(["" if r.get(c) is None else str(r[c]).lower()
                             if isinstance(r.get(c), bool) else r[c] for c in columns])
        (root / f"{name}.csv").write_text(out.getvalue())
        return
    table = pa.table({
        "key": pa.array([r["key"] for r in rows], pa.int64()),
        "file": pa.array([r["file"] for r in rows], pa.string()),
        "pos": pa.array([r["pos"] for r in rows], pa.int64()),
        "v": pa.array([r.get("v") for r in rows], pa.string()),
        "__deleted": pa.array([r.get("__deleted") for r in rows], pa.bool_()),
    })
    write_parquet(root, f"{name}.parquet", table)


def _drop_checkpoints(shard: Shard) -> None:
    config = shard.state().config
    for k, v in config.items():
        if k.startswith(checkpoint_ref_name(0)[:-1]) and v:
            shard.blob.delete(v)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.lists(st.lists(source_rows(), max_size=8), min_size=1, max_size=6),
    fmt=st.sampled_from(["jsonl", "csv", "parquet"]),
    scope=st.sampled_from(["batch", "global"]),
    buckets=st.sampled_from([1, 4]),
    runs=st.integers(1, 3),
    lose_checkpoints=st.booleans(),
)
def test_several_column_orders_match_the_model(
    data: list[list[dict[str, Any]]], fmt: str, scope: str, buckets: int, runs: int,
    lose_checkpoints: bool,
) -> None:
    if fmt == "csv":  # CSV reads an empty field as null (see _write)
        data = [[{**r, "file": r["file"] or None} for r in rows] for rows in data]
    shard = memory_shard()
    model = UpsertModel(scope, order=ORDER)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        request = IngestRequest(order_scope=scope, buckets=buckets, order="file,pos")
        cut = max(1, len(data) // runs)
        for i, rows in enumerate(data):
            _write(root, f"{i:04d}", fmt, rows)
            model.apply(rows)
            if (i + 1) % cut == 0:
                ingest(shard, str(root), request)
                if lose_checkpoints:
                    _drop_checkpoints(shard)
        ingest(shard, str(root), IngestRequest())  # later runs may omit the options
    state = shard.state()
    assert state.upper == len(data)
    assert schema_of(shard).order == ORDER
    errors = sorted((e["file"], e["row"]) for e in shard.errors())
    assert errors == sorted((f"{ts:04d}.{fmt}", row) for ts, row, _ in model.errors)
    for ts in range(len(data)):
        assert snapshot_rows(shard, ts) == model.rows(ts), f"snapshot at {ts}"
        assert change_rows(shard, ts) == model.row_changes(ts), f"changes at {ts}"
    assert unreferenced_blobs(shard) == set()
    if lose_checkpoints:
        return  # the test deleted referenced blobs itself: check would (rightly) say so
    report = shard.check()
    assert report.ok, report.problems
    compared = compare_state(shard)
    assert compared.problems == [], compared.problems
