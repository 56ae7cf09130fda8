"""Vectorised consolidation of differential updates ``(key, row, ts, diff)``.

Consolidating a collection of updates sums the diffs of updates that agree on
``(key, row, ts)`` and drops those whose sum is zero. Everything here works on whole
Arrow columns (pyarrow compute and numpy), never row by row in Python.

Invariants this module keeps:

- :func:`consolidate_in_order` takes a table and the permutation that sorts it by
  ``(key, row, ts)`` (or ``None`` when it is sorted) and returns a table sorted by
  ``(key, row, ts)`` that holds each ``(key, row, ts)`` at most once and has no zero
  diff. Past the sort it is O(n): one pass finds runs of equal ``(key, row, ts)``
  (keys and times compared as numbers, rows only where key and time already match),
  ``numpy.add.reduceat`` sums each run, and one ``take`` gathers only the survivors.
- :func:`advance_ts` replaces every ``ts`` below a frontier by the frontier. The map
  ``ts -> max(ts, frontier)`` is monotone, so a table sorted by ``(key, row, ts)`` stays
  sorted after it, and consolidation may follow without a new sort.
- :func:`sort_indices` and :func:`merge_indices` are the only places that sort;
  16-byte keys are sorted as two big-endian uint64 words, which orders them exactly
  like their bytes. ``merge_indices`` is for a concatenation of sorted runs (the
  streaming merge): numpy's stable sort (timsort) merges runs in about O(n log runs),
  and only rows whose high key word ties with a neighbour's are ordered further, by
  pyarrow, on their remaining columns.
"""

from __future__ import annotations

from collections.abc import Callable
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
    """``data`` as a :class:`pyarrow.Table` (columns may have several chunks)."""
    return pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data


