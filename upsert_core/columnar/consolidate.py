"""Building and advancing a :class:`ColumnarState` from the shard's own updates.

- :func:`state_from_snapshot` (rehydration): the bucket's rows of a snapshot,
  ``(key, row, diff)``, become a state. The snapshot must be consolidated *as an upsert
  collection*: after summing the diffs of equal ``(key, row)`` pairs, every key holds
  exactly one row with multiplicity +1, or nothing. Anything else (two live rows for a
  key, a negative or doubled multiplicity) raises :class:`InvalidUpsertState`: garbage
  is never turned into state. Keys that occur once (nearly all of them) are checked as
  whole columns; the rare keys with several updates are summed one by one.
- :func:`apply_changes` (replay, batch scope): the shard's consolidated changes in
  ``[lower, upper)`` for the bucket's keys, ``(key, row, ts, diff)``, are applied to
  the state as of ``lower``. Per key the changes must form a valid chain in time order:
  at each timestamp a retraction of exactly the row the key holds, then at most one
  insertion into an absent key. A change that does not fit (a retraction of a row the
  state does not hold, an insertion over a live key, a diff other than +-1) raises
  :class:`InvalidUpsertState` and the caller rehydrates instead.

Both run on whole columns: sorts, ``searchsorted`` and Arrow comparisons.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from upsert_core.columnar.merge import lookup, with_changes
from upsert_core.columnar.state import (
    I64,
    ROW_TYPE,
    ColumnarState,
    Mask,
    split_keys,
)
from upsert_core.errors import InvalidUpsertState

OrderReader = Callable[[pa.Array], I64]
"""Reads the order value of each of a batch of encoded rows (global scope)."""


def _concat(batches: Iterable[pa.RecordBatch | pa.Table], names: list[str]) -> list[pa.Array]:
    tables = [b if isinstance(b, pa.Table) else pa.Table.from_batches([b]) for b in batches]
    tables = [t.select(names) for t in tables if t.num_rows]
    if not tables:
        return [pa.array([], pa.binary()) for _ in names[:2]] + [
            pa.array([], pa.int64()) for _ in names[2:]
        ]
    table = pa.concat_tables(tables, promote_options="permissive")
    return [table.column(n).combine_chunks() for n in names]


def _bools(array: pa.Array) -> Mask:
    return np.asarray(pc.fill_null(array, False).to_numpy(zero_copy_only=False), bool)


def state_from_snapshot(
    batches: Iterable[pa.RecordBatch | pa.Table], order_values: OrderReader | None = None
) -> ColumnarState:
    """The state a consolidated snapshot describes (see the module docstring).

    ``order_values`` (global scope) reads each live row's order value back from the row.
    """
    keys, rows, diffs_arr = _concat(batches, ["key", "row", "diff"])
    diffs = np.asarray(diffs_arr.to_numpy(zero_copy_only=False), np.int64)
    hi, lo = split_keys(keys)
    perm = np.lexsort((lo, hi))
    hi, lo, diffs = hi[perm], lo[perm], diffs[perm]
    rows = rows.take(pa.array(perm, pa.int64())).cast(ROW_TYPE)
    n = len(hi)
    starts = np.ones(n, dtype=bool)
    if n:
        starts[1:] = (hi[1:] != hi[:-1]) | (lo[1:] != lo[:-1])
    group = np.cumsum(starts) - 1
    sizes = np.bincount(group, minlength=int(group[-1]) + 1 if n else 0)
    single = sizes[group] == 1
    keep = single & (diffs == 1)
    bad_single = single & (diffs != 1) & (diffs != 0)
    if bad_single.any():
        j = int(np.flatnonzero(bad_single)[0])
        raise InvalidUpsertState(
            f"snapshot holds key {_hex(hi[j], lo[j])} with multiplicity {int(diffs[j])}"
        )
    multi = np.flatnonzero(~single)
    if len(multi):
        keep |= _resolve_multi(multi, group, hi, lo, rows, diffs)
    idx = np.flatnonzero(keep)
    live_rows = rows.take(pa.array(idx, pa.int64()))
    orders = None if order_values is None else order_values(live_rows)
    return ColumnarState.checked(hi[idx], lo[idx], live_rows, orders)


def _resolve_multi(
    multi: np.ndarray, group: np.ndarray, hi: np.ndarray, lo: np.ndarray, rows: pa.Array,
    diffs: np.ndarray,
) -> Mask:
    """For keys with several snapshot updates: which index holds the key's live row."""
    keep = np.zeros(len(hi), dtype=bool)
    by_group: dict[int, dict[bytes, list[int]]] = defaultdict(dict)
    row_list = rows.take(pa.array(multi, pa.int64())).to_pylist()
    for i, row in zip(multi.tolist(), row_list, strict=True):
        entry = by_group[int(group[i])].setdefault(row, [0, i])
        entry[0] += int(diffs[i])
    for entries in by_group.values():
        live = [(s, i) for s, i in entries.values() if s != 0]
        if not live:
            continue
        if len(live) != 1 or live[0][0] != 1:
            i = live[0][1]
            raise InvalidUpsertState(
                f"snapshot holds key {_hex(hi[i], lo[i])} with rows of multiplicities "
                f"{sorted(s for s, _ in live)} (an upsert key has one row at +1 or none)"
            )
        keep[live[0][1]] = True
    return keep


