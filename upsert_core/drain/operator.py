"""Draining staged source updates against the upsert state into differential output.

For the eligible updates of a drain style (see :mod:`upsert_core.drain.styles`):

1. Sort them by ``(ts, key, order value, position)`` with one numpy ``lexsort`` and keep
   the last update of each ``(ts, key)`` group: the greatest order wins, and on equal
   order values the greater position (the later row of the file).
2. Read every touched key once (``multi_get``).
3. For each winner, in ``(ts, key)`` order: skip it if the state's order as seen at
   ``ts`` (``provisional_order(ts)``) is already at least the winner's order; otherwise
   retract the value seen at ``ts`` (``provisional_value_ref(ts)``) and insert the new
   one (a delete only retracts). A key set to an identical value emits nothing.
4. ``AtTime`` only: write the winners back as provisional values/tombstones
   (``multi_put(update_per_record_stats=False)``) so later drains of the same ``ts``
   retract what this one emitted. ``ToUpper`` never writes the state: the state learns
   final values from the committed output (:mod:`upsert_core.drain.feedback`).

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

from operator import itemgetter

import numpy as np
import numpy.typing as npt

from upsert_core.state.gc_pause import gc_paused
from upsert_core.drain.output import DrainOutput
from upsert_core.drain.stash import StagedColumns, Stash
from upsert_core.drain.styles import DrainStyle
from upsert_core.state import PutValue, StateValue, UpsertState

_first = itemgetter(0)  # ValueAndSize.value, without the attribute lookup


def winners(block: StagedColumns) -> StagedColumns:
    """Per ``(ts, key)``, the update with the greatest ``(order, position)``, sorted."""
    n = len(block)
    if n <= 1:
        return block
    # lexsort's LAST key is the primary one; a single timestamp need not be sorted on.
    sort_keys = [block.positions, block.orders, block.key_lo, block.key_hi]
    if block.ts.min() != block.ts.max():
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
