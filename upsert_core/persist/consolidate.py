"""Vectorised consolidation of differential updates ``(key, row, ts, diff)``.

Consolidating a collection of updates sums the diffs of updates that agree on
``(key, row, ts)`` and drops those whose sum is zero. Everything here works on whole
Arrow columns (pyarrow compute and numpy), never row by row in Python.

Invariants this module keeps:

- :func:`consolidate_sorted` requires its input sorted by ``(key, row, ts)`` and returns
  a table that is still sorted by ``(key, row, ts)``, holds each ``(key, row, ts)`` at
  most once and has no zero diff. It is O(n): one pass that finds runs of equal
  ``(key, row, ts)`` and sums each run with ``numpy.add.reduceat``.
- :func:`advance_ts` replaces every ``ts`` below a frontier by the frontier. The map
  ``ts -> max(ts, frontier)`` is monotone, so a table sorted by ``(key, row, ts)`` stays
  sorted after it, and consolidation may follow without a new sort.
- :func:`sort_updates` is the only place that sorts, and it sorts with pyarrow.
"""

from __future__ import annotations

from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

UPDATE_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("row", pa.binary()),
        pa.field("ts", pa.int64()),
        pa.field("diff", pa.int64()),
    ]
)
"""The columns of every batch part and of every read result."""

SORT_KEYS = [("key", "ascending"), ("row", "ascending"), ("ts", "ascending")]

TableLike: TypeAlias = pa.Table | pa.RecordBatch


def empty_updates() -> pa.Table:
    """A table with the update schema and no rows."""
    return UPDATE_SCHEMA.empty_table()


def as_table(data: TableLike) -> pa.Table:
    """``data`` as a :class:`pyarrow.Table` with one chunk per column."""
    table = pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data
    return table.combine_chunks()


def sort_updates(data: TableLike) -> pa.Table:
    """``data`` sorted by ``(key, row, ts)`` (a pyarrow sort, stable)."""
    table = as_table(data)
    if table.num_rows <= 1:
        return table
    return table.sort_by(SORT_KEYS)


def advance_ts(data: TableLike, frontier: int) -> pa.Table:
    """``data`` with every ``ts`` below ``frontier`` replaced by ``frontier``."""
    table = as_table(data)
    ts = table.column("ts")
    if table.num_rows == 0 or pc.min(ts).as_py() >= frontier:
        return table
    advanced = pc.max_element_wise(ts, pa.scalar(frontier, pa.int64()))
    return table.set_column(table.schema.get_field_index("ts"), "ts", advanced)


def with_constant_ts(data: TableLike, ts: int) -> pa.Table:
    """``data`` with every ``ts`` set to ``ts`` (used for reads "as of" a time)."""
    table = as_table(data)
    column = pa.array(np.full(table.num_rows, ts, dtype=np.int64))
    return table.set_column(table.schema.get_field_index("ts"), "ts", column)


def run_starts(table: pa.Table) -> np.ndarray:
    """Boolean mask: True where ``(key, row, ts)`` differs from the previous row.

    ``table`` must have a single chunk per column (see :func:`as_table`).
    """
    n = table.num_rows
    starts = np.ones(n, dtype=bool)
    if n <= 1:
        return starts
    changed = np.zeros(n - 1, dtype=bool)
    for name in ("key", "row"):
        column = table.column(name).chunk(0)
        differs = pc.not_equal(column.slice(1), column.slice(0, n - 1))
        changed |= differs.to_numpy(zero_copy_only=False)
    ts = table.column("ts").chunk(0).to_numpy()
    changed |= ts[1:] != ts[:-1]
    starts[1:] = changed
    return starts


def consolidate_sorted(data: TableLike) -> pa.Table:
    """Consolidate updates already sorted by ``(key, row, ts)``; the result stays sorted."""
    table = as_table(data)
    n = table.num_rows
    if n == 0:
        return table
    diff = table.column("diff").chunk(0).to_numpy()
    starts = run_starts(table)
    if starts.all():
        if diff.all():
            return table
        return table.filter(pa.array(diff != 0))
    start_idx = np.flatnonzero(starts)
    sums = np.add.reduceat(diff, start_idx)
    keep = start_idx[sums != 0]
    kept_sums = sums[sums != 0]
    result = table.take(pa.array(keep))
    return result.set_column(
        result.schema.get_field_index("diff"), "diff", pa.array(kept_sums, pa.int64())
    )


def consolidate(data: TableLike) -> pa.Table:
    """Consolidate updates in any order; the result is sorted by ``(key, row, ts)``."""
    return consolidate_sorted(sort_updates(data))


def is_sorted(data: TableLike) -> bool:
    """Whether ``data`` is sorted by ``(key, row, ts)`` (for checks and tests)."""
    table = as_table(data)
    if table.num_rows <= 1:
        return True
    # sort_indices is stable: the input is sorted iff the permutation is the identity.
    indices = pc.sort_indices(table, sort_keys=SORT_KEYS).to_numpy()
    return bool((indices == np.arange(table.num_rows)).all())
