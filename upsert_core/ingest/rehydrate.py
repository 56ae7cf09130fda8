"""Rehydration: rebuild one bucket's upsert state from the shard's own contents.

Used when a bucket's checkpoint is missing, unreadable, or not known to be current at
the shard's upper. The bucket's rows of ``snapshot(upper - 1)`` are consolidated into a
fresh state with :meth:`UpsertState.consolidate_chunk` in one completing chunk, so every
value is checksum-verified (``ensure_decoded``) before the state is used: a snapshot
that is not consolidated (two live rows for a key, a negative multiplicity) raises
:class:`InvalidUpsertState` instead of feeding garbage to the drain.

Invariants and limits:

- ``OrderScope.BATCH``: the rebuilt state equals what feedback would have built (values
  with order None; deleted keys absent), so rehydration is exact.
- ``OrderScope.GLOBAL``: a live value's order is read back from the order column inside
  its row (the row keeps every column but the delete marker). Tombstones live only in
  checkpoints: a deleted key leaves no row in the shard, so its remembered order is
  lost and a later, older update of that key would be applied. The caller reports this
  as a warning; it is inherent to keeping tombstones out of the output collection.
- An empty shard (upper 0) needs no rehydration: the state is empty.
"""

from __future__ import annotations

import datetime as dt

from upsert_core.backends import InMemoryBackend
from upsert_core.codec import decode_datums
from upsert_core.drain import GLOBAL_POSITION, OrderScope
from upsert_core.errors import CodecError, CorruptData, NotReadable
from upsert_core.ingest.buckets import bucket_updates
from upsert_core.ingest.checkpoint import new_state
from upsert_core.persist.location import Blob
from upsert_core.persist.read import snapshot
from upsert_core.persist.state import ShardState
from upsert_core.state import PutValue, StateValue, UpsertState

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_US = dt.timedelta(microseconds=1)

GLOBAL_REHYDRATION_WARNING = (
    "order scope global: bucket {bucket} was rehydrated from the shard's snapshot, which "
    "holds no tombstones; orders of deleted keys are forgotten, so an older update of a "
    "deleted key arriving later would be applied"
)


def order_value(datum: object) -> int:
    """An order column value as the int64 the drain compares (timestamps in microseconds)."""
    if isinstance(datum, bool):
        raise CodecError(f"order value {datum!r} is not an integer or timestamp")
    if isinstance(datum, int):
        return datum
    if isinstance(datum, dt.datetime):
        aware = datum if datum.tzinfo is not None else datum.replace(tzinfo=dt.UTC)
        return (aware - _EPOCH) // _US
    raise CodecError(f"order value {datum!r} is not an integer or timestamp")


def rehydrate_bucket(
    blob: Blob,
    shard_state: ShardState,
    bucket: int,
    buckets: int,
    scope: OrderScope,
    order_index: int | None,
) -> UpsertState:
    """Bucket ``bucket``'s state at ``shard_state.upper``, rebuilt from the snapshot.

    ``order_index`` is the order column's position in the row (needed in the global
    scope whenever the shard has rows).
    """
    if shard_state.upper == 0:
        return new_state()
    as_of = shard_state.upper - 1
    if shard_state.since > as_of:
        raise NotReadable(
            f"shard {shard_state.shard_id}: cannot rehydrate upsert state bucket {bucket}: "
            f"the latest snapshot (ts {as_of}) is before since {shard_state.since}"
        )
    updates = bucket_updates(snapshot(blob, shard_state, as_of), bucket, buckets)
    state = new_state_pending()
    state.consolidate_chunk(updates, completes_snapshot=True)
    if scope is OrderScope.GLOBAL and len(state):
        _restore_orders(state, shard_state.shard_id, order_index)
    return state


def new_state_pending() -> UpsertState:
    """An empty state whose snapshot is not complete yet (rehydration feeds it)."""
    return UpsertState(InMemoryBackend())


def _restore_orders(state: UpsertState, shard: str, order_index: int | None) -> None:
    if order_index is None:
        raise CorruptData(f"shard {shard}: has rows but its schema has no order column")
    items = list(state.items())
    keys = [k for k, _ in items]
    got = state.multi_get(keys)
    puts: list[tuple[bytes, PutValue]] = []
    for (key, value), current in zip(items, got, strict=True):
        row = value.finalized_value
        if row is None:
            continue
        try:
            datums = decode_datums(row)
            ov = order_value(datums[order_index])
        except (CodecError, IndexError) as exc:
            raise CorruptData(
                f"shard {shard}: cannot read the order value of a stored row: {exc}"
            ) from exc
        new = StateValue.finalized_value(row, (ov, GLOBAL_POSITION))
        puts.append((key, PutValue(new, current.metadata)))
    state.multi_put(puts)
