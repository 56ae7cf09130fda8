"""``--missing keep`` (CONTRACT.md, "Change data capture"): the in-process engine against
the dict model (``tests.model``, ``missing="keep"``) on generated histories.

Files are JSON Lines (a row leaves a field out, holds the placeholder or an explicit
null) or Parquet (a file without a column; nulls; the placeholder in string columns),
mixed in one shard, with several rows per key per batch, order ties, deletes between
them, a column added from some batch on, both order scopes and several bucket counts.
Floats, booleans and timestamps kept from earlier rows must come back exactly. The
shard's snapshot and changes at every ts, its error rows and its late rows (global scope)
must equal the model's.
"""

from __future__ import annotations

import datetime as dt
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.model import UpsertModel
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.shard_config import ShardIngestConfig
from upsert_core.ingest.verify_typed import verify_typed_parts
from upsert_core.persist.testing import unreferenced_blobs
from upsert_core.shard_table import ShardTable

from .helpers import change_rows, memory_shard, snapshot_rows, write_jsonl, write_parquet

PH = "__debezium_unavailable_value"
ABSENT = object()
UTC = dt.UTC

VALUES: dict[str, list[Any]] = {
    "v": ["a", "b", PH, None],
    "w": [0.1, 1.5, -2.25, PH, None],
    "b": [True, False, PH, None],
    "t": [dt.datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
          dt.datetime(1999, 12, 31, tzinfo=UTC), None],
}
TYPES = {"v": pa.string(), "w": pa.float64(), "b": pa.bool_(),
         "t": pa.timestamp("us", tz="UTC")}
JSON_COLUMNS = ("v", "w", "b")  # JSON has no timestamps: t comes in Parquet files


@st.composite
def jsonl_row(draw: st.DrawFn, columns: tuple[str, ...]) -> dict[str, Any]:
    row: dict[str, Any] = {"key": draw(st.integers(0, 4)), "offset": draw(st.integers(0, 5))}
    if draw(st.integers(0, 5)) == 0:
        row["__deleted"] = True
        return row
    for col in columns:
        value = draw(st.sampled_from([ABSENT, *VALUES[col]]))
        if value is not ABSENT:
            row[col] = value
    return row


@st.composite
def parquet_rows(draw: st.DrawFn, columns: tuple[str, ...]) -> tuple[list[str], list[dict]]:
    """A Parquet file's columns (a subset: the others are left out by every row) and rows."""
    present = [c for c in columns if draw(st.booleans())]
    rows = []
    for _ in range(draw(st.integers(0, 8))):
        row: dict[str, Any] = {"key": draw(st.integers(0, 4)),
                               "offset": draw(st.integers(0, 5)),
                               "__deleted": draw(st.integers(0, 5)) == 0}
        for col in present:
            choices = [v for v in VALUES[col] if v != PH or TYPES[col] == pa.string()]
            row[col] = draw(st.sampled_from(choices))
        rows.append(row)
    return present, rows


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[str, Any]]:
    n = draw(st.integers(1, 6))
    added = draw(st.integers(0, n))  # column b appears from this batch on
    out: list[tuple[str, Any]] = []
    for i in range(n):
        later = i >= added
        cols: tuple[str, ...]
        if draw(st.booleans()):
            cols = JSON_COLUMNS if later else ("v", "w")
            out.append(("jsonl", draw(st.lists(jsonl_row(cols), max_size=10))))
        else:
            cols = ("v", "w", "b", "t") if later else ("v", "w", "t")
            out.append(("parquet", draw(parquet_rows(cols))))
    return out


def write_file(root: Path, i: int, kind: str, data: Any) -> list[dict[str, Any]]:
    """Write batch ``i``; returns its rows as the model reads them."""
    if kind == "jsonl":
        write_jsonl(root, f"{i:04d}.jsonl", data)
        return list(data)
    present, rows = data
    names = ["key", "offset", "__deleted", *present]
    types = {"key": pa.int64(), "offset": pa.int64(), "__deleted": pa.bool_(), **TYPES}
    table = pa.table({c: pa.array([r[c] for r in rows], types[c]) for c in names})
    write_parquet(root, f"{i:04d}.parquet", table)
    return rows


@settings(max_examples=60, deadline=None)
@given(
    history=histories(),
    scope=st.sampled_from(["batch", "global"]),
    buckets=st.sampled_from([1, 2, 4]),
    runs=st.integers(1, 3),
)
def test_keep_matches_model(
    history: list[tuple[str, Any]], scope: str, buckets: int, runs: int
) -> None:
    shard = memory_shard()
    model = UpsertModel(scope, missing="keep")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        request = IngestRequest(order_scope=scope, buckets=buckets, missing="keep")
        cut = max(1, len(history) // runs)
        for i, (kind, data) in enumerate(history):
            model.apply(write_file(root, i, kind, data))
            if (i + 1) % cut == 0:
                ingest(shard, str(root), request)
        ingest(shard, str(root), IngestRequest())  # later runs may omit it
    state = shard.state()
    assert state.upper == len(history)
    assert state.num_errors() == len(model.errors)
    for ts in range(len(history)):
        assert snapshot_rows(shard, ts) == model.rows(ts), f"snapshot at {ts}"
        assert change_rows(shard, ts) == model.row_changes(ts), f"changes at {ts}"
    # Late rows (global scope) are kept as they came, whatever they leave out.
    names = [f"{i:04d}.{kind}" for i, (kind, _data) in enumerate(history)]
    assert [(r["file"], r["row"], r["key"]["key"], r["order"], r["stored_order"])
            for r in ShardTable(shard).late_records()] == [
        (names[ts], row, k[0], order, stored) for ts, row, k, order, stored in model.late]
    options = ShardIngestConfig.read(state.config).options
    checked = verify_typed_parts(shard.blob, shard.shard_id, state.batches, options)
    assert not checked.problems
    assert unreferenced_blobs(shard) == set()
