"""The ingest's drain on a :class:`ColumnarState`: one timestamp, ``ToUpper``, vectorised.

For the validated rows of one bucket at timestamp ``ts`` (``key``, ``row``,
``deleted``, ``order``, ``position``), :func:`drain_to_upper` does what
``drain.drain_staged_input`` with ``ToUpper(ts + 1, ts)`` followed by
``drain.apply_feedback`` does on an ``UpsertState``, as whole-column operations:

1. Winners: per key, the row with the greatest ``(order, position)`` (one
   ``lexsort``); the winners come out sorted by key.
2. Match: ``merge.lookup`` (``searchsorted`` in each level) finds each winner in the
   state.
3. Skip rule: in the global scope a winner is skipped when the state's order for its
   key (tombstones included) is at least the winner's order; finalized orders carry the
   maximal position, so positions only break ties within a file. The batch scope
   remembers no order and never skips. The rows (every row, not only winners) whose
   order is not past their key's stored order are the batch's *late* rows
   (``columnar.late``), reported in ``DrainResult.late``.

Orders are int64 (one order column) or order keys (several: ``upsert_core.order_keys``,
bytes whose byte order is the tuple's order); both compare with the same numpy
operators, so steps 1 and 3 are the same for either. The rows' orders and the state's
are of one kind: an empty state takes the rows' kind, a non-empty state of the other
kind is refused (:class:`InvalidUpsertState`), never compared.
4. Output: an applied winner retracts the key's current row and inserts its own (a
   delete only retracts); an identical row emits nothing (Arrow compares the bytes).
   The updates come out sorted by ``(key, row)``, as batch parts store them.
5. Feedback: the winners' decisions are written into the new state's overlay (batch
   scope: a delete removes the key; global scope: the key keeps a tombstone and the
   order), so the cost follows the batch (``merge.with_changes``).

Invariants:

- Each key yields at most one retraction and one insertion: the output is consolidated.
- The result equals, update for update and key for key, what the per-key engine
  produces for the same state and rows (``tests/core/test_columnar_*`` check this against the dict
  model and the per-key engine).
- The input state is not modified; the caller commits the output before it uses the
  returned state (it only leaves the step as a checkpoint or a cache entry).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from upsert_core.columnar.late import late_rows
from upsert_core.columnar.merge import lookup, with_changes
from upsert_core.columnar.state import (
    ROW_TYPE,
    ColumnarState,
    Index,
    join_keys,
    split_keys,
)
from upsert_core.errors import InvalidUpsertState
from upsert_core.order_keys import from_arrow, is_order_keys
from upsert_core.persist.write.consolidate import UPDATE_SCHEMA


@dataclass(frozen=True)
class DrainResult:
    """A drain's output updates (``UPDATE_SCHEMA``, sorted by key and row), the state
    after feedback, and what was decided."""

    updates: pa.Table
    state: ColumnarState
    winners: int
    applied: int
    inserts: int
    retractions: int
    sources: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Per update: the index in the drained rows of the row an insertion inserts, -1
    for a retraction (so its values can be taken from the file's, not decoded)."""
    late: np.ndarray = field(default_factory=lambda: np.zeros(0, np.intp))
    """Global scope: the indices in the drained rows of the late rows, ascending
    (``columnar.late``); empty in the batch scope."""
    late_stored: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """The stored order (before the batch) of each late row's key."""


def _column(table: pa.Table, name: str) -> pa.Array:
    col = table.column(name)
    return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)


def drain_to_upper(state: ColumnarState, rows: pa.Table, ts: int) -> DrainResult:
    """Drain ``rows`` (one bucket's validated rows of one file) at ``ts``; see the module
    docstring."""
    if rows.num_rows == 0:
        return DrainResult(UPDATE_SCHEMA.empty_table(), state, 0, 0, 0, 0)
    hi, lo = split_keys(_column(rows, "key"))
    orders = from_arrow(_column(rows, "order"))
    state = _of_kind(state, orders)
    positions = np.asarray(_column(rows, "position").to_numpy(zero_copy_only=False), np.int64)
    win = winners(hi, lo, orders, positions)
    w_hi, w_lo, w_orders = hi[win], lo[win], orders[win]
    deleted = np.asarray(_column(rows, "deleted").to_numpy(zero_copy_only=False), bool)[win]
    new = _column(rows, "row").take(pa.array(win, pa.int64())).cast(ROW_TYPE)
    if deleted.any():
        new = pc.if_else(pa.array(deleted), pa.nulls(len(new), ROW_TYPE), new)

    look = lookup(state, w_hi, w_lo)
    found, old = look.found, look.rows
    late, late_stored = np.zeros(0, np.intp), np.zeros(0, np.int64)
    if look.orders is not None and found.any():
        applied = ~(found & (look.orders >= w_orders))
        late, late_stored = late_rows(hi, lo, orders, w_hi, w_lo, found, look.orders)
    else:
        applied = np.ones(len(win), dtype=bool)
    has_old = found & ~np.asarray(old.is_null().to_numpy(zero_copy_only=False), bool)
    has_new = ~deleted
    both = has_old & has_new
    same = np.zeros(len(win), dtype=bool)
    if both.any():
        same = np.asarray(pc.fill_null(pc.equal(old, new), False).to_numpy(zero_copy_only=False),
                          bool) & both
    retract = applied & has_old & ~same
    insert = applied & has_new & ~same
    updates, source, diff = _updates(w_hi, w_lo, old, new, retract, insert, both, ts)
    sources = np.where(diff > 0, win[source], -1).astype(np.int64)

    if state.orders is None:
        # Batch scope: no order is remembered, a delete removes the key.
        write = applied & has_new & ~same
        remove = applied & ~has_new
        next_state = with_changes(state, look, w_hi, w_lo, new, None, write, remove)
    else:
        # Global scope: every applied decision stores its order, a delete a tombstone.
        none = np.zeros(len(win), dtype=bool)
        next_state = with_changes(state, look, w_hi, w_lo, new, w_orders, applied, none)
    return DrainResult(
        updates, next_state, len(win), int(applied.sum()), int(insert.sum()),
        int(retract.sum()), sources, late, late_stored,
    )


