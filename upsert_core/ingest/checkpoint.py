"""Upsert state checkpoints: one bucket's state as of an upper, stored in Blob.

A checkpoint is a Parquet blob with columns ``key`` (16-byte upsert key) and ``state``
(``StateValue.encode()``), plus schema metadata naming the shard, bucket, bucket count,
order scope and the upper it was written for. The shard's config references the
current checkpoint of bucket ``b`` as ``blobref.checkpoint.<b>`` (so GC keeps it) and
records in ``checkpoint.upper`` the upper as of which *all* referenced checkpoints are
valid (each as its base plus the shard's changes since ``checkpoint.base.<b>``'s
``as_of``, see ``tasks.Base``; no base entry means as of ``checkpoint.upper``); they
change only in the compare-and-append that commits the batch they describe.

Invariants:

- Every checkpoint blob gets a fresh key (uuid), so racing writers never overwrite each
  other; a writer whose append lost deletes its own checkpoints.
- :func:`load_checkpoint` returns a state only if the blob exists, decodes, and its
  metadata matches the shard, bucket, bucket count and order scope asked for, and every
  key belongs to the bucket; anything else raises :class:`CheckpointUnusable` and the
  caller rehydrates. Location failures (the store is unreachable) propagate.
- A loaded state holds only finalized values and tombstones, and has its snapshot
  marked complete, so it is ready for draining.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from upsert_core.backends import InMemoryBackend
from upsert_core.drain import OrderScope
from upsert_core.errors import CodecError, InvalidUsage, UpsertPlatformError
from upsert_core.ingest.buckets import bucket_of_keys
from upsert_core.persist.keys import checkpoint_prefix, unique_name
from upsert_core.persist.location import Blob
from upsert_core.persist.parts import encode_parquet
from upsert_core.persist.state import BLOB_REF_PREFIX
from upsert_core.state import PutValue, StateValue, UpsertState

CHECKPOINT_FORMAT = 1
CONFIG_CHECKPOINT_UPPER = "checkpoint.upper"
METADATA_KEY = b"upsert.checkpoint"

CHECKPOINT_SCHEMA = pa.schema([("key", pa.binary()), ("state", pa.binary())])


class CheckpointUnusable(UpsertPlatformError):
    """A checkpoint that is missing, unreadable or not the one asked for."""


def checkpoint_ref_name(bucket: int) -> str:
    """The config entry referencing bucket ``bucket``'s checkpoint blob."""
    return f"{BLOB_REF_PREFIX}checkpoint.{bucket}"


def checkpoint_base_name(bucket: int) -> str:
    """The config entry describing bucket ``bucket``'s checkpoint base (``tasks.Base``)."""
    return f"checkpoint.base.{bucket}"


def checkpoint_key(shard: str, bucket: int) -> str:
    """A fresh, unique blob key for a checkpoint of ``bucket``."""
    return f"{checkpoint_prefix(shard)}{bucket:04d}-{unique_name()}.parquet"


def new_state() -> UpsertState:
    """An empty upsert state with its snapshot complete (nothing to rehydrate)."""
    state = UpsertState(InMemoryBackend())
    state.consolidate_chunk([], completes_snapshot=True)
    return state


def _meta(shard: str, bucket: int, buckets: int, scope: OrderScope, upper: int) -> bytes:
    return json.dumps(
        {
            "format": CHECKPOINT_FORMAT,
            "shard": shard,
            "bucket": bucket,
            "buckets": buckets,
            "order_scope": scope.value,
            "upper": upper,
        },
        sort_keys=True,
    ).encode()


def write_checkpoint(
    blob: Blob,
    shard: str,
    bucket: int,
    buckets: int,
    scope: OrderScope,
    upper: int,
    state: UpsertState,
) -> tuple[str, int]:
    """Write ``state`` as a new checkpoint blob; returns its key and size in bytes."""
    items = list(state.items())
    keys = [k for k, _ in items]
    values = [v.encode() for _, v in items]
    table = pa.table(
        [pa.array(keys, pa.binary()), pa.array(values, pa.binary())], schema=CHECKPOINT_SCHEMA
    ).replace_schema_metadata({METADATA_KEY: _meta(shard, bucket, buckets, scope, upper)})
    data = encode_parquet(table)
    key = checkpoint_key(shard, bucket)
    blob.set(key, data)
    return key, len(data)


def load_checkpoint(
    blob: Blob, key: str, shard: str, bucket: int, buckets: int, scope: OrderScope
) -> UpsertState:
    """The state stored at ``key``; :class:`CheckpointUnusable` if it cannot be used."""
    data = blob.get(key)
    if data is None:
        raise CheckpointUnusable(f"checkpoint {key} is missing")
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CheckpointUnusable(f"checkpoint {key} is not valid Parquet: {exc}") from exc
    raw = (table.schema.metadata or {}).get(METADATA_KEY)
    try:
        meta = json.loads(raw) if raw is not None else None
    except ValueError:
        meta = None
    expected = json.loads(_meta(shard, bucket, buckets, scope, 0))
    if not isinstance(meta, dict) or any(
        meta.get(k) != v for k, v in expected.items() if k != "upper"
    ):
        raise CheckpointUnusable(f"checkpoint {key} is not one of bucket {bucket}: {meta!r}")
    if table.schema.names != CHECKPOINT_SCHEMA.names:
        raise CheckpointUnusable(f"checkpoint {key} has columns {table.schema.names}")
    keys = table.column("key").to_pylist()
    try:
        foreign = bool(keys) and bool((bucket_of_keys(keys, buckets) != bucket).any())
    except InvalidUsage as exc:
        raise CheckpointUnusable(f"checkpoint {key} has malformed keys: {exc}") from exc
    if foreign:
        raise CheckpointUnusable(f"checkpoint {key} holds keys of other buckets")
    try:
        values = [StateValue.decode(v) for v in table.column("state").to_pylist()]
    except CodecError as exc:
        raise CheckpointUnusable(f"checkpoint {key} cannot be decoded: {exc}") from exc
    if any(v.is_consolidating or v.is_provisional for v in values):
        raise CheckpointUnusable(f"checkpoint {key} holds undecoded or provisional values")
    state = new_state()
    state.multi_put((k, PutValue(v, None)) for k, v in zip(keys, values, strict=True))
    return state
