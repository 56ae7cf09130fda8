"""``--missing keep``: a bucket's rows made whole before the drain (CONTRACT.md, "Change
data capture").

A row marks the value columns it leaves out (``landing.missing``: an absent field or
column, or the placeholder). :func:`fill_missing` gives each such row the values the
key had just before it: the rows of a key in the batch are applied one after the
other, in ``(order, position)`` order (ties: file order), each taking its missing
values from the result of the one before it, or from the key's row in the state before
the batch, or null when the key has none (absent, or a tombstone); a delete leaves no
row, so the row after it takes nulls. In the global scope, rows that are *late* (order
not greater than the state's order for the key, tombstones included) are skipped
first: they neither take nor give values and stay as they came (the drain skips them).

The drain (``columnar.drain``) then runs unchanged on complete rows: the key's winner
is its last row, which now carries the fold of all of them, and the retraction it
emits is the state's old full row.

Invariants:

- Output rows correspond one to one, in order, with the input rows; only ``row`` and the
  ``v:<column>`` values of rows that are neither deletes nor late and leave something
  out change; the ``missing`` column is dropped.
- A kept value is the exact value stored (decoded from the state's row, or taken from
  an earlier row's typed values): nothing is converted on the way, and the re-encoded
  row is what validation would have encoded for those values.
- Cost: nothing per key in Python; a sort of the bucket's rows, one state lookup of the
  batch's keys, and per column that some row leaves out, one running maximum and one
  take. A batch in which no row leaves anything out returns at once.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from upsert_core.codec import encode_columns_in_chunks, encode_datums
from upsert_core.columnar.merge import lookup
from upsert_core.columnar.state import ColumnarState, split_keys
from upsert_core.landing.missing import MISSING_COLUMN, unpack
from upsert_core.landing.rows import decode_rows_to_table, encode_row
from upsert_core.landing.schema import ARROW_TYPES, SourceSchema
from upsert_core.order_keys import from_arrow, is_order_keys
from upsert_core.persist.write.parts import VALUE_PREFIX

_EMPTY_ROW = encode_datums([])
"""The encoded row of no values: decodes as every column null."""


def _column(table: pa.Table, name: str) -> pa.Array:
    col = table.column(name)
    return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)


def fill_missing(state: ColumnarState, rows: pa.Table, row_schema: SourceSchema) -> pa.Table:
    """``rows`` (one bucket's exchanged rows of one file, with their ``missing`` bitmaps)
    with every row made whole from the key's earlier one; see the module docstring.
    ``row_schema`` is the schema the rows were validated with (the shard's, plus any
    columns the file added)."""
    rest = rows.drop_columns([MISSING_COLUMN]) if MISSING_COLUMN in rows.column_names else rows
    n, names = rows.num_rows, row_schema.names
    if n == 0 or MISSING_COLUMN not in rows.column_names:
        return rest
    marks = unpack(rows.column(MISSING_COLUMN), len(names))
    deleted = np.asarray(_column(rows, "deleted").to_numpy(zero_copy_only=False), bool)
    if not marks[~deleted].any():
        return rest

    hi, lo = split_keys(_column(rows, "key"))
    orders = from_arrow(_column(rows, "order"))
    positions = np.asarray(_column(rows, "position").to_numpy(zero_copy_only=False), np.int64)
    perm = np.lexsort((positions, orders, lo, hi))  # by key, then (order, position)
    s_hi, s_lo = hi[perm], lo[perm]
    starts = np.ones(n, dtype=bool)
    starts[1:] = (s_hi[1:] != s_hi[:-1]) | (s_lo[1:] != s_lo[:-1])
    first = np.flatnonzero(starts)
    group = np.cumsum(starts) - 1
    keys = len(first)
    look = lookup(state, s_hi[first], s_lo[first])
    late = np.zeros(n, dtype=bool)
    if (look.orders is not None and look.found.any()
            and is_order_keys(look.orders) == is_order_keys(orders)):
        # SUBTLE: a state of the other kind of order is refused by the drain; it is
        # never compared here.
        late = look.found[group] & (look.orders[group] >= orders[perm])

    # Sources of values: the keys' rows before the batch (0..keys-1), the batch's rows
    # (keys + original index), and one row of nulls (what a delete leaves).
    before = decode_rows_to_table(
        row_schema, pc.fill_null(look.rows, pa.scalar(_EMPTY_ROW, look.rows.type)))
    current = _values(rows, row_schema)
    nulls = pa.table([pa.nulls(1, ARROW_TYPES[t]) for _, t in row_schema.columns],
                     names=list(names))
    sources = pa.concat_tables([before, current, nulls]).combine_chunks()
    null_row = keys + n

    # The sequence each key's values run through: its row before the batch, then its
    # rows in (order, position) order; a running maximum finds the last giver.
    at_row = np.arange(n) + group + 1  # sequence position of sorted row i
    at_key = first + np.arange(keys)  # sequence position of key g's row before
    giver = np.empty(keys + n, dtype=np.int64)
    giver[at_key] = np.arange(keys)
    s_deleted = deleted[perm]
    giver[at_row] = np.where(s_deleted, null_row, keys + perm)
    filled = ~late & ~s_deleted  # the sorted rows that take values
    changed = np.zeros(n, dtype=bool)  # by original index
    new_columns: list[pa.Array] = []
    for j, name in enumerate(names):
        left_out = marks[perm, j] & filled
        own = _column(current, name)
        if not left_out.any():
            new_columns.append(own)
            continue
        candidate = np.full(keys + n, -1, dtype=np.int64)
        candidate[at_key] = at_key
        gives = ~late & (s_deleted | ~marks[perm, j])
        candidate[at_row[gives]] = at_row[gives]
        last = np.maximum.accumulate(candidate)
        take = keys + perm  # each row its own value ...
        take = np.where(left_out, giver[last[at_row]], take)  # ... or its giver's
        by_row = np.empty(n, dtype=np.int64)
        by_row[perm] = take
        changed[perm[left_out]] = True
        new_columns.append(_column(sources, name).take(pa.array(by_row, pa.int64())))

    values = pa.table(new_columns, names=list(names))
    row = _with_rows(_column(rows, "row"), values, np.flatnonzero(changed))
    out = rest.set_column(rest.schema.get_field_index("row"), rest.schema.field("row"), row)
    out = out.drop_columns([c for c in out.column_names if c.startswith(VALUE_PREFIX)])
    for name, column in zip(names, values.columns, strict=True):
        out = out.append_column(VALUE_PREFIX + name, column)
    return out


def _values(rows: pa.Table, row_schema: SourceSchema) -> pa.Table:
    """The rows' typed values: their ``v:`` columns when validation kept them (all, of
    the schema's types), else decoded from their encoded rows (the same values)."""
    wanted = [VALUE_PREFIX + name for name in row_schema.names]
    have = rows.schema
    if all(have.get_field_index(c) >= 0 and have.field(c).type == ARROW_TYPES[t]
           for c, (_, t) in zip(wanted, row_schema.columns, strict=True)):
        return rows.select(wanted).rename_columns(list(row_schema.names))
    return decode_rows_to_table(row_schema, _column(rows, "row"))


def _with_rows(row: pa.Array, values: pa.Table, changed: np.ndarray) -> pa.Array:
    """``row`` with the rows at ``changed`` encoded again from ``values``."""
    if not len(changed):
        return row
    index = pa.array(changed, pa.int64())
    picked = [_column(values, name).take(index) for name in values.column_names]
    encoded = encode_columns_in_chunks(picked, drop_trailing_nulls=True)
    if encoded is None:
        # The vectorised encoder declines some values (it is exact or nothing); these
        # are values validation or the state already encoded, so encode_row takes them.
        encoded = pa.array(
            [encode_row(list(values)) for values in zip(*(_python(c) for c in picked),
                                                          strict=True)],
            pa.binary(),
        )
    full = np.arange(len(row), dtype=np.int64)
    full[changed] = len(row) + np.arange(len(changed))
    both = pa.concat_arrays([row.cast(pa.binary()), encoded.cast(pa.binary())])
    return both.take(pa.array(full, pa.int64()))


def _python(column: pa.Array) -> list[object]:
    """Codec-ready Python values (timestamps as naive UTC datetimes, as validation
    passes them to ``encode_row``)."""
    if pa.types.is_timestamp(column.type):
        column = pc.cast(column, pa.timestamp("us"))
    values: list[object] = column.to_pylist()
    return values
