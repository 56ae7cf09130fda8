"""``--missing keep`` against the dict model (``tests.model``, ``missing="keep"``) where
``test_missing_keep_model`` does not go: an order of several columns (a string, then an
integer: MySQL's binlog file and position), Debezium change events (JSON Lines with
left-out fields and the placeholder in string and integer columns; Parquet with the
placeholder in a string field), and the buckets' checkpoints lost between runs, so the
key's row before the batch comes from a bucket rebuilt from the shard. Both scopes;
the snapshot and the changes at every ts and the error count must equal the model's."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.debezium_events import event, write_events_jsonl, write_events_parquet
from tests.model import UpsertModel
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.shard_config import CHECKPOINT_REF_PREFIX
from upsert_core.landing.schema import ENVELOPE_ORDER_PREFIX
from upsert_core.persist.shard import Shard

from .helpers import (
    change_rows,
    memory_shard,
    read_change_rows,
    read_snapshot_rows,
    snapshot_rows,
    write_jsonl,
)

PH = "__debezium_unavailable_value"
LSN = ENVELOPE_ORDER_PREFIX + "source.lsn"
"""A Debezium shard's stored order column (the reserved name of ``source.lsn``)."""
ABSENT = object()
IMAGE = pa.struct([("key", pa.int64()), ("v", pa.string()), ("n", pa.int64())])


def _lose_checkpoints(shard: Shard) -> None:
    for name, ref in shard.state().config.items():
        if name.startswith(CHECKPOINT_REF_PREFIX) and ref:
            shard.blob.delete(ref)


def _check(shard: Shard, model: UpsertModel, hidden: tuple[str, ...] = ()) -> None:
    """The stored rows against the model's; with ``hidden`` (a Debezium shard's order)
    also the Python read API's rows, which show the model's rows without them."""
    state = shard.state()
    assert state.num_errors() == len(model.errors)
    for ts in range(state.upper):
        assert snapshot_rows(shard, ts) == model.rows(ts), f"snapshot at {ts}"
        assert change_rows(shard, ts) == model.row_changes(ts), f"changes at {ts}"
        if hidden:
            assert read_snapshot_rows(shard, ts) == model.rows(ts, hidden), f"read at {ts}"
            assert read_change_rows(shard, ts) == model.row_changes(ts, hidden), (
                f"read changes at {ts}")


@st.composite
def binlog_row(draw: st.DrawFn) -> dict[str, Any]:
    row: dict[str, Any] = {"key": draw(st.integers(0, 3)),
                           "file": draw(st.sampled_from(["bin.1", "bin.2"])),
                           "pos": draw(st.integers(0, 3))}
    if draw(st.integers(0, 5)) == 0:
        row["__deleted"] = True
        return row
    for col, values in (("v", ["a", "", PH, None]), ("w", [-0.0, 1e308, PH, None]),
                        ("n", [-(2**63), 2**63 - 1, PH, None])):
        value = draw(st.sampled_from([ABSENT, *values]))
        if value is not ABSENT:
            row[col] = value
    return row


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files=st.lists(st.lists(binlog_row(), max_size=8), min_size=1, max_size=4),
       scope=st.sampled_from(["batch", "global"]), buckets=st.sampled_from([1, 3]),
       lose=st.booleans())
def test_keep_with_several_order_columns(
    files: list[list[dict[str, Any]]], scope: str, buckets: int, lose: bool
) -> None:
    shard = memory_shard()
    model = UpsertModel(scope, missing="keep", order=("file", "pos"))
    request = IngestRequest(order_scope=scope, buckets=buckets, missing="keep",
                            order="file,pos")
    with tempfile.TemporaryDirectory() as tmp:
        for i, rows in enumerate(files):
            write_jsonl(Path(tmp), f"{i:04d}.jsonl", rows)
            model.apply(rows)
            ingest(shard, tmp, request)
            if lose:
                _lose_checkpoints(shard)
    _check(shard, model)


@st.composite
def change_event(draw: st.DrawFn, parquet: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """An event and the plain row the model reads for it."""
    key, lsn = draw(st.integers(0, 3)), draw(st.integers(0, 4))
    if draw(st.integers(0, 4)) == 0:
        before = {"key": key, "v": None, "n": None} if parquet else {"key": key}
        return event("d", lsn, before=before), {"key": key, LSN: lsn, "__deleted": True}
    after: dict[str, Any] = {"key": key}
    # Parquet has no per-row absent field and no string in an integer column.
    for col, values in (("v", ["a", "b", PH, None]), ("n", [1, -5, None, *([] if parquet
                                                                           else [PH])])):
        value = draw(st.sampled_from(values if parquet else [ABSENT, *values]))
        if value is not ABSENT:
            after[col] = value
    op = draw(st.sampled_from(["c", "u", "r"]))
    return event(op, lsn, after=after), {**after, LSN: lsn}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), files=st.integers(1, 4), scope=st.sampled_from(["batch", "global"]),
       buckets=st.sampled_from([1, 3]), lose=st.booleans())
def test_keep_with_debezium_events(
    data: st.DataObject, files: int, scope: str, buckets: int, lose: bool
) -> None:
    shard = memory_shard()
    model = UpsertModel(scope, missing="keep", order=LSN)
    request = IngestRequest(order_scope=scope, buckets=buckets, missing="keep",
                            envelope="debezium")
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(files):
            parquet = data.draw(st.booleans())
            pairs = data.draw(st.lists(change_event(parquet), min_size=1, max_size=8))
            if parquet:
                write_events_parquet(Path(tmp), f"{i:04d}.parquet", [e for e, _ in pairs],
                                     image=IMAGE)
            else:
                write_events_jsonl(Path(tmp), f"{i:04d}.jsonl", [e for e, _ in pairs])
            model.apply([row for _, row in pairs])
            ingest(shard, tmp, request)
            if lose:
                _lose_checkpoints(shard)
    _check(shard, model, hidden=(LSN,))


def test_a_row_at_the_stored_order_is_late_and_gives_no_value(tmp_path: Path) -> None:
    """Global scope: a row whose order equals the key's stored order is late (not greater),
    so the key's next row takes its left-out value from the state, not from it; in one
    file, rows with equal orders fold in file order."""
    write_jsonl(tmp_path, "a.jsonl", [{"key": 1, "offset": 3, "v": "stored", "w": 1}])
    write_jsonl(tmp_path, "b.jsonl", [
        {"key": 1, "offset": 4, "w": 2},  # applied after the late row below
        {"key": 1, "offset": 3, "v": "late"},  # late: not greater than 3
        {"key": 2, "offset": 1, "v": "first"},
        {"key": 2, "offset": 1, "w": 5},  # tie: after the row above, takes "first"
    ])
    shard = memory_shard()
    model = UpsertModel("global", missing="keep")
    for name in ("a.jsonl", "b.jsonl"):
        model.apply([json.loads(line) for line in (tmp_path / name).read_text().splitlines()])
    ingest(shard, str(tmp_path), IngestRequest(order_scope="global", missing="keep"))
    _check(shard, model)
    assert snapshot_rows(shard, 1) == {
        (("key", 1), ("offset", 4), ("v", "stored"), ("w", 2)): 1,
        (("key", 2), ("offset", 1), ("v", "first"), ("w", 5)): 1,
    }
