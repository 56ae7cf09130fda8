"""A bucket's drain into an empty batch-scope state, from the file's values alone.

The first file of a shard (``FileTask.defers_rows``) is validated without encoding its
rows (``ValidatedBatch.rows_deferred``): a bucket that starts empty never compares an
encoded row, since every winner is an insertion with nothing to retract, and its
state (:class:`~upsert_core.columnar.derived_rows.DerivedRows`) and its values-only
part need the values only. :func:`drain_into_empty` does for such a bucket what
``columnar.drain_to_upper`` followed by ``tasks.part_values`` does, without a row:

1. Winners: per key the row with the greatest ``(order, position)``
   (``columnar.drain.winners``, the same function), in key order.
2. A winning delete changes nothing (the key has no row); every other winner is one
   insertion, at ``ts``, of its values with floats made canonical as the codec stores
   them.
3. The new state holds exactly the inserted keys, each row derived from its values.

Invariants:

- Only for the batch order scope, an empty state and rows with their typed values
  (``v:<column>`` for every row column, of the schema's types: :func:`has_values`);
  the caller checks, and otherwise encodes the rows (:func:`with_encoded_rows`, exactly
  as validation would have) and drains as always.
- The insertions, their values, the counts and the state equal, key for key, what the
  general drain gives for the same rows once encoded, and the part written from them
  (``persist.write.parts.write_insertions_part``) is byte for byte the encoded path's
  (``tests/ingest/test_first_drain.py``), so the shard cannot tell which one ran.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from upsert_core.columnar import ColumnarState
from upsert_core.columnar.derived_rows import DerivedRows
from upsert_core.columnar.drain import winners
from upsert_core.columnar.state import join_keys, split_keys
from upsert_core.landing import SourceSchema
from upsert_core.landing.schema import ARROW_TYPES
from upsert_core.order_keys import from_arrow
from upsert_core.persist.write.parts import VALUE_PREFIX, rows_of_values


@dataclass(frozen=True)
class FirstDrain:
    """The insertions of a drain into an empty state and the state after it."""

    keys: pa.Array
    """The inserted keys (16-byte digests), strictly increasing."""
    values: pa.Table
    """Row ``i``: the values inserted for ``keys[i]`` (the row columns, as stored)."""
    state: ColumnarState
    winners: int
    """Keys the rows named (a winning delete included)."""


def rows_deferred(rows: pa.Table) -> bool:
    """Whether ``rows`` (a bucket's exchanged rows) came without their encoded rows
    (validation deferred them: every ``row`` is null, which an encoded row never is)."""
    return rows.num_rows > 0 and rows.column("row").null_count == rows.num_rows


def _value_names(schema: SourceSchema) -> list[str]:
    return [VALUE_PREFIX + name for name in schema.names]


def has_values(rows: pa.Table, schema: SourceSchema) -> bool:
    """Whether ``rows`` carry every row column's typed values (``v:<column>``)."""
    have = {name: rows.schema.field(name).type for name in rows.column_names}
    return bool(schema.names) and all(
        have.get(VALUE_PREFIX + name) == ARROW_TYPES[typ] for name, typ in schema.columns
    )


def with_encoded_rows(rows: pa.Table, schema: SourceSchema) -> pa.Table:
    """``rows`` with their encoded rows when validation deferred them (as validation
    would have encoded them: ``persist.write.parts.rows_of_values`` of the values, trailing
    nulls dropped), else ``rows`` unchanged."""
    if not rows_deferred(rows):
        return rows
    if not has_values(rows, schema):
        raise ValueError("deferred rows came without their values")
    encoded = rows_of_values([rows.column(name) for name in _value_names(schema)])
    at = rows.column_names.index("row")
    return rows.set_column(at, rows.schema.field("row"), pa.chunked_array(
        encoded.chunks if isinstance(encoded, pa.ChunkedArray) else [encoded],
        rows.schema.field("row").type,
    ))


def canonical_floats(column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """Floats as the codec stores them: ``-0.0`` as ``0.0``, every NaN the quiet NaN;
    other columns unchanged."""
    if not pa.types.is_float64(column.type):
        return column
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    values = np.asarray(array.to_numpy(zero_copy_only=False), np.float64)
    bits = values.view(np.uint64)
    odd = (bits == np.uint64(0x8000000000000000)) | (
        np.isnan(values) & (bits != np.uint64(0x7FF8000000000000))
    )
    if not odd.any():
        return array
    fixed = values.copy()
    fixed[fixed == 0.0] = 0.0
    fixed[np.isnan(fixed)] = np.nan
    return pa.array(fixed, pa.float64(), mask=array.is_null().to_numpy(zero_copy_only=False))


def drain_into_empty(rows: pa.Table, schema: SourceSchema) -> FirstDrain:
    """Drain ``rows`` (one bucket's rows of one file, with values) into an empty
    batch-scope state; see the module docstring."""
    if rows.num_rows == 0:
        return FirstDrain(pa.array([], pa.binary(16)), _empty_values(schema),
                          ColumnarState.empty(keeps_orders=False), 0)
    key = rows.column("key").combine_chunks()
    hi, lo = split_keys(key)
    orders = from_arrow(rows.column("order").combine_chunks())
    positions = np.asarray(rows.column("position").to_numpy(), np.int64)
    win = winners(hi, lo, orders, positions)
    deleted = np.asarray(rows.column("deleted").to_numpy(), bool)[win]
    live = win[~deleted] if deleted.any() else win
    if not len(live):
        return FirstDrain(pa.array([], pa.binary(16)), _empty_values(schema),
                          ColumnarState.empty(keeps_orders=False), len(win))
    taken = rows.select(_value_names(schema)).take(pa.array(live, pa.int64()))
    values = pa.table([canonical_floats(col) for col in taken.columns], names=list(schema.names))
    l_hi, l_lo = hi[live], lo[live]
    state = ColumnarState.checked(l_hi, l_lo, DerivedRows(values), None)
    return FirstDrain(join_keys(l_hi, l_lo), values, state, len(win))


def _empty_values(schema: SourceSchema) -> pa.Table:
    return pa.schema([pa.field(n, ARROW_TYPES[t]) for n, t in schema.columns]).empty_table()
