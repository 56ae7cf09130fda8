"""A drain's part values come from the file's validated values for insertions (floats
made canonical) and from decoding for retractions: equal to decoding every row."""

from __future__ import annotations

import struct
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa

from upsert_core.columnar import ColumnarState, drain_to_upper
from upsert_core.ingest.tasks import ROWS_SCHEMA, bucketed, part_values
from upsert_core.landing import RawBatch, SourceKind, SourceSchema, validate_batch
from upsert_core.landing.rows import decode_rows_to_table

PAYLOAD_NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000123))[0]


def _raw(offsets: list[int], floats: list[float | None]) -> RawBatch:
    n = len(offsets)
    return RawBatch("f.parquet", SourceKind.TYPED, {
        "key": pa.array([i % 3 for i in range(n)], pa.int64()),
        "offset": pa.array(offsets, pa.int64()),
        "f": pa.array(floats, pa.float64()),
        "s": pa.array([None if i % 4 == 0 else f"s{i}" for i in range(n)]),
        "t": pa.array([datetime(2026, 1, 1 + i, tzinfo=UTC) for i in range(n)],
                      pa.timestamp("us", tz="UTC")),
    }, np.arange(1, n + 1, dtype=np.int64))


def _drain(state: ColumnarState, raw: RawBatch, schema: SourceSchema, ts: int
           ) -> tuple[ColumnarState, SourceSchema]:
    batch = validate_batch(raw, schema)
    assert batch.values is not None
    rows = bucketed(batch, 1)
    drained = drain_to_upper(state, rows.select(ROWS_SCHEMA.names), ts)
    got = part_values(batch.schema, rows, drained.updates, drained.sources)
    want = decode_rows_to_table(batch.schema, drained.updates.column("row"))
    assert got.schema == want.schema
    # Bit for bit: canonical NaN and 0.0, as the codec stores them.
    for name in want.column_names:
        g, w = got.column(name).combine_chunks(), want.column(name).combine_chunks()
        if g.type == pa.float64():
            assert np.array_equal(g.to_numpy(zero_copy_only=False).view(np.uint64),
                                  w.to_numpy(zero_copy_only=False).view(np.uint64))
            assert g.is_null().equals(w.is_null())
        else:
            assert g.equals(w), name
    return drained.state, batch.schema


def test_part_values_equal_decoded_rows() -> None:
    schema = SourceSchema(key=("key",), order="offset", deleted="__deleted")
    state = ColumnarState.empty(keeps_orders=False)
    state, schema = _drain(state, _raw([1, 2, 3, 4, 5], [-0.0, PAYLOAD_NAN, None, 1.5, 2.0]),
                           schema, 0)
    # Updates: retractions (decoded) interleaved with insertions (taken), same key order.
    state, schema = _drain(state, _raw([6, 7, 8, 9], [0.0, float("nan"), -0.0, 3.5]),
                           schema, 1)
