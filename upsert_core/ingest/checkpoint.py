"""Upsert state checkpoints: one bucket's state as of an upper, stored in Blob.

A checkpoint holds a bucket's :class:`~upsert_core.columnar.ColumnarState` in the
columnar format (:mod:`~upsert_core.columnar.checkpoint_format`: Arrow IPC behind a
digest), with metadata naming the shard, bucket, bucket count, order scope and the
upper it was written for. The shard's config references the current checkpoint of
bucket ``b`` as ``blobref.checkpoint.<b>`` (so GC keeps it) and records in
``checkpoint.upper`` the upper as of which *all* referenced checkpoints are valid (each
as its base plus the shard's changes since ``checkpoint.base.<b>``'s ``as_of``, see
``tasks.Base``; no base entry means as of ``checkpoint.upper``); they change only in
the compare-and-append that commits the batch they describe. Those entries are read
and written through :class:`~upsert_core.ingest.shard_config.ShardIngestConfig`.

Invariants:

- Every checkpoint blob gets a fresh key (uuid), so racing writers never overwrite each
  other; a writer whose append lost deletes its own checkpoints.
- :func:`load_checkpoint` returns a state only if the blob exists, its digest and
  decoding check out, its metadata matches the shard, bucket, bucket count and order
  scope asked for, and every key belongs to the bucket; anything else raises
  :class:`CheckpointUnusable` and the caller rehydrates. Location failures (the store
  is unreachable) propagate.
- A checkpoint may be a *part base* (batch order scope only): the bucket's one typed
  batch part (part format 3, labelled with the bucket, consolidated, every diff +1)
  written when the bucket's state was empty, which then holds exactly the bucket's
  state, so the state is not stored a second time (``tasks`` decides when). It loads
  as the part's value columns with rows derived on demand
  (:mod:`~upsert_core.columnar.derived_rows`); anything else about the part (another
  label, a retraction, another format, the global scope) makes it unusable. Such a
  ref names a part, not a blob under the checkpoint prefix: the part stays referenced
  by the batch that holds it and by the ref (GC keeps it while either does), and a
  writer whose append lost deletes it as one of its parts.
- Checkpoints written before the columnar format (Parquet of ``StateValue`` encodings,
  format 1) still load: they are converted once, key by key, and the next checkpoint
  the bucket writes is columnar. A loaded state holds only finalized values and
  (global scope) tombstones, ready for draining.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from upsert_core.columnar import ColumnarState, split_keys
from upsert_core.columnar.checkpoint_format import (
    decode_state,
    encode_state,
    is_columnar,
    schema_metadata,
)
from upsert_core.columnar.derived_rows import DerivedRows
from upsert_core.errors import CodecError, InvalidUpsertState, UpsertPlatformError
from upsert_core.ingest.base_cache import BaseCache
from upsert_core.ingest.legacy_values import decode_finalized
from upsert_core.order_scope import OrderScope
from upsert_core.persist.keys import checkpoint_prefix, unique_name
from upsert_core.persist.location import Blob
from upsert_core.persist.write.parts import (
    BUCKET_META,
    CONSOLIDATED_META,
    FORMAT_META,
    VALUE_PREFIX,
    VALUES_ONLY_FORMAT,
    format_bucket,
)

CHECKPOINT_FORMAT = 2
LEGACY_FORMAT = 1

LEGACY_SCHEMA = pa.schema([("key", pa.binary()), ("state", pa.binary())])
"""Format 1: one per-key state value per key, as Parquet (``ingest.legacy_values``)."""


class CheckpointUnusable(UpsertPlatformError):
    """A checkpoint that is missing, unreadable or not the one asked for."""


def checkpoint_key(shard: str, bucket: int) -> str:
    """A fresh, unique blob key for a checkpoint of ``bucket``."""
    return f"{checkpoint_prefix(shard)}{bucket:04d}-{unique_name()}.arrow"


def new_state(scope: OrderScope) -> ColumnarState:
    """An empty bucket state (the global scope keeps orders)."""
    return ColumnarState.empty(keeps_orders=scope is OrderScope.GLOBAL)


def _meta(shard: str, bucket: int, buckets: int, scope: OrderScope, upper: int) -> dict[str, Any]:
    return {
        "format": CHECKPOINT_FORMAT,
        "shard": shard,
        "bucket": bucket,
        "buckets": buckets,
        "order_scope": scope.value,
        "upper": upper,
    }


def write_checkpoint(
    blob: Blob,
    shard: str,
    bucket: int,
    buckets: int,
    scope: OrderScope,
    upper: int,
    state: ColumnarState,
) -> tuple[str, int]:
    """Write ``state`` as a new checkpoint blob; returns its key and size in bytes."""
    data = encode_state(state, _meta(shard, bucket, buckets, scope, upper))
    key = checkpoint_key(shard, bucket)
    blob.set(key, data)
    return key, len(data)


def checkpoint_intact(blob: Blob, ref: str, size: int) -> bool:
    """Whether checkpoint (or base) blob ``ref`` still exists with ``size`` bytes (any
    size when ``size`` is negative: not recorded), so a local copy of it may stand in
    for it (``ingest.base_cache``)."""
    for meta in blob.list_keys(ref):
        if meta.key == ref:
            return size < 0 or meta.size_in_bytes == size
    return False


def load_checkpoint(
    blob: Blob, key: str, shard: str, bucket: int, buckets: int, scope: OrderScope,
    *, local_cache: bool = True,
) -> ColumnarState:
    """The state stored at ``key``; :class:`CheckpointUnusable` if it cannot be used.
    With ``local_cache`` a part or typed base may come from this machine's
    :class:`BaseCache` (checked as if fetched), and one fetched is kept there for the
    next process; without it (verifying what is stored) the blob is always read."""
    cache = BaseCache.for_blob(blob, shard) if local_cache else None
    cached = cache.get(bucket, key) if cache is not None else None
    state: ColumnarState | None = None
    if cache is not None and cached is not None:
        _check_part_base(key, cached.schema.metadata, bucket, buckets, scope)
        try:
            state = _part_base_state(key, cached)
        except CheckpointUnusable:
            cache.drop(bucket, key)  # an intact entry of another layout: read the blob
    if state is None:
        state = _fetch_checkpoint(blob, key, shard, bucket, buckets, scope, cache)
    if state.keeps_orders != (scope is OrderScope.GLOBAL):
        raise CheckpointUnusable(f"checkpoint {key} does not match order scope {scope.value}")
    if len(state) and bool(np.any(state.hi % np.uint64(buckets) != np.uint64(bucket))):
        raise CheckpointUnusable(f"checkpoint {key} holds keys of other buckets")
    return state


def _fetch_checkpoint(
    blob: Blob, key: str, shard: str, bucket: int, buckets: int, scope: OrderScope,
    cache: BaseCache | None,
) -> ColumnarState:
    data = blob.get(key)
    if data is None:
        raise CheckpointUnusable(f"checkpoint {key} is missing")
    if is_columnar(data):
        try:
            state, meta = decode_state(data)
        except CodecError as exc:
            raise CheckpointUnusable(f"checkpoint {key} cannot be used: {exc}") from exc
        _check_meta(key, meta, shard, bucket, buckets, scope, CHECKPOINT_FORMAT)
        return state
    parquet = _parquet(key, data)
    schema = parquet.schema_arrow
    if FORMAT_META not in (schema.metadata or {}):
        return _load_legacy(key, parquet, shard, bucket, buckets, scope)
    _check_part_base(key, schema.metadata, bucket, buckets, scope)
    names = [n for n in schema.names if n.startswith(VALUE_PREFIX)]
    if schema.names[:3] != ["key", "ts", "diff"] or not names:
        raise CheckpointUnusable(f"checkpoint {key} has columns {schema.names}")
    try:
        # read_table would import pyarrow.dataset (0.2 s); the file is in memory already.
        table = parquet.read(columns=["key", "diff", *names], use_threads=True)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CheckpointUnusable(f"checkpoint {key} cannot be read: {exc}") from exc
    state = _part_base_state(key, table)
    if cache is not None:
        cache.put(bucket, key, table)  # only a base that loaded
    return state


def _check_meta(
    key: str, meta: object, shard: str, bucket: int, buckets: int, scope: OrderScope,
    fmt: int,
) -> None:
    expected = {**_meta(shard, bucket, buckets, scope, 0), "format": fmt}
    if not isinstance(meta, dict) or any(
        meta.get(k) != v for k, v in expected.items() if k != "upper"
    ):
        raise CheckpointUnusable(f"checkpoint {key} is not one of bucket {bucket}: {meta!r}")


def _parquet(key: str, data: bytes) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(pa.BufferReader(data))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CheckpointUnusable(f"checkpoint {key} is not valid Parquet: {exc}") from exc


def is_part_base(ref: str, shard: str) -> bool:
    """Whether checkpoint ref ``ref`` names a batch part (a part base) rather than a
    checkpoint blob."""
    return bool(ref) and not ref.startswith(checkpoint_prefix(shard))


def _check_part_base(
    key: str, meta: dict[bytes, bytes] | None, bucket: int, buckets: int, scope: OrderScope
) -> None:
    """Raise :class:`CheckpointUnusable` unless a part or typed base with schema
    metadata ``meta`` may be this bucket's base (see the module docstring)."""
    meta = meta or {}
    if scope is not OrderScope.BATCH:
        raise CheckpointUnusable(
            f"checkpoint {key} is a batch part, which is a checkpoint only in the batch "
            "order scope"
        )
    if (
        meta.get(FORMAT_META) != str(VALUES_ONLY_FORMAT).encode()
        or meta.get(BUCKET_META) != format_bucket((bucket, buckets)).encode()
        or meta.get(CONSOLIDATED_META) != b"1"
    ):
        raise CheckpointUnusable(
            f"checkpoint {key} is not a consolidated format-{VALUES_ONLY_FORMAT} part of "
            f"bucket {bucket} of {buckets}"
        )


