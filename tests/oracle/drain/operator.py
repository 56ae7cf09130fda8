"""Draining staged source updates against the upsert state into differential output.

For the eligible updates of a drain style (see :mod:`tests.oracle.drain.styles`):

1. Keep, per ``(ts, key)``, the update with the greatest ``(order value, position)``
   (the greatest order wins, on equal order values the later row of the file): one
   stable numpy sort on the keys' first 8 bytes and per-group maxima for a single
   timestamp, a ``lexsort`` on every column otherwise.
2. Read every touched key once (``multi_get``).
3. For each winner, in ``(ts, key)`` order: skip it if the state's order as seen at
   ``ts`` (``provisional_order(ts)``) is already at least the winner's order; otherwise
   retract the value seen at ``ts`` (``provisional_value_ref(ts)``) and insert the new
   one (a delete only retracts). A key set to an identical value emits nothing.
   A ``ToUpper`` drain of one timestamp (the ingest's) does this in one tight loop;
   every other drain takes the general per-winner path.
4. ``AtTime`` only: write the winners back as provisional values/tombstones
   (``multi_put(update_per_record_stats=False)``) so later drains of the same ``ts``
   retract what this one emitted. ``ToUpper`` never writes the state: the state learns
   final values from the committed output (:mod:`tests.oracle.drain.feedback`).

Invariants:

- Each ``(ts, key)`` yields at most one retraction and one insertion per drain, so a
  drain's output is consolidated; every command applied is recorded as a decision.
- Draining is independent of the order scope: the scope only changes which orders the
  finalized state remembers (feedback), and hence what the skip rule skips.
- Each ``(ts, key)`` is computed against the state as read at the start of the drain
  (plus this drain's own provisional write at that same ``ts``); the caller keeps the
  state at ``persist_upper`` by applying feedback before draining the next time.
"""

from __future__ import annotations

from itertools import count
from operator import itemgetter

import numpy as np
import numpy.typing as npt

from tests.oracle.drain.output import DrainOutput
from tests.oracle.drain.stash import StagedColumns, Stash
from tests.oracle.drain.styles import DrainStyle
from tests.oracle.state import PutValue, StateValue, UpsertState
from tests.oracle.state.gc_pause import gc_paused

_first = itemgetter(0)  # ValueAndSize.value, without the attribute lookup


def winners(block: StagedColumns) -> StagedColumns:
    """Per ``(ts, key)``, the update with the greatest ``(order, position)``, sorted.

    Equal ``(order, position)`` pairs (only possible across staging calls) are won by
    the one staged last.
    """
    n = len(block)
    if n <= 1:
        return block
    several_ts = bool(block.ts.min() != block.ts.max())
    if not several_ts:
        perm = _single_ts_winners(block)
        if perm is not None:
            return block.select(perm)
    # lexsort's LAST key is the primary one; a single timestamp need not be sorted on.
    sort_keys = [block.positions, block.orders, block.key_lo, block.key_hi]
    if several_ts:
        sort_keys.append(block.ts)
    perm = np.lexsort(sort_keys)
    ts = block.ts[perm]
    hi = block.key_hi[perm]
    lo = block.key_lo[perm]
    last: npt.NDArray[np.bool_] = np.empty(n, dtype=bool)
    last[-1] = True
    np.not_equal(ts[1:], ts[:-1], out=last[:-1])
    last[:-1] |= hi[1:] != hi[:-1]
    last[:-1] |= lo[1:] != lo[:-1]
    return block.select(perm[last])


def _single_ts_winners(block: StagedColumns) -> npt.NDArray[np.intp] | None:
    """The winners' indices in key order, for one timestamp; None if two distinct keys
    share their first 8 bytes (then the caller sorts on every column).

    Why not one lexsort on (key_hi, key_lo, order, position): sorting one column and
    picking each group's maximum with ``reduceat`` takes about half the time, and keys
    are digests whose first 8 bytes nearly always differ.
    """
    hi = block.key_hi
    perm = np.argsort(hi, kind="stable")  # stable: exact ties go to the one staged last
    shi = hi[perm]
    slo = block.key_lo[perm]
    same_hi = shi[1:] == shi[:-1]
    if np.any(same_hi & (slo[1:] != slo[:-1])):
        return None
    n = len(perm)
    starts = np.flatnonzero(np.concatenate(([True], ~same_hi)))
    group = np.repeat(np.arange(len(starts)), np.diff(starts, append=n))
    orders = block.orders[perm]
    positions = block.positions[perm]
    best = orders == np.maximum.reduceat(orders, starts)[group]
    masked = np.where(best, positions, np.iinfo(np.int64).min)
    best &= positions == np.maximum.reduceat(masked, starts)[group]
    index = np.where(best, np.arange(n), -1)
    out: npt.NDArray[np.intp] = perm[np.maximum.reduceat(index, starts)]
    return out


def drain_staged_input(
    stash: Stash,
    state: UpsertState,
    style: DrainStyle,
    out: DrainOutput,
) -> int | None:
    """Drain the eligible part of ``stash`` into ``out``; return the least remaining ts.

    Returns None when nothing is left in the stash.
    """
    taken, min_remaining = stash.take(style.eligible)
    if len(taken):
        with gc_paused():
            _drain(taken, state, style, out)
    return min_remaining