def _of_kind(state: ColumnarState, orders: np.ndarray) -> ColumnarState:
    """``state``, or an empty state whose orders are of ``orders``' kind."""
    if state.orders is None or is_order_keys(state.orders) == is_order_keys(orders):
        return state
    if state.is_empty():
        return ColumnarState.empty(keeps_orders=True, order_keys=is_order_keys(orders))
    raise InvalidUpsertState(
        "the upsert state holds "
        + ("order keys" if state.has_order_keys else "int64 orders")
        + " but the rows' orders are "
        + ("order keys" if is_order_keys(orders) else "int64")
        + ": the shard's order changed kind; rebuild the bucket's state"
    )


def winners(hi: np.ndarray, lo: np.ndarray, orders: np.ndarray, positions: np.ndarray) -> Index:
    """Indices of the rows with the greatest ``(order, position)`` per key, in key order.

    Why not always one ``lexsort`` on all four columns: a stable ``argsort`` of ``hi``
    alone takes a fraction of the time, and digests nearly never share their first 8
    bytes, so equal ``hi`` values almost always mean the same key (checked: if two
    distinct keys share them, the full sort runs).
    """
    perm = np.argsort(hi, kind="stable")
    s_hi, s_lo = hi[perm], lo[perm]
    same = s_hi[1:] == s_hi[:-1]
    if not same.any():
        return perm
    if is_order_keys(orders) or np.any(same & (s_lo[1:] != s_lo[:-1])):
        # Order keys have no ``maximum.reduceat``: they always take the full sort.
        perm = np.lexsort((positions, orders, lo, hi))
        s_hi, s_lo = hi[perm], lo[perm]
        last = np.ones(len(perm), dtype=bool)
        last[:-1] = (s_hi[1:] != s_hi[:-1]) | (s_lo[1:] != s_lo[:-1])
        return perm[last]
    # Duplicate keys: within each run of one key, the greatest (order, position).
    n = len(perm)
    starts = np.flatnonzero(np.concatenate(([True], ~same)))
    group = np.repeat(np.arange(len(starts)), np.diff(starts, append=n))
    s_orders, s_positions = orders[perm], positions[perm]
    best = s_orders == np.maximum.reduceat(s_orders, starts)[group]
    masked = np.where(best, s_positions, np.iinfo(np.int64).min)
    best &= s_positions == np.maximum.reduceat(masked, starts)[group]
    index = np.where(best, np.arange(n), -1)
    out: Index = perm[np.maximum.reduceat(index, starts)]
    return out


def _updates(
    hi: np.ndarray,
    lo: np.ndarray,
    old: pa.Array,
    new: pa.Array,
    retract: np.ndarray,
    insert: np.ndarray,
    both: np.ndarray,
    ts: int,
) -> tuple[pa.Table, Index, np.ndarray]:
    """Retractions of ``old`` and insertions of ``new``, sorted by ``(key, row)``, with
    the winner each update comes from and its diff."""
    r = np.flatnonzero(retract)
    i = np.flatnonzero(insert)
    if len(r) + len(i) == 0:
        return UPDATE_SCHEMA.empty_table(), np.zeros(0, np.intp), np.zeros(0, np.int64)
    # Slot 2j or 2j + 1 of winner j: of a retraction and an insertion of the same key,
    # the smaller row goes first.
    new_first = np.zeros(len(hi), dtype=bool)
    pair = retract & insert & both
    if pair.any():
        less = pc.fill_null(pc.less(new, old), False).to_numpy(zero_copy_only=False)
        new_first = np.asarray(less, bool) & pair
    diff = np.concatenate([np.full(len(r), -1, np.int64), np.ones(len(i), np.int64)])
    if len(r) == 0 or len(i) == 0:
        source = i if len(r) == 0 else r
        values = new if len(r) == 0 else old
        row = values if len(source) == len(values) else values.take(pa.array(source, pa.int64()))
    else:
        slots = np.concatenate([2 * r + new_first[r], 2 * i + ~new_first[i]])
        order = np.argsort(slots, kind="stable")
        source = np.concatenate([r, i])[order]
        taken = pa.chunked_array([old.take(pa.array(r, pa.int64())),
                                  new.take(pa.array(i, pa.int64()))], ROW_TYPE)
        row = taken.take(pa.array(order, pa.int64())).combine_chunks()
        diff = diff[order]
    keys = join_keys(hi[source], lo[source]).cast(pa.binary())
    row = row.cast(pa.binary())
    table = pa.table(
        [keys, row, pa.array(np.full(len(source), ts, np.int64)), pa.array(diff)],
        schema=UPDATE_SCHEMA,
    )
    return table, source, diff
