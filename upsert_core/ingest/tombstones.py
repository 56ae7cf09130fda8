"""Tombstones as shard data: a global-scope bucket's deleted keys and their orders.

In the ``global`` order scope a deleted key is remembered with the order value it was
deleted at, so a late, older update of it is skipped (CONTRACT: no GC, compaction or
rebuild of the state ever forgets a tombstone). A deleted key leaves no row in the
shard's output, so the rows alone cannot rebuild that memory: each bucket's tombstones
are recorded beside its rows, as the *tombstone set* of the bucket, a blob the shard's
config references as ``blobref.tombstones.<b>`` (an empty value: the bucket has none).
The reference changes only in the compare-and-append that commits the batch it
describes, like the checkpoint references, and being a ``blobref.`` entry it is kept by
GC for as long as a live state references it. Checkpoints stay a cache: a bucket whose
checkpoint is lost or stale is rebuilt from the shard's rows plus this set.

Format: the columnar checkpoint format (:mod:`~upsert_core.columnar.checkpoint_format`:
Arrow IPC behind an xxh3-128 digest) of a state that holds only tombstones (every row
null, with its order), metadata ``kind`` ``tombstones``.

Invariants:

- A set is written whenever a global-scope bucket's state changed (or was rebuilt, or
  had no set recorded yet), from the state the batch leaves: it holds exactly the
  state's tombstones at the new upper. Every blob gets a fresh key.
- :func:`load_tombstones` returns a set only if the blob exists, its digest and
  decoding check out, its metadata names this shard, bucket and bucket count, and every
  key belongs to the bucket. Anything else raises :class:`TombstonesLost`: a rebuild
  without them would forget deletes, so the ingest stops instead (the contract forbids
  forgetting), naming the blob and what to do.
- :func:`with_tombstones` adds a set to a state rebuilt from the shard's rows: a key
  with a live row keeps it (a row committed after the delete supersedes it), every
  other recorded key becomes a tombstone with its recorded order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from upsert_core.columnar import ColumnarState
from upsert_core.columnar.checkpoint_format import decode_state, encode_state, is_columnar
from upsert_core.columnar.merge import fold
from upsert_core.columnar.state import ROW_TYPE, locate
from upsert_core.errors import CodecError, InvalidUpsertState, ShardError
from upsert_core.order_keys import concat_orders
from upsert_core.persist.keys import checkpoint_prefix, unique_name
from upsert_core.persist.location import Blob

TOMBSTONES_FORMAT = 1
KIND = "tombstones"


class TombstonesLost(ShardError):
    """A bucket's recorded tombstone set is missing or unreadable."""


def tombstones_key(shard: str, bucket: int) -> str:
    """A fresh, unique blob key for a tombstone set of ``bucket``."""
    return f"{checkpoint_prefix(shard)}{bucket:04d}-tombstones-{unique_name()}.arrow"


def _meta(shard: str, bucket: int, buckets: int, upper: int) -> dict[str, Any]:
    return {
        "kind": KIND,
        "format": TOMBSTONES_FORMAT,
        "shard": shard,
        "bucket": bucket,
        "buckets": buckets,
        "upper": upper,
    }


def tombstones_of(state: ColumnarState) -> ColumnarState:
    """The tombstones of a global-scope ``state`` (its overlay folded in), as a state."""
    state = fold(state)
    if state.orders is None:
        raise InvalidUpsertState("a batch-scope state has no tombstones")
    dead = np.flatnonzero(state.rows.is_null().to_numpy(zero_copy_only=False))
    return ColumnarState(
        state.hi[dead], state.lo[dead], pa.nulls(len(dead), ROW_TYPE), state.orders[dead]
    )


def write_tombstones(
    blob: Blob, shard: str, bucket: int, buckets: int, upper: int, state: ColumnarState
) -> tuple[str, int]:
    """Write the tombstones of ``state`` (the bucket's state at ``upper``) as a new set;
    returns its key and size, or ``("", 0)`` when the state has none (nothing written)."""
    dead = tombstones_of(state)
    if len(dead) == 0:
        return "", 0
    data = encode_state(dead, _meta(shard, bucket, buckets, upper))
    key = tombstones_key(shard, bucket)
    blob.set(key, data)
    return key, len(data)


def load_tombstones(
    blob: Blob, key: str, shard: str, bucket: int, buckets: int
) -> ColumnarState:
    """The tombstone set stored at ``key`` (``""``: none); :class:`TombstonesLost` if it
    cannot be used (module docstring)."""
    if not key:
        return ColumnarState.empty(keeps_orders=True)

    def lost(why: str) -> TombstonesLost:
        return TombstonesLost(
            f"shard {shard}: the tombstones of bucket {bucket} (blob {key}) {why}. "
            "Rebuilding the bucket's upsert state without them would forget which keys "
            "were deleted and let older updates of them back in, so the ingest stops. "
            "Restore the blob from a backup of the blob store; `upsertctl check --shard "
            f"{shard}` lists every bucket affected"
        )

    data = blob.get(key)
    if data is None:
        raise lost("are missing")
    if not is_columnar(data):
        raise lost("are not a tombstone set")
    try:
        state, meta = decode_state(data)
    except CodecError as exc:
        raise lost(f"cannot be read: {exc}") from exc
    expected = _meta(shard, bucket, buckets, 0)
    if any(meta.get(k) != v for k, v in expected.items() if k != "upper"):
        raise lost(f"belong to another bucket or shard: {meta!r}")
    if state.orders is None or state.rows.null_count != len(state):
        raise lost("hold rows, not tombstones")
    if len(state) and bool(np.any(state.hi % np.uint64(buckets) != np.uint64(bucket))):
        raise lost("hold keys of other buckets")
    return state


def with_tombstones(state: ColumnarState, dead: ColumnarState) -> ColumnarState:
    """``state`` (rebuilt from the shard's rows, global scope) with the recorded
    tombstones ``dead`` added for every key it holds no row for."""
    state = fold(state)
    if state.orders is None or dead.orders is None:
        raise InvalidUpsertState("tombstones belong to the global order scope")
    if len(dead) == 0:
        return state
    _, found = locate(state.hi, state.lo, dead.hi, dead.lo)
    add = np.flatnonzero(~found)
    hi = np.concatenate([state.hi, dead.hi[add]])
    lo = np.concatenate([state.lo, dead.lo[add]])
    orders = concat_orders([state.orders, dead.orders[add]])
    rows = pa.concat_arrays([state.rows.cast(ROW_TYPE), pa.nulls(len(add), ROW_TYPE)])
    perm = np.lexsort((lo, hi))
    return ColumnarState.checked(
        hi[perm], lo[perm], rows.take(pa.array(perm, pa.int64())), orders[perm]
    )


__all__ = [
    "TombstonesLost",
    "load_tombstones",
    "tombstones_of",
    "with_tombstones",
    "write_tombstones",
]
