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
  (:func:`~upsert_core.persist.read.read.unmerged_changes_by_part`, one decode per part, on
  a few threads; a part labelled with a bucket goes to that bucket whole; a part this
  machine replayed before is mapped from its local copy, ``ingest.base_cache``), once
  per shard contents and ``(lower, upper)`` for all the buckets a process replays (a
  small per-process memo keyed by the shard's batches, never by name and seqno, which
  equally named shards of two locations share). If the unmerged updates do not form a
  valid chain (updates of one ``(key, row, ts)`` the merge would have summed), the
  bucket is replayed again from the merged, consolidated read, and only if that fails
  too is the state invalid.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pyarrow as pa

from upsert_core.columnar import ColumnarState, apply_changes
from upsert_core.errors import InvalidUpsertState
from upsert_core.ingest.base_cache import PARTS, BaseCache
from upsert_core.ingest.buckets import bucket_of_keys, bucket_tables, split_rows
from upsert_core.persist.keys import PART_DIR, shard_prefix
from upsert_core.persist.location import Blob
from upsert_core.persist.read.read import changes_after, unmerged_changes_by_part
from upsert_core.persist.state.state import BlobPart, HollowBatch, Part, ShardState
from upsert_core.persist.write.parts import BUCKET_META, conform_updates, format_bucket

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
            copies = _LocalPartCopies.for_shard(blob, shard_state.shard_id)
            try:
                read = unmerged_changes_by_part(blob, shard_state, lower, upper, copies)
            finally:
                if copies is not None:
                    copies.close()
            for label, table in read:
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


class _LocalPartCopies:
    """This machine's copies of the shard's parts (``ingest.base_cache``, directory
    :data:`PARTS`), each used only while its blob exists with its committed size (one
    listing of the shard's parts per replay), as for a bucket's base."""

    def __init__(self, cache: BaseCache, blob: Blob, shard: str) -> None:
        self._cache = cache
        self._blob = blob
        self._prefix = f"{shard_prefix(shard)}{PART_DIR}/"
        self._sizes: dict[str, int] | None = None
        self._lock = threading.Lock()
        self._put = False

    @classmethod
    def for_shard(cls, blob: Blob, shard: str) -> _LocalPartCopies | None:
        cache = BaseCache.for_blob(blob, shard)
        return None if cache is None else cls(cache, blob, shard)

    def get(self, key: str, size: int) -> pa.Table | None:
        with self._lock:
            if self._sizes is None:
                self._sizes = {m.key: m.size_in_bytes for m in self._blob.list_keys(self._prefix)}
            stored = self._sizes.get(key)
        if stored is None or stored != size:
            return None
        return self._cache.get(PARTS, key)

    def put(self, key: str, table: pa.Table) -> None:
        self._cache.put(PARTS, key, table, evict=False)
        self._put = True

    def close(self) -> None:
        """Apply the cache's size bound once, after the replay's puts."""
        if self._put:
            self._cache.evict()


def keep_part_copies(
    blob: Blob, shard: str, parts: Sequence[Part], updates: pa.Table,
    bucket: tuple[int, int],
) -> None:
    """Keep this machine's copies of the blob parts a bucket step just wrote (``parts``,
    written from ``updates`` in order, none sorted again), so that the next process's
    replay maps them instead of decoding them and deriving their rows: a format-3
    part's rows are derived from its values byte for byte as the ingest encoded them,
    so the updates as written are what reading the part gives. Best effort, like every
    cache entry; a copy of a part whose commit failed names a blob that never exists
    and is never used."""
    cache = BaseCache.for_blob(blob, shard)
    if cache is None or not any(isinstance(part, BlobPart) for part in parts):
        return
    conformed = conform_updates(updates).replace_schema_metadata(
        {BUCKET_META: format_bucket(bucket)}
    )
    at = 0
    for part in parts:
        if isinstance(part, BlobPart):
            cache.put(PARTS, part.key, conformed.slice(at, part.num_updates), evict=False)
        at += part.num_updates
    cache.evict()


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
