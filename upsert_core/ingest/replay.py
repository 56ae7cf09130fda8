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
- Reads are cheap and shared: the changes are read without the k-way merge
  (:func:`~upsert_core.persist.read.unmerged_changes_by_part`, one decode per part, on
  a few threads; a part labelled with a bucket goes to that bucket whole), once
  per shard contents and ``(lower, upper)`` for all the buckets a process replays (a
  small per-process memo keyed by the shard's batches, never by name and seqno, which
  equally named shards of two locations share). If the unmerged updates do not form a
  valid chain (updates of one ``(key, row, ts)`` the merge would have summed), the
  bucket is replayed again from the merged, consolidated read, and only if that fails
  too is the state invalid.
"""

from __future__ import annotations

import threading

import pyarrow as pa

from upsert_core.columnar import ColumnarState, apply_changes
from upsert_core.errors import InvalidUpsertState
from upsert_core.ingest.buckets import bucket_of_keys, bucket_tables, split_rows
from upsert_core.persist.location import Blob
from upsert_core.persist.read import changes_after, unmerged_changes_by_part
from upsert_core.persist.state import HollowBatch, ShardState

_MemoKey = tuple[str, int, int, int, int, tuple[HollowBatch, ...]]
_memo: dict[_MemoKey, dict[int, list[pa.Table]]] = {}
_memo_lock = threading.Lock()
_read_lock = threading.Lock()


def _unmerged(
    blob: Blob, shard_state: ShardState, lower: int, upper: int, buckets: int
) -> dict[int, list[pa.Table]]:
    """The shard's unmerged changes in ``[lower, upper)`` by bucket, read once per
    process for given shard contents (only the last one read is kept; a bucket asking
    while another reads them waits for that read). A part labelled with one of the
    ``buckets`` buckets goes to it whole; an unlabelled part's updates are split by key.

    SUBTLE: the key names the contents, not the shard version: shard name and seqno
    are not unique within a process (two locations may hold equally named shards with
    equal seqnos), and another shard's changes can form a valid chain on this state
    (insertions of keys it does not hold), so a collision would corrupt it silently.
    """
    key = (shard_state.shard_id, shard_state.since, lower, upper, buckets,
           shard_state.batches)
    with _read_lock:
        with _memo_lock:
            by_bucket = _memo.get(key)
        if by_bucket is None:
            by_bucket = {}
            for label, table in unmerged_changes_by_part(blob, shard_state, lower, upper):
                if label is not None and label[1] == buckets:
                    by_bucket.setdefault(label[0], []).append(table)
                    continue
                split = split_rows(table, bucket_of_keys(table.column("key"), buckets))
                for bucket, rows in split.items():
                    by_bucket.setdefault(bucket, []).append(rows)
            with _memo_lock:
                _memo.clear()
                _memo[key] = by_bucket
    return by_bucket


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
    fast = _unmerged(blob, shard_state, lower, upper, buckets).get(bucket, [])
    try:
        return apply_changes(state, fast)
    except InvalidUpsertState:
        merged = changes_after(blob, shard_state, lower, upper)
        return apply_changes(state, bucket_tables(merged, bucket, buckets))