def apply_changes(
    state: ColumnarState, batches: Iterable[pa.RecordBatch | pa.Table]
) -> tuple[ColumnarState, int]:
    """``state`` with the changes applied (batch scope; see the module docstring) and the
    number of updates applied."""
    if state.orders is not None:
        raise InvalidUpsertState("changes can only be replayed onto a batch-scope state")
    keys, rows, ts_arr, diff_arr = _concat(batches, ["key", "row", "ts", "diff"])
    n = len(keys)
    if n == 0:
        return state, 0
    ts = np.asarray(ts_arr.to_numpy(zero_copy_only=False), np.int64)
    diffs = np.asarray(diff_arr.to_numpy(zero_copy_only=False), np.int64)
    if np.any((diffs != 1) & (diffs != -1)):
        raise InvalidUpsertState("a replayed change has a multiplicity other than +1 or -1")
    hi, lo = split_keys(keys)
    perm = _time_order_per_key(hi, lo, ts, diffs)
    hi, lo, ts, diffs = hi[perm], lo[perm], ts[perm], diffs[perm]
    rows = rows.take(pa.array(perm, pa.int64())).cast(ROW_TYPE)
    first = np.ones(n, dtype=bool)
    first[1:] = (hi[1:] != hi[:-1]) | (lo[1:] != lo[:-1])
    last = np.ones(n, dtype=bool)
    last[:-1] = first[1:]
    look = lookup(state, hi, lo)
    found, held = look.found, look.rows
    # What each change finds: the previous change of its key, or the state's row.
    prev = np.concatenate([[0], np.arange(n - 1)])
    prev_plus = ~first & (diffs[prev] == 1)
    expected = pc.if_else(pa.array(first), held, rows.take(pa.array(prev, pa.int64())))
    holds = np.where(first, found, prev_plus)
    retract = diffs == -1
    fits_retract = holds & _bools(pc.equal(expected, rows))
    bad = (retract & ~fits_retract) | (~retract & holds)
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        what = "retracts a row the state does not hold" if retract[j] else (
            "inserts over a live row"
        )
        raise InvalidUpsertState(
            f"replayed change at ts {int(ts[j])} for key {_hex(hi[j], lo[j])} {what}"
        )
    # Per key the last change decides: an insertion sets the row, a retraction removes it.
    keys_at = np.flatnonzero(last)
    write = diffs[keys_at] == 1
    return (
        with_changes(
            state, look.select(keys_at), hi[keys_at], lo[keys_at],
            rows.take(pa.array(keys_at, pa.int64())), None, write, ~write,
        ),
        n,
    )


def _time_order_per_key(hi: np.ndarray, lo: np.ndarray, ts: np.ndarray, diffs: np.ndarray
                        ) -> np.ndarray:
    """The permutation sorting changes by key, then time, retraction before insertion.

    Two stable sorts instead of one four-column ``lexsort``: first by ``(ts, diff)``
    (changes arrive nearly in time order, which a stable sort handles fast), then by
    ``hi``. That is the full order unless two distinct keys share ``hi`` (digests nearly
    never do), which is checked, and then the ``lexsort`` runs.
    """
    by_time = np.argsort(ts * 2 + (diffs > 0), kind="stable")
    perm = by_time[np.argsort(hi[by_time], kind="stable")]
    s_hi, s_lo = hi[perm], lo[perm]
    if np.any((s_hi[1:] == s_hi[:-1]) & (s_lo[1:] != s_lo[:-1])):
        return np.lexsort((diffs, ts, lo, hi))
    return perm


def _hex(hi: np.uint64 | int, lo: np.uint64 | int) -> str:
    return f"{int(hi):016x}{int(lo):016x}"