def _drain(taken: StagedColumns, state: UpsertState, style: DrainStyle, out: DrainOutput) -> None:
    win = winners(taken)
    if not style.writes_provisional and win.ts[0] == win.ts[-1]:
        _drain_final_single_ts(win, state, out)
    else:
        _drain_general(win, state, style, out)


def _drain_final_single_ts(win: StagedColumns, state: UpsertState, out: DrainOutput) -> None:
    """The common drain (ToUpper, one timestamp): no state writes and each key once.

    SUBTLE (performance): one loop that touches each state cell once beats several
    column passes here. The cells are scattered over a large heap, so every extra pass
    over them costs a cache miss per key, more than the loop's interpretive overhead.
    """
    ts = int(win.ts[0])
    keys: list[bytes] = win.keys.tolist()
    values: list[bytes | None] = win.values.tolist()
    got = state.multi_get(keys)
    orders: list[int] | None = None
    positions: list[int] = []
    skipped: list[int] = []
    emit = out.updates.append
    for i, key, new, (cell, _meta) in zip(count(), keys, values, got):
        if cell is None:
            if new is not None:
                emit((key, new, ts, 1))
            continue
        old, held = cell.view_at(ts)
        if held is not None:
            if orders is None:
                orders, positions = win.orders.tolist(), win.positions.tolist()
            if held >= (orders[i], positions[i]):
                skipped.append(i)  # the state already holds something at least as new
                continue
        if old != new:
            if old is not None:
                emit((key, old, ts, -1))
            if new is not None:
                emit((key, new, ts, 1))
    applied = np.ones(len(keys), dtype=bool)
    applied[skipped] = False
    out.add_decisions(win, applied)


def _drain_general(
    win: StagedColumns, state: UpsertState, style: DrainStyle, out: DrainOutput
) -> None:
    ts_list: list[int] = win.ts.tolist()
    key_list: list[bytes] = win.keys.tolist()
    value_list: list[bytes | None] = win.values.tolist()
    order_list: list[int] = win.orders.tolist()
    pos_list: list[int] = win.positions.tolist()

    # Winners are sorted by (ts, key): with a single ts every key appears once.
    single_ts = ts_list[0] == ts_list[-1]
    unique_keys = key_list if single_ts else list(dict.fromkeys(key_list))
    got = state.multi_get(unique_keys)
    cell_list: list[StateValue | None] = list(map(_first, got))
    # With several timestamps a key may have several winners: look cells up by key so a
    # provisional write at one ts is seen by the next (``cell_list`` is then unused).
    cells = None if single_ts else dict(zip(unique_keys, cell_list, strict=True))
    if cells is not None:
        cell_list = [None] * len(key_list)

    provisional = style.writes_provisional
    skipped: list[int] = []
    emit = out.updates.append
    rows = zip(range(len(ts_list)), ts_list, key_list, value_list, cell_list, strict=True)
    for i, ts, key, value, cell in rows:
        if cells is not None:
            cell = cells[key]
        if cell is None:
            old = None
        else:
            # A snapshot completed by a chunk that did not touch this key left its
            # accumulator undecoded; decode it now (a no-op on decoded values).
            cell.ensure_decoded()
            seen = cell.provisional_order(ts)
            if seen is not None and seen >= (order_list[i], pos_list[i]):
                # Something at least as new already defines the key at ts.
                skipped.append(i)
                continue
            old = cell.provisional_value_ref(ts)
        if value is None:
            if old is not None:
                emit((key, old, ts, -1))
        elif old is None:
            emit((key, value, ts, 1))
        elif old != value:
            emit((key, old, ts, -1))
            emit((key, value, ts, 1))
        if provisional:
            new = _provisional(cell, value, ts, (order_list[i], pos_list[i]))
            if cells is not None:
                cells[key] = new
            else:
                cell_list[i] = new

    applied = np.ones(len(key_list), dtype=bool)
    applied[skipped] = False
    out.add_decisions(win, applied)
    touched: dict[bytes, StateValue | None] = {}
    if provisional:
        source = cells if cells is not None else dict(zip(key_list, cell_list, strict=True))
        touched = {key_list[i]: source[key_list[i]] for i in np.flatnonzero(applied).tolist()}

    if touched:
        meta = {k: g.metadata for k, g in zip(unique_keys, got, strict=True)}
        counted = out.counted_metadata
        for k in touched:
            if k not in counted:
                counted[k] = meta[k]
        # Provisional values are overwritten by feedback once ts is committed, so they
        # must not count as indexed records (see feedback for how stats stay exact).
        state.multi_put(
            ((k, PutValue(v, meta[k])) for k, v in touched.items()),
            update_per_record_stats=False,
        )


def _provisional(
    cell: StateValue | None, value: bytes | None, ts: int, order: tuple[int, int]
) -> StateValue:
    """``cell`` with a provisional value (or tombstone, for None) at ``ts``."""
    if value is None:
        if cell is None:
            return StateValue.new_provisional_tombstone(ts, order)
        return cell.into_provisional_tombstone(ts, order)
    if cell is None:
        return StateValue.new_provisional_value(value, ts, order)
    return cell.into_provisional_value(value, ts, order)