def _part_base_state(key: str, table: pa.Table) -> ColumnarState:
    """The state a part or typed base holds, from its ``key``, ``diff`` and value
    columns as read."""
    names = [n for n in table.schema.names if n.startswith(VALUE_PREFIX)]
    if table.schema.names != ["key", "diff", *names] or not names:
        raise CheckpointUnusable(f"checkpoint {key} was read as columns {table.schema.names}")
    diffs = table.column("diff")
    if diffs.null_count or (len(diffs) and not pc.all(pc.equal(diffs, 1)).as_py()):
        raise CheckpointUnusable(f"checkpoint {key} holds updates that are not insertions")
    try:
        hi, lo = split_keys(table.column("key"))
        values = table.select(names).rename_columns([n[len(VALUE_PREFIX):] for n in names])
        return ColumnarState.checked(hi, lo, DerivedRows(values), None)
    except (InvalidUpsertState, ValueError) as exc:
        raise CheckpointUnusable(f"checkpoint {key} holds malformed keys: {exc}") from exc


def _load_legacy(
    key: str, parquet: pq.ParquetFile, shard: str, bucket: int, buckets: int,
    scope: OrderScope,
) -> ColumnarState:
    """A format-1 checkpoint, converted (per key: only ever once per bucket)."""
    try:
        table = parquet.read()
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CheckpointUnusable(f"checkpoint {key} is not valid Parquet: {exc}") from exc
    _check_meta(key, schema_metadata(table.schema), shard, bucket, buckets, scope,
                LEGACY_FORMAT)
    if table.schema.names != LEGACY_SCHEMA.names:
        raise CheckpointUnusable(f"checkpoint {key} has columns {table.schema.names}")
    if table.column("state").null_count:
        raise CheckpointUnusable(f"checkpoint {key} has a key without a state")
    try:
        values = [decode_finalized(v) for v in table.column("state").to_pylist()]
    except CodecError as exc:
        raise CheckpointUnusable(f"checkpoint {key} cannot be decoded: {exc}") from exc
    keys = table.column("key").combine_chunks()
    try:
        hi, lo = split_keys(keys)
        order = np.lexsort((lo, hi))
        orders = None
        if scope is OrderScope.GLOBAL:
            orders = np.array([_order_of(o) for _, o in values], np.int64)[order]
        rows = pa.array([row for row, _ in values], pa.large_binary())
        return ColumnarState.checked(
            hi[order], lo[order], rows.take(pa.array(order, pa.int64())), orders
        )
    except InvalidUpsertState as exc:
        raise CheckpointUnusable(f"checkpoint {key} holds malformed keys: {exc}") from exc


def _order_of(order: int | None) -> int:
    if order is None:
        raise InvalidUpsertState("a global-scope checkpoint value has no order")
    return order
