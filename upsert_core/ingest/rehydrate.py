"""Rehydration: rebuild one bucket's upsert state from the shard's own contents.

Used when a bucket's checkpoint is missing, unreadable, or not known to be current at
the shard's upper. The bucket's rows of ``snapshot(upper - 1)`` become a state through
:func:`~upsert_core.columnar.state_from_snapshot`, which verifies them as whole columns
before the state is used: a snapshot that is not an upsert collection (two live rows
for a key, a negative multiplicity) raises :class:`InvalidUpsertState` instead of
feeding garbage to the drain.

Invariants and limits:

- ``OrderScope.BATCH``: the rebuilt state equals what feedback would have built (values
  with order None; deleted keys absent), so rehydration is exact.
- ``OrderScope.GLOBAL``: a live value's order is read back from the order column inside
  its row (the row keeps every column but the delete marker), decoded as one column.
  A deleted key leaves no row in the shard: its tombstone comes from the bucket's
  recorded tombstone set, which the caller adds (``ingest.tombstones``). Only a bucket
  last written before sets were recorded has none; the caller then warns that its
  tombstones are forgotten.
- An empty shard (upper 0) needs no rehydration: the state is empty.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from upsert_core.columnar import ColumnarState, state_from_snapshot
from upsert_core.errors import CodecError, CorruptData, NotReadable
from upsert_core.ingest.buckets import bucket_tables
from upsert_core.ingest.checkpoint import new_state
from upsert_core.landing import SourceSchema
from upsert_core.landing.rows import decode_rows_to_table
from upsert_core.order_keys import empty_orders, order_keys
from upsert_core.order_scope import OrderScope
from upsert_core.persist.location import Blob
from upsert_core.persist.read.read import snapshot
from upsert_core.persist.state.state import ShardState

GLOBAL_REHYDRATION_WARNING = (
    "order scope global: bucket {bucket} was rehydrated from the shard's snapshot, and "
    "was last written before tombstones were recorded, so orders of its deleted keys "
    "are forgotten: an older update of a deleted key arriving later would be applied. "
    "From now on the bucket records its tombstones"
)


def rehydrate_bucket(
    blob: Blob,
    shard_state: ShardState,
    bucket: int,
    buckets: int,
    scope: OrderScope,
    schema: SourceSchema,
) -> ColumnarState:
    """Bucket ``bucket``'s state at ``shard_state.upper``, rebuilt from the snapshot.

    ``schema`` is the shard's source schema: in the global scope each live row's order
    value is read from its order column.
    """
    if shard_state.upper == 0:
        return new_state(scope)
    as_of = shard_state.upper - 1
    if shard_state.since > as_of:
        raise NotReadable(
            f"shard {shard_state.shard_id}: cannot rehydrate upsert state bucket {bucket}: "
            f"the latest snapshot (ts {as_of}) is before since {shard_state.since}"
        )
    # SUBTLE: negative rows too (``positive_only=False``): the verification below must
    # see them to refuse them; the default read drops them, hiding the corruption.
    updates = bucket_tables(
        snapshot(blob, shard_state, as_of, positive_only=False), bucket, buckets
    )
    if scope is OrderScope.BATCH:
        return state_from_snapshot(updates)

    def orders(rows: pa.Array) -> np.ndarray:
        return order_values(shard_state.shard_id, schema, rows)

    return state_from_snapshot(updates, orders)


def order_values(shard: str, schema: SourceSchema, rows: pa.Array) -> np.ndarray:
    """The order value of each encoded row, as the drain compares it: an int64
    (timestamps in microseconds since the epoch, naive ones read as UTC), or for an
    order of several columns the order key of the row's order columns
    (``upsert_core.order_keys``, as validation made it).

    The one reading of orders from rows: rehydration builds global-scope states with
    it, and ``verify`` checks every live key's checkpointed order against it."""
    if not len(rows):
        return empty_orders(schema.several_orders)
    missing = [name for name in schema.order_columns if name not in schema.names]
    if missing:
        raise CorruptData(
            f"shard {shard}: has rows but its schema has no order column {missing[0]!r}")
    try:
        table = decode_rows_to_table(schema, rows.cast(pa.binary()))
    except (CodecError, TypeError) as exc:
        raise CorruptData(
            f"shard {shard}: cannot read the order values of stored rows: {exc}"
        ) from exc
    columns = [table.column(name).combine_chunks() for name in schema.order_columns]
    if any(column.null_count for column in columns):
        raise CorruptData(f"shard {shard}: a stored row has no order value")
    if schema.several_orders:
        return order_keys(columns)
    column = columns[0]
    if pa.types.is_timestamp(column.type):
        column = pc.cast(column, pa.timestamp("us", column.type.tz)).cast(pa.int64())
    return np.asarray(column.to_numpy(zero_copy_only=False), np.int64)
