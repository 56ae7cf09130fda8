"""Typed checkpoint bases: a bucket's state written once, as its rows' values.

When a bucket of the batch order scope needs a new checkpoint base (``tasks``: the
updates since its old base outgrew it) and the shard stores its rows as values (part
format 3), the state is written as a *typed base*: the bucket's live rows as a run in
the format-3 part layout (``key, ts, diff, v:<column>...``, sorted by key, every diff
+1, labelled with the bucket and consolidated), under the checkpoint prefix. It loads
as a part base does (``checkpoint``: the values are read and the rows derived only
where a batch touches them), so no encoded row is written or read for it.

The values are gathered without encoding a row: a base whose rows are derived gives
its values as they are; the rows changed since (the overlay) and a base that holds
encoded rows (one loaded from a columnar checkpoint) are decoded with the row schema.
Decoding a row and encoding its values gives back the same bytes
(``tests/core/test_codec_columns.py``), and a value column a row predates reads as
null, which its encoding drops (trailing nulls), so:

Invariants:

- Row ``i`` of a typed base derives, byte for byte, the row the state holds for its
  ``i``-th key; the keys are the state's, sorted and unique.
- Only the batch order scope: the state holds no tombstone and no order.
- A typed base is a checkpoint, not shard data: nothing but its checkpoint ref
  references it, and it is written before the compare-and-append that commits it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from upsert_core.columnar import ColumnarState, join_keys
from upsert_core.columnar.derived_rows import DerivedRows, as_row_array, take_rows
from upsert_core.columnar.merge import merge_sources
from upsert_core.columnar.state import U64
from upsert_core.errors import InvalidUpsertState
from upsert_core.ingest.base_cache import keep_base_copy
from upsert_core.landing import SourceSchema
from upsert_core.landing.rows import decode_rows_to_table
from upsert_core.landing.schema import ARROW_TYPES
from upsert_core.persist.keys import checkpoint_prefix, unique_name
from upsert_core.persist.location import Blob
from upsert_core.persist.write.parts import (
    BUCKET_META,
    CONSOLIDATED_META,
    FORMAT_META,
    VALUE_PREFIX,
    VALUES_ONLY_FORMAT,
    encode_parquet,
    format_bucket,
)


def typed_base_key(shard: str, bucket: int) -> str:
    """A fresh, unique blob key for a typed base of ``bucket``."""
    return f"{checkpoint_prefix(shard)}{bucket:04d}-{unique_name()}.parquet"


def _fields(schema: SourceSchema) -> list[pa.Field]:
    return [pa.field(name, ARROW_TYPES[typ]) for name, typ in schema.columns]


def _aligned(values: pa.Table, fields: list[pa.Field]) -> pa.Table:
    """``values`` with exactly ``fields`` (in order): a column it lacks is null."""
    columns = []
    for f in fields:
        if f.name in values.column_names:
            column = values.column(f.name)
            if column.type != f.type:
                raise InvalidUpsertState(
                    f"a state row's column {f.name!r} is {column.type}, not {f.type}"
                )
            columns.append(column)
        else:
            columns.append(pa.nulls(values.num_rows, f.type))
    unknown = set(values.column_names) - {f.name for f in fields}
    if unknown:
        raise InvalidUpsertState(f"a state row has columns the row schema lacks: {unknown}")
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


SLICE_ROWS = 256 * 1024
"""Rows decoded or gathered at a time: a bucket's string column may outgrow the 2 GiB
one Arrow string array holds, so whole columns are never decoded or taken at once."""


def _decoded(rows: pa.Array, schema: SourceSchema, fields: list[pa.Field]) -> pa.Table:
    """Encoded ``rows`` decoded under ``schema``, a slice at a time (chunked columns)."""
    pieces = [
        _aligned(decode_rows_to_table(schema, rows.slice(start, SLICE_ROWS)), fields)
        for start in range(0, len(rows), SLICE_ROWS)
    ]
    return pa.concat_tables(pieces) if pieces else pa.schema(fields).empty_table()


def _level_values(rows: object, schema: SourceSchema, fields: list[pa.Field]) -> pa.Table:
    if isinstance(rows, DerivedRows):
        return _aligned(rows.values, fields)
    return _decoded(as_row_array(rows), schema, fields)


def _gathered(table: pa.Table, at: np.ndarray) -> pa.Table:
    """Rows ``at`` of ``table`` (chunked columns of any size: ``take_rows``)."""
    return pa.Table.from_arrays(
        [take_rows(column, at) for column in table.columns], schema=table.schema
    )


def state_values(state: ColumnarState, schema: SourceSchema) -> tuple[U64, U64, pa.Table]:
    """The keys of ``state`` (batch scope) and its rows' values under ``schema``."""
    if state.orders is not None:
        raise InvalidUpsertState("a typed base holds a batch-scope state only")
    fields = _fields(schema)
    base = _level_values(state.rows, schema, fields)
    ov = state.overlay
    if ov is None:
        return state.hi, state.lo, base
    keep = ~ov.gone
    changed = _decoded(ov.rows.filter(pa.array(keep)), schema, fields)
    n = len(state.hi)
    sources = merge_sources(n, ov.base_index, ov.in_base, keep, ov.gone)
    # Changes are numbered over the whole overlay; only the kept ones were decoded.
    rank = np.cumsum(keep) - 1
    from_overlay = sources >= n
    at = sources.copy()
    at[from_overlay] = n + rank[sources[from_overlay] - n]
    values = _gathered(pa.concat_tables([base, changed]), at)
    return (
        np.concatenate([state.hi, ov.hi])[sources],
        np.concatenate([state.lo, ov.lo])[sources],
        values,
    )


def write_typed_base(
    blob: Blob, shard: str, bucket: int, buckets: int, upper: int,
    state: ColumnarState, schema: SourceSchema,
) -> tuple[str, int]:
    """Write ``state`` (bucket ``bucket`` of ``buckets``, as of ``upper``) as a typed
    base; returns its blob key and size in bytes."""
    hi, lo, values = state_values(state, schema)
    return write_typed_base_values(blob, shard, bucket, buckets, upper, hi, lo, values)


def write_typed_base_values(
    blob: Blob, shard: str, bucket: int, buckets: int, upper: int,
    hi: U64, lo: U64, values: pa.Table,
) -> tuple[str, int]:
    """Write a typed base of the keys ``(hi, lo)`` (sorted, unique, all of bucket
    ``bucket`` of ``buckets``) whose rows hold ``values`` (the row schema's columns, as
    :func:`state_values` gives them), as of ``upper``; returns its blob key and size."""
    n = len(hi)
    table = pa.Table.from_arrays(
        [
            join_keys(hi, lo).cast(pa.binary()),
            pa.array(np.full(n, upper - 1, np.int64)),
            pa.array(np.ones(n, np.int64)),
            *values.columns,
        ],
        names=["key", "ts", "diff", *(VALUE_PREFIX + name for name in values.column_names)],
    ).replace_schema_metadata({
        FORMAT_META: str(VALUES_ONLY_FORMAT).encode(),
        BUCKET_META: format_bucket((bucket, buckets)).encode(),
        CONSOLIDATED_META: b"1",
    })
    data = encode_parquet(table)
    key = typed_base_key(shard, bucket)
    blob.set(key, data)
    # The next process maps this copy instead of fetching and decoding the blob (a
    # batch after a new base paid that decode and the copy's write: ~0.9 s at 1M keys).
    keep_base_copy(blob, shard, bucket, key, table)
    return key, len(data)
