"""Replay: bring a bucket state from an earlier upper to the shard's upper.

In the batch order scope the state after an ingest commit is exactly the bucket's
rows of the shard's snapshot (values with order None, deleted keys absent; see
``drain.feedback``). So a state known at ``lower`` plus the shard's consolidated
changes in ``[lower, upper)`` for the bucket's keys is the state at ``upper``: the
shard's own updates are the checkpoint's change log. That is what lets a bucket keep
an older checkpoint (a *base*) instead of rewriting it every batch, and lets a cached
state a few commits old catch up.

Invariants:

- Only for ``OrderScope.BATCH``; the global scope needs orders and tombstones the
  shard does not hold, so its checkpoints are always current (never replayed).
- The changes are applied by :func:`~upsert_core.columnar.apply_changes`, which checks
  that they form a valid chain per key: changes that do not fit the state (a
  retraction of a value it does not hold, an insertion over a live key) raise
  :class:`InvalidUpsertState` and the caller rehydrates instead.
- Changes that are not readable as pure changes any more raise :class:`NotReadable`
  and the caller rehydrates: ``since > lower`` (compacted away), and also
  ``since == lower > 0``, where the updates at ``since`` hold all history before it
  folded there, which the state already contains (``read.changes_after``). Replaying
  those would apply that history twice (an insert over a live key, a retraction of a
  value already gone).
"""

from __future__ import annotations

from upsert_core.columnar import ColumnarState, apply_changes
from upsert_core.ingest.buckets import bucket_tables
from upsert_core.persist.location import Blob
from upsert_core.persist.read import changes_after
from upsert_core.persist.state import ShardState


def replay_bucket(
    blob: Blob,
    shard_state: ShardState,
    state: ColumnarState,
    bucket: int,
    buckets: int,
    lower: int,
    upper: int,
) -> tuple[ColumnarState, int]:
    """``state`` (as of ``lower``) with the shard's changes in ``[lower, upper)`` of
    ``bucket`` applied, and the number of updates applied."""
    if lower >= upper:
        return state, 0
    updates = bucket_tables(changes_after(blob, shard_state, lower, upper), bucket, buckets)
    return apply_changes(state, updates)
