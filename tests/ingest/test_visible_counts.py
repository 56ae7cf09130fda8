"""A file's inserts and retractions count the changes a user's read shows
(``upsert_core.ingest.visible_counts``): for a Debezium shard, an update that changes only
the hidden order (a new LSN, the same ``after``) counts as nothing, in the report, in
``upsertctl ingest``'s lines and in Dagster's per-partition metadata, so the counts
agree with ``changes`` at the file's ts."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.debezium_events import event, write_events_jsonl, write_events_parquet
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.visible_counts import hidden_only_pairs
from upsert_core.landing import LogicalType, SourceSchema, encode_key, encode_row
from upsert_core.landing.debezium import DELETE_MARKER
from upsert_core.landing.rows import decode_rows_to_table
from upsert_core.persist.write.consolidate import UPDATE_SCHEMA
from upsert_core.row_view import RowView
from upsert_core.shard_table import ShardTable

from .helpers import memory_shard

T = LogicalType
STORED = SourceSchema(key=("id",), order="lsn", deleted=DELETE_MARKER, envelope_order=True,
                      columns=(("id", T.INT64), ("(debezium order) lsn", T.INT64),
                               ("v", T.STRING), ("n", T.FLOAT64)))
HIDDEN = STORED.order_columns
VALUE = st.tuples(st.integers(0, 3), st.sampled_from([None, "a", "b"]),
                  st.sampled_from([None, 0.0, -0.0, 1.5, float("nan")]))


@settings(max_examples=300, deadline=None)
@given(keys=st.dictionaries(st.integers(0, 30), st.tuples(
    st.one_of(st.none(), VALUE), st.one_of(st.none(), VALUE)), max_size=20),
       typed=st.booleans())
def test_pairs_that_differ_only_in_hidden_columns_are_what_reads_cancel(
    keys: dict[int, tuple[Any, Any]], typed: bool
) -> None:
    """One bucket's drain output (per key at most a retraction and an insertion, sorted
    by key): the pairs counted are exactly those the read's projection cancels, so the
    counts less them are the visible changes' counts."""
    entries = []
    for key, (old, new) in keys.items():
        for value, diff in ((old, -1), (new, 1)):
            if value is not None:
                lsn, v, n = value
                entries.append((encode_key([key]), encode_row([key, lsn, v, n]), diff))
    entries.sort(key=lambda e: (e[0], e[1]))
    table = pa.table({"key": [e[0] for e in entries], "row": [e[1] for e in entries],
                      "ts": [7] * len(entries), "diff": [e[2] for e in entries]},
                     schema=UPDATE_SCHEMA)
    values = decode_rows_to_table(STORED, table.column("row")) if typed else None
    same = hidden_only_pairs(table, STORED, HIDDEN, values)

    projected = RowView(STORED, HIDDEN).project_updates(table)
    diffs = np.asarray(projected.column("diff").to_numpy(), np.int64)
    stored_diffs = np.asarray(table.column("diff").to_numpy(), np.int64)
    assert int((stored_diffs == 1).sum()) - same == int((diffs == 1).sum())
    assert int((stored_diffs == -1).sum()) - same == int((diffs == -1).sum())
    assert hidden_only_pairs(table, STORED, (), values) == 0  # nothing hidden: plain counts


def _report(root: Path, shard: Any, **request: Any) -> Any:
    return ingest(shard, str(root), IngestRequest(key=("id",), envelope="debezium",
                                                  buckets=2, **request))


def _read_counts(shard: Any, ts: int) -> tuple[int, int]:
    diffs = ShardTable(shard).changes(ts, ts + 1).column("__diff").to_pylist()
    return diffs.count(1), diffs.count(-1)


def test_an_update_of_the_order_alone_counts_as_no_change(tmp_path: Path) -> None:
    for scope in ("batch", "global"):
        for fmt in ("jsonl", "parquet"):
            shard = memory_shard()
            with tempfile.TemporaryDirectory() as tmp:
                root = Path(tmp)
                write = write_events_jsonl if fmt == "jsonl" else write_events_parquet
                write(root, f"0001.{fmt}", [event("r", 10, after={"id": 1, "v": "a"}),
                                            event("r", 11, after={"id": 2, "v": "b"})])
                first = _report(root, shard, order_scope=scope)
                write(root, f"0002.{fmt}", [event("u", 12, after={"id": 1, "v": "a"}),
                                            event("u", 13, after={"id": 2, "v": "c"}),
                                            event("c", 14, after={"id": 3, "v": "d"})])
                second = _report(root, shard)
            assert (first.inserts, first.retractions) == (2, 0)
            [report] = second.files
            assert (report.inserts, report.retractions) == (2, 1), (scope, fmt)
            assert (second.inserts, second.retractions) == (2, 1)
            assert _read_counts(shard, 1) == (2, 1)
            assert second.to_dict()["files"][0]["inserts"] == 2
            assert ShardTable(shard).inspect()["live_rows"] == 3