def _flat(column: pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """``column`` as one array when it has several chunks: pyarrow's ``take`` from a
    many-chunked binary column costs ~10x a copy into one array and a take from that."""
    return column.combine_chunks() if column.num_chunks > 1 else column


def _array_word_view(keys: pa.Array) -> np.ndarray | None:
    """The 16-byte keys of one array as an ``(n, 2)`` big-endian uint64 view (no copy)."""
    n = len(keys)
    if not pa.types.is_binary(keys.type) or keys.null_count:
        return None
    if n == 0:
        return np.empty((0, 2), ">u8")
    offsets = np.frombuffer(keys.buffers()[1], dtype=np.int32)[keys.offset : keys.offset + n + 1]
    if not (np.diff(offsets) == 16).all():
        return None
    words = np.frombuffer(keys.buffers()[2], dtype=">u8", count=2 * n, offset=int(offsets[0]))
    return words.reshape(n, 2)


def _word_views(keys: pa.Array | pa.ChunkedArray) -> list[np.ndarray] | None:
    chunks = keys.chunks if isinstance(keys, pa.ChunkedArray) else [keys]
    views = [_array_word_view(chunk) for chunk in chunks]
    if any(v is None for v in views):
        return None
    return [v for v in views if v is not None]


def _word(views: list[np.ndarray], which: int) -> np.ndarray:
    """Word ``which`` (0: high, 1: low) of every key, as native uint64, in one pass."""
    out = np.empty(sum(len(v) for v in views), dtype=np.uint64)
    start = 0
    for view in views:
        out[start : start + len(view)] = view[:, which]
        start += len(view)
    return out


def key_words(keys: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray] | None:
    """The 16-byte keys of ``keys`` as two big-endian uint64 words (high, low).

    Comparing ``(high, low)`` numerically orders keys exactly as comparing their bytes,
    and numbers sort and compare several times faster than binary values. Returns
    ``None`` unless every key is exactly 16 bytes (and not null).
    """
    views = _word_views(keys)
    if views is None:
        return None
    return _word(views, 0), _word(views, 1)


def sort_indices(data: TableLike) -> np.ndarray:
    """The (stable) permutation that sorts ``data`` by ``(key, row, ts)``."""
    table = as_table(data)
    words = key_words(table.column("key"))
    if words is None:
        return pc.sort_indices(table, sort_keys=SORT_KEYS).to_numpy()
    numeric = pa.table(
        {"hi": words[0], "lo": words[1], "row": table.column("row"), "ts": table.column("ts")}
    )
    keys = [("hi", "ascending"), ("lo", "ascending"), ("row", "ascending"), ("ts", "ascending")]
    return pc.sort_indices(numeric, sort_keys=keys).to_numpy()


KeyWords = tuple[np.ndarray, np.ndarray]


def _merge_order(
    table: pa.Table, hi: np.ndarray, low: Callable[[], np.ndarray]
) -> tuple[np.ndarray, bool]:
    """The permutation sorting ``table`` (sorted runs, concatenated) by ``(key, row,
    ts)`` given the high key words (``low()`` computes the low ones, asked for only
    when high words tie), and whether every key is distinct (then nothing ties)."""
    n = table.num_rows
    order = np.argsort(hi, kind="stable")
    sorted_hi = hi[order]
    tie = sorted_hi[1:] == sorted_hi[:-1]
    if not tie.any():
        return order, True
    # Runs of equal high words, ordered on (low word, row, ts) inside each run: sort the
    # tied rows by (run number, lo, row, ts), which keeps every run in its own positions.
    tied = np.zeros(n, dtype=bool)
    tied[1:] = tie
    tied[:-1] |= tie
    run = np.cumsum(np.concatenate(([True], ~tie)))
    positions = np.flatnonzero(tied)
    rows = order[positions]
    sub = pa.table(
        {
            "run": run[positions],
            "lo": low()[rows],
            "row": _flat(table.column("row")).take(pa.array(rows)),
            "ts": table.column("ts").to_numpy()[rows],
        }
    )
    keys = [("run", "ascending"), ("lo", "ascending"), ("row", "ascending"), ("ts", "ascending")]
    order[positions] = rows[pc.sort_indices(sub, sort_keys=keys).to_numpy()]
    return order, False


def merge_indices(data: TableLike) -> np.ndarray:
    """The permutation that sorts ``data`` by ``(key, row, ts)``, fast when ``data`` is a
    concatenation of a few runs that are each sorted (any input is sorted correctly)."""
    table = as_table(data)
    views = _word_views(table.column("key"))
    if views is None or table.num_rows <= 1:
        return sort_indices(table)
    return _merge_order(table, _word(views, 0), lambda: _word(views, 1))[0]


def merge_consolidate(data: TableLike) -> pa.Table:
    """Consolidate a concatenation of runs that are each sorted by ``(key, row, ts)``
    (any input is handled correctly); the result is sorted.

    When every key is distinct (common: a key's updates usually share a batch) nothing
    can consolidate but zero diffs, so only the surviving rows are gathered.
    """
    table = as_table(data)
    keep, sums = merge_consolidation(table)
    result = table.take(pa.array(keep))
    if sums is None:
        return result
    return result.set_column(
        result.schema.get_field_index("diff"), "diff", pa.array(sums, pa.int64())
    )


def merge_consolidation(data: TableLike) -> tuple[np.ndarray, np.ndarray | None]:
    """What :func:`merge_consolidate` keeps, without gathering anything: the indices of
    the surviving rows, in ``(key, row, ts)`` order, and their summed diffs (None when
    every diff is the row's own). For callers that gather other columns themselves."""
    table = as_table(data)
    views = _word_views(table.column("key"))
    if views is None or table.num_rows <= 1:
        return consolidation(table, sort_indices(table) if table.num_rows > 1 else None)
    hi = _word(views, 0)
    lows: list[np.ndarray] = []

    def low() -> np.ndarray:
        if not lows:
            lows.append(_word(views, 1))
        return lows[0]

    order, distinct = _merge_order(table, hi, low)
    if not distinct:
        return consolidation(table, order, words=(hi, low()))
    nonzero = table.column("diff").to_numpy()[order] != 0
    return (order if nonzero.all() else order[nonzero]), None


def sort_updates(data: TableLike) -> pa.Table:
    """``data`` sorted by ``(key, row, ts)`` (a pyarrow sort, stable)."""
    table = as_table(data)
    if table.num_rows <= 1:
        return table
    indices = sort_indices(table)
    if (indices[1:] > indices[:-1]).all():
        return table
    return table.take(pa.array(indices))


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


def _run_starts(
    table: pa.Table, order: np.ndarray | None, words: KeyWords | None = None
) -> np.ndarray:
    """True where ``(key, row, ts)`` differs from the previous row in ``order``.

    Keys and times are compared as numbers; rows (binary) only where key and time are
    equal to the previous row's, which is where a run can continue.
    """
    n = table.num_rows
    starts = np.ones(n, dtype=bool)
    if n <= 1:
        return starts
    ts = table.column("ts").to_numpy()
    ts = ts if order is None else ts[order]
    changed = ts[1:] != ts[:-1]
    words = words or key_words(table.column("key"))
    if words is None:
        column = table.column("key")
        ordered = column if order is None else column.take(pa.array(order))
        changed |= pc.not_equal(ordered.slice(1), ordered.slice(0, n - 1)).to_numpy(
            zero_copy_only=False
        )
    else:
        for word in words:
            word = word if order is None else word[order]
            changed |= word[1:] != word[:-1]
    # Rows: compare only the candidates (same key and ts as the previous row).
    candidates = np.flatnonzero(~changed) + 1
    if len(candidates):
        rows = _flat(table.column("row"))
        current = candidates if order is None else order[candidates]
        previous = candidates - 1 if order is None else order[candidates - 1]
        differs = pc.not_equal(rows.take(pa.array(current)), rows.take(pa.array(previous)))
        changed[candidates - 1] = differs.to_numpy(zero_copy_only=False)
    starts[1:] = changed
    return starts


def consolidate_in_order(
    data: TableLike, order: np.ndarray | None, *, words: KeyWords | None = None
) -> pa.Table:
    """Consolidate ``data`` read in ``order`` (a permutation sorting it by
    ``(key, row, ts)``; ``None``: it is sorted already). The result is sorted.

    Only the surviving rows are gathered (one ``take``), never the whole input.
    ``words`` may pass ``key_words`` of the keys when the caller has them already.
    """
    table = as_table(data)
    if table.num_rows == 0:
        return table
    keep, sums = consolidation(table, order, words=words)
    if sums is None and order is None and len(keep) == table.num_rows:
        return table
    result = table.take(pa.array(keep))
    if sums is None:
        return result
    return result.set_column(
        result.schema.get_field_index("diff"), "diff", pa.array(sums, pa.int64())
    )


def consolidation(
    data: TableLike, order: np.ndarray | None, *, words: KeyWords | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """What :func:`consolidate_in_order` keeps: the surviving rows' indices (in sorted
    order) and their summed diffs (None when every survivor keeps its own diff)."""
    table = as_table(data)
    n = table.num_rows
    if n == 0:
        return np.zeros(0, dtype=np.int64), None
    diff = table.column("diff").to_numpy()
    diff = diff if order is None else diff[order]
    starts = _run_starts(table, order, words)
    if starts.all():
        keep_pos = np.flatnonzero(diff != 0)
        return (keep_pos if order is None else order[keep_pos]), None
    start_idx = np.flatnonzero(starts)
    all_sums = np.add.reduceat(diff, start_idx)
    nonzero = all_sums != 0
    keep_pos, sums = start_idx[nonzero], all_sums[nonzero]
    return (keep_pos if order is None else order[keep_pos]), sums


def consolidate_sorted(data: TableLike) -> pa.Table:
    """Consolidate updates already sorted by ``(key, row, ts)``; the result stays sorted."""
    return consolidate_in_order(data, None)


def consolidate(data: TableLike) -> pa.Table:
    """Consolidate updates in any order; the result is sorted by ``(key, row, ts)``."""
    table = as_table(data)
    if table.num_rows <= 1:
        return consolidate_in_order(table, None)
    return consolidate_in_order(table, sort_indices(table))


def is_sorted(data: TableLike) -> bool:
    """Whether ``data`` is sorted by ``(key, row, ts)`` (for checks and tests)."""
    table = as_table(data)
    if table.num_rows <= 1:
        return True
    # The sort is stable: the input is sorted iff the permutation is the identity.
    return bool((sort_indices(table) == np.arange(table.num_rows)).all())
