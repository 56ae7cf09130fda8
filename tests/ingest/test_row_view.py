"""``upsert_core.row_view``: what reads show of a shard's rows. A Debezium shard's order
fields are stored in its rows but hidden from reads; ``project_updates`` consolidates
updates as visible rows (checked against a dict oracle on generated updates); the typed
and the merged snapshot read show the same visible columns."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.debezium_events import event, write_events_jsonl
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.shard_config import ShardOptions
from upsert_core.landing import LogicalType, SourceSchema, decode_row, encode_key, encode_row
from upsert_core.landing.debezium import DELETE_MARKER, Envelope
from upsert_core.landing.schema import ENVELOPE_ORDER_PREFIX
from upsert_core.order_scope import OrderScope
from upsert_core.persist.write.consolidate import UPDATE_SCHEMA, is_sorted
from upsert_core.row_view import RowView
from upsert_core.shard_table import ShardTable

from .helpers import memory_shard

T = LogicalType
STORED = SourceSchema(key=("id",), order="source.lsn", deleted=DELETE_MARKER, columns=(
    ("id", T.INT64), ("source.lsn", T.INT64), ("v", T.STRING), ("n", T.FLOAT64)))
VIEW = RowView(STORED, ("source.lsn",))


def test_hidden_columns_follow_the_stored_envelope_and_order() -> None:
    several = SourceSchema(key=("id",), order=("source.file", "source.pos"),
                           deleted=DELETE_MARKER)
    assert ShardOptions(STORED, OrderScope.BATCH, 4, Envelope.DEBEZIUM).hidden_columns == (
        "source.lsn",)
    assert ShardOptions(several, OrderScope.GLOBAL, 4, Envelope.DEBEZIUM).hidden_columns == (
        "source.file", "source.pos")
    plain = ShardOptions(SourceSchema(), OrderScope.BATCH, 4)
    assert plain.hidden_columns == ()
    assert RowView.of(None) == RowView(None) and RowView(None).names == ()


def test_the_visible_schema_keeps_the_stored_order_without_the_hidden_columns() -> None:
    assert VIEW.names == ("id", "v", "n")
    assert VIEW.arrow_schema.names == ["id", "v", "n"]
    plain = RowView(STORED)
    assert plain.visible is STORED and plain.names == STORED.names
    updates = pa.table({"key": [b"k"], "row": [encode_row([1, 2])], "ts": [0], "diff": [1]},
                       schema=UPDATE_SCHEMA)
    assert plain.project_updates(updates) is updates  # nothing hidden: untouched


VALUES = st.tuples(st.integers(0, 2), st.integers(0, 3), st.sampled_from([None, "a", "b"]),
                   st.sampled_from([None, 0.0, -0.0, 1.5]))


@settings(max_examples=200, deadline=None)
@given(updates=st.lists(st.tuples(VALUES, st.integers(0, 2), st.sampled_from([-1, 1, 2])),
                        max_size=30))
def test_projected_updates_are_the_visible_rows_consolidated(
    updates: list[tuple[tuple[Any, ...], int, int]]
) -> None:
    rows = [encode_row(list(values)) for values, _ts, _diff in updates]
    table = pa.table({"key": [encode_key([values[0]]) for values, _, _ in updates],
                      "row": rows, "ts": [ts for _, ts, _ in updates],
                      "diff": [diff for _, _, diff in updates]}, schema=UPDATE_SCHEMA)
    want: Counter[tuple[Any, ...]] = Counter()
    for (key, _lsn, v, n), ts, diff in updates:
        # -0.0 and 0.0 are one value (the codec stores 0.0)
        want[(key, v, None if n is None else n + 0.0, ts)] += diff
    want = Counter({k: d for k, d in want.items() if d})

    projected = VIEW.project_updates(table)
    assert is_sorted(projected)
    got: Counter[tuple[Any, ...]] = Counter()
    assert VIEW.visible is not None
    for row, ts, diff in zip(projected.column("row").to_pylist(),
                             projected.column("ts").to_pylist(),
                             projected.column("diff").to_pylist(), strict=True):
        decoded = decode_row(VIEW.visible, row)
        point = (decoded["id"], decoded["v"], decoded["n"], ts)
        assert point not in got and diff != 0, "not consolidated"
        got[point] = diff
        assert encode_row([decoded[c] for c in VIEW.names]) == row  # a visible row's bytes
    assert got == want


@pytest.mark.parametrize("typed", ["1", "0"])
def test_typed_and_merged_snapshots_show_the_same_visible_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, typed: str
) -> None:
    """Typed parts are read by value column (the hidden ones are never loaded); plain
    parts (``UPSERT_TYPED_PARTS=0``) through the merged read, decoded, then projected."""
    monkeypatch.setenv("UPSERT_TYPED_PARTS", typed)
    write_events_jsonl(tmp_path, "0001.jsonl", [
        event("r", 10, after={"id": 1, "v": "a"}), event("r", 11, after={"id": 2, "v": "b"})])
    write_events_jsonl(tmp_path, "0002.jsonl", [
        event("u", 12, after={"id": 1, "v": "a"}), event("d", 13, before={"id": 2})])
    shard = memory_shard()
    ingest(shard, str(tmp_path), IngestRequest(key=("id",), envelope="debezium", buckets=2))
    table = ShardTable(shard)
    assert table.source_schema() is not None
    stored = table.source_schema().names
    assert ENVELOPE_ORDER_PREFIX + "source.lsn" in stored and "source.lsn" not in stored
    for as_of, want in ((0, [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}]),
                        (1, [{"id": 1, "v": "a"}])):
        snapshot = table.snapshot(as_of)  # ... but not shown
        assert snapshot.schema == table.schema and snapshot.column_names == ["id", "v"]
        assert sorted(snapshot.to_pylist(), key=lambda r: r["id"]) == want
    changes = table.changes(1, 2).to_pylist()
    assert changes == [{"id": 2, "v": "b", "__ts": 1, "__diff": -1}]
