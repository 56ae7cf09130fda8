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

import numpy as np
import numpy.typing as npt

from upsert_core.drain.output import Decision, DrainOutput
from upsert_core.drain.stash import StagedColumns, Stash
from upsert_core.drain.styles import DrainStyle
from upsert_core.state import PutValue, StateValue, UpsertState


def winners(block: StagedColumns) -> StagedColumns:
    """Per ``(ts, key)``, the update with the greatest ``(order, position)``, sorted."""
    n = len(block)
    if n <= 1:
        return block
    # lexsort's LAST key is the primary one.
    perm = np.lexsort((block.positions, block.orders, block.key_lo, block.key_hi, block.ts))
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
    if not len(taken):
        return min_remaining
    win = winners(taken)
    ts_list: list[int] = win.ts.tolist()
    key_list: list[bytes] = win.keys.tolist()
    value_list: list[bytes | None] = win.values.tolist()
    order_list: list[int] = win.orders.tolist()
    pos_list: list[int] = win.positions.tolist()

    unique_keys = list(dict.fromkeys(key_list))
    got = state.multi_get(unique_keys)
    cells: dict[bytes, StateValue | None] = {
        k: g.value for k, g in zip(unique_keys, got, strict=True)
    }
    if not state.snapshot_completed:
        for cell in cells.values():
            if cell is not None:
                cell.ensure_decoded()

    provisional = style.writes_provisional
    touched: set[bytes] = set()
    emit = out.updates.append
    decide = out.decisions.append
    rows = zip(ts_list, key_list, value_list, order_list, pos_list, strict=True)
    for ts, key, value, ov, pos in rows:
        order = (ov, pos)
        cell = cells[key]
        if cell is None:
            old = None
        else:
            seen = cell.provisional_order(ts)
            if seen is not None and seen >= order:
                # Something at least as new already defines the key at ts.
                continue
            old = cell.provisional_value_ref(ts)
        decide(Decision(ts, key, value, order))
        if value is None:
            if old is not None:
                emit((key, old, ts, -1))
        elif old is None:
            emit((key, value, ts, 1))
        elif old != value:
            emit((key, old, ts, -1))
            emit((key, value, ts, 1))
        if provisional:
            if value is None:
                new = (
                    StateValue.new_provisional_tombstone(ts, order)
                    if cell is None
                    else cell.into_provisional_tombstone(ts, order)
                )
            else:
                new = (
                    StateValue.new_provisional_value(value, ts, order)
                    if cell is None
                    else cell.into_provisional_value(value, ts, order)
                )
            cells[key] = new
            touched.add(key)

    if touched:
        meta = {k: g.metadata for k, g in zip(unique_keys, got, strict=True)}
        counted = out.counted_metadata
        for k in touched:
            if k not in counted:
                counted[k] = meta[k]
        # Provisional values are overwritten by feedback once ts is committed, so they
        # must not count as indexed records (see feedback for how stats stay exact).
        state.multi_put(
            ((k, PutValue(cells[k], meta[k])) for k in touched),
            update_per_record_stats=False,
        )
    return min_remaining
