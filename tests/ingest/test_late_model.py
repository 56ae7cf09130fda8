"""Late rows (CONTRACT.md, "Change data capture"): the in-process ingest's late
collection against the dict model's (``tests.model.UpsertModel.late``).

Random files with in-batch duplicates, order ties with the stored order, deletes
(tombstones: a late row may be late against a delete), null keys and orders (error
rows, never late), one or several order columns, both order scopes (batch: none),
several bucket counts, several runs, and the checkpoints lost between runs (the global
scope then rebuilds each key's order from its row and tombstone sets). The late
collection (file, row, key, order, stored order; by ts, then file order) must be the
model's, and every snapshot and change must still agree with the model.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.model import UpsertModel
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.shard_config import checkpoint_ref_name
from upsert_core.persist.shard import Shard
from upsert_core.persist.testing import unreferenced_blobs
from upsert_core.shard_table import ShardTable

from .helpers import change_rows, memory_shard, snapshot_rows, write_jsonl, write_parquet

FILES = ["bin.000001", "bin.000002", "a"]


@st.composite
def source_rows(draw: st.DrawFn, several: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"key": draw(st.one_of(st.integers(0, 4), st.none()))
                           if draw(st.integers(0, 14)) == 0 else draw(st.integers(0, 4))}
    nullable = draw(st.integers(0, 14)) == 0
    row["pos"] = draw(st.one_of(st.integers(-2, 5), st.none())) if nullable \
        else draw(st.integers(-2, 5))
    if several:
        row["file"] = draw(st.sampled_from(FILES))
    if draw(st.integers(0, 4)) == 0:
        row["__deleted"] = True
    else:
        row["v"] = draw(st.sampled_from(["a", "b"]))
    return row


def _write(root: Path, name: str, fmt: str, rows: list[dict[str, Any]], several: bool) -> str:
    if fmt == "jsonl":
        write_jsonl(root, f"{name}.jsonl", rows)
        return f"{name}.jsonl"
    columns: dict[str, pa.Array] = {
        "key": pa.array([r["key"] for r in rows], pa.int64()),
        "pos": pa.array([r["pos"] for r in rows], pa.int64()),
        "v": pa.array([r.get("v") for r in rows], pa.string()),
        "__deleted": pa.array([r.get("__deleted") for r in rows], pa.bool_()),
    }
    if several:
        columns["file"] = pa.array([r["file"] for r in rows], pa.string())
    write_parquet(root, f"{name}.parquet", pa.table(columns))
    return f"{name}.parquet"


def _drop_checkpoints(shard: Shard) -> None:
    for name, key in shard.state().config.items():
        if name.startswith(checkpoint_ref_name(0)[:-1]) and key:
            shard.blob.delete(key)


def expected_late(model: UpsertModel, names: list[str]) -> list[dict[str, Any]]:
    """The model's late rows as ``upsertctl late`` prints them (Python values)."""
    return [
        {"file": names[ts], "row": row, "key": {"key": key[0]},
         "order": list(order) if isinstance(order, tuple) else order,
         "stored_order": list(stored) if isinstance(stored, tuple) else stored}
        for ts, row, key, order, stored in model.late
    ]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    several=st.booleans(),
    data=st.data(),
    fmt=st.sampled_from(["jsonl", "parquet"]),
    scope=st.sampled_from(["batch", "global", "global"]),
    buckets=st.sampled_from([1, 4]),
    runs=st.integers(1, 3),
    lose_checkpoints=st.booleans(),
)
def test_late_rows_match_the_model(
    several: bool, data: st.DataObject, fmt: str, scope: str, buckets: int, runs: int,
    lose_checkpoints: bool,
) -> None:
    files = data.draw(st.lists(st.lists(source_rows(several), max_size=8), min_size=1,
                               max_size=6))
    order = ("file", "pos") if several else "pos"
    shard = memory_shard()
    model = UpsertModel(scope, order=order)
    names: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        request = IngestRequest(order_scope=scope, buckets=buckets,
                                order="file,pos" if several else "pos")
        cut = max(1, len(files) // runs)
        for i, rows in enumerate(files):
            names.append(_write(root, f"{i:04d}", fmt, rows, several))
            model.apply(rows)
            if (i + 1) % cut == 0:
                ingest(shard, str(root), request)
                if lose_checkpoints:
                    _drop_checkpoints(shard)
        ingest(shard, str(root), IngestRequest())
    table = ShardTable(shard)
    event("late rows" if model.late else "no late rows")
    assert list(table.late_records()) == expected_late(model, names)
    if scope == "batch":
        assert model.late == []
    assert table.late().num_rows == len(model.late)
    for ts in range(len(files)):
        assert snapshot_rows(shard, ts) == model.rows(ts), f"snapshot at {ts}"
        assert change_rows(shard, ts) == model.row_changes(ts), f"changes at {ts}"
    assert unreferenced_blobs(shard) == set()
