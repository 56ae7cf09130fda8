"""Feedback: the state learns the final value of each key from committed output.

After the output of a timestamp has been committed to the shard, the caller passes the
:class:`DrainOutput` that produced it to :func:`apply_feedback`. For every key decided
there, the state gets its finalized value (or tombstone), replacing any provisional part
a partial ``AtTime`` drain left.

Invariants:

- ``OrderScope.BATCH``: a finalized value carries order None (it sorts below every
  order, so any later timestamp overrides it) and a delete removes the key. This is
  exactly what rehydrating from the output collection (``consolidate_chunk``) yields.
- ``OrderScope.GLOBAL``: a finalized value or tombstone carries ``(order value,
  GLOBAL_POSITION)``. With the maximal position, any later update with the same order
  value compares ``<=`` and is skipped: positions only break ties *within* a batch.
  Tombstones stay, so a late update never resurrects a deleted key.
- Per-record stats (values, tombstones, bytes) stay exact: feedback is written with
  ``update_per_record_stats=True`` against the metadata the stats last counted, which
  for a key written provisionally is its metadata from before that (uncounted) write.
"""

from __future__ import annotations

from tests.oracle.drain.output import DrainOutput
from tests.oracle.drain.styles import OrderScope
from tests.oracle.state import PutStats, PutValue, StateValue, UpsertState, ValueMetadata
from tests.oracle.state.gc_pause import gc_paused

GLOBAL_POSITION = 2**63 - 1
"""Position stored with finalized orders in the global scope (the maximal int64)."""


def apply_feedback(state: UpsertState, output: DrainOutput, order_scope: OrderScope) -> PutStats:
    """Write the finalized values decided in ``output`` into ``state``.

    Call only after ``output`` (all drains of its timestamps) has been committed.
    Returns the :class:`PutStats` of the write.
    """
    keys, values, order_values = output.final_columns()
    if not keys:
        return PutStats()
    with gc_paused():
        got = state.multi_get(keys)
        counted = output.counted_metadata
        previous = [g.metadata for g in got]
        if counted:
            previous = [counted.get(k, p) for k, p in zip(keys, previous, strict=True)]
        new_value = StateValue.new_finalized_value
        news: list[StateValue | None]
        if order_scope is OrderScope.GLOBAL:
            tombstone = StateValue.finalized_tombstone
            news = [
                tombstone((o, GLOBAL_POSITION)) if v is None else new_value(v, (o, GLOBAL_POSITION))
                for v, o in zip(values, order_values, strict=True)
            ]
        else:
            # Batch scope: no order is remembered, and a delete removes the key.
            news = [None if v is None else new_value(v, None) for v in values]
        puts = zip(keys, map(_put_value, zip(news, previous, strict=True)), strict=True)
        return state.multi_put(puts, update_per_record_stats=True)


def _put_value(pair: tuple[StateValue | None, ValueMetadata | None]) -> PutValue:
    return tuple.__new__(PutValue, pair)
