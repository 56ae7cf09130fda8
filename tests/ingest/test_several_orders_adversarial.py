"""Orders of three columns whose values stress the order keys (``order_keys``): text
with NUL bytes, prefixes of each other and non-ASCII code points, int64 extremes and
negatives, timestamps before and after the epoch (Parquet). Ingested whole and as
splits cut anywhere (the Spark split path's steps, in this process), against the dict
model with tuple orders, both scopes: the same snapshots, changes and error rows."""

from __future__ import annotations

import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.ingest.helpers import (
    change_rows,
    memory_shard,
    snapshot_rows,
    write_jsonl,
    write_parquet,
)
from tests.ingest.test_several_orders_model import _drop_checkpoints
from tests.ingest.test_split_steps import SplitInProcess
from tests.model import UpsertModel
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.engine import InProcessEngine

TEXT = st.sampled_from(["", "a", "a\x00", "a\x00\x00", "a\x00b", "a\x01", "ab", "é",
                        "\uffff", "\U0001f600", "\x00"])
INT = st.sampled_from([-(2**63), -(2**63) + 1, -256, -1, 0, 1, 255, 256, 2**63 - 1])
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
TIME = st.sampled_from([-(10**12), -1, 0, 1, 10**6, 10**12]).map(
    lambda us: EPOCH + timedelta(microseconds=us))


@st.composite
def rows(draw: st.DrawFn, with_time: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"key": draw(st.integers(0, 3)), "f": draw(TEXT), "p": draw(INT),
                           "t": draw(TIME) if with_time else draw(INT)}
    if draw(st.integers(0, 12)) == 0:
        row[draw(st.sampled_from(["f", "p", "t"]))] = None  # a null order: an error row
    if draw(st.integers(0, 4)) == 0:
        row["__deleted"] = True
    else:
        row["v"] = draw(st.sampled_from(["x", "y"]))
    return row


def _write(root: Path, name: str, fmt: str, batch: list[dict[str, Any]]) -> None:
    if fmt == "jsonl":
        write_jsonl(root, f"{name}.jsonl", batch)
        return
    write_parquet(root, f"{name}.parquet", pa.table({
        "key": pa.array([r["key"] for r in batch], pa.int64()),
        "f": pa.array([r["f"] for r in batch], pa.string()),
        "p": pa.array([r["p"] for r in batch], pa.int64()),
        "t": pa.array([r["t"] for r in batch], pa.timestamp("us", "UTC")),
        "v": pa.array([r.get("v") for r in batch], pa.string()),
        "__deleted": pa.array([r.get("__deleted") for r in batch], pa.bool_()),
    }))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), fmt=st.sampled_from(["jsonl", "parquet"]),
       scope=st.sampled_from(["batch", "global"]), split_bytes=st.integers(30, 400))
def test_three_column_orders_whole_and_split_match_the_model(
    data: st.DataObject, fmt: str, scope: str, split_bytes: int,
) -> None:
    batches = data.draw(st.lists(st.lists(rows(fmt == "parquet"), min_size=1, max_size=12),
                                 min_size=1, max_size=4))
    model = UpsertModel(scope, order=("f", "p", "t"))
    whole, split = memory_shard("whole"), memory_shard("split")
    request = IngestRequest(order_scope=scope, buckets=2, order="f,p,t")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i, batch in enumerate(batches):
            _write(root, f"{i:04d}", fmt, batch)
            model.apply(batch)
        ingest(whole, str(root), request, engine=InProcessEngine(cache=None))
        ingest(split, str(root), request, engine=SplitInProcess(split_bytes, seed=1))
    for shard in (whole, split):
        assert shard.state().upper == len(batches)
        errors = sorted((e["file"], e["row"]) for e in shard.errors())
        assert errors == sorted((f"{ts:04d}.{fmt}", row) for ts, row, _ in model.errors)
        for ts in range(len(batches)):
            assert snapshot_rows(shard, ts) == model.rows(ts), f"snapshot at {ts}"
            assert change_rows(shard, ts) == model.row_changes(ts), f"changes at {ts}"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), fmt=st.sampled_from(["jsonl", "parquet"]))
def test_three_column_orders_rebuilt_after_lost_checkpoints_match_the_model(
    data: st.DataObject, fmt: str,
) -> None:
    # The global scope rebuilds each key's order key from its stored row (timestamps
    # and text as stored) when its checkpoint is gone: the same keys, the same skips.
    batches = data.draw(st.lists(st.lists(rows(fmt == "parquet"), min_size=1, max_size=10),
                                 min_size=2, max_size=5))
    model = UpsertModel("global", order=("f", "p", "t"))
    shard = memory_shard()
    request = IngestRequest(order_scope="global", buckets=1, order="f,p,t")
    rebuilt = 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i, batch in enumerate(batches):
            _write(root, f"{i:04d}", fmt, batch)
            model.apply(batch)
            report = ingest(shard, str(root), request)
            assert not report.warnings
            rebuilt += len(report.rehydrations)
            _drop_checkpoints(shard)
    good = [any(model.order_of(r) is not None and r["key"] is not None for r in b)
            for b in batches]
    assert rebuilt or not (good[0] and any(good[1:]))  # the bucket was rebuilt
    for ts in range(len(batches)):
        assert snapshot_rows(shard, ts) == model.rows(ts), f"snapshot at {ts}"
        assert change_rows(shard, ts) == model.row_changes(ts), f"changes at {ts}"
