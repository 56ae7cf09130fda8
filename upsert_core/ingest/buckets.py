"""Buckets: which upsert-state bucket a key belongs to, and rows split by bucket.

A shard's keys are spread over N buckets (N fixed per shard). Each bucket has its own
upsert state and checkpoint, so buckets are drained independently (one Spark task
each), like Materialize exchanging updates by the hashed upsert key.

Invariants:

- ``bucket = (first 8 bytes of the 16-byte upsert key, big-endian) mod N``. Upsert keys
  are xxh3-128 digests, so buckets are balanced; the map depends on nothing but the key
  and N, so every process and engine agrees on it.
- :func:`split_rows` keeps file order within a bucket and loses no row.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from upsert_core.codec import UPSERT_KEY_LEN
from upsert_core.errors import InvalidUsage

IntArray = npt.NDArray[np.int64]


def bucket_of_keys(keys: Sequence[bytes] | pa.Array, buckets: int) -> IntArray:
    """The bucket of each 16-byte key, vectorised."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if isinstance(keys, pa.Array):
        n = len(keys)
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        if not pa.types.is_fixed_size_binary(keys.type):
            keys = keys.cast(pa.binary(UPSERT_KEY_LEN))
        if keys.null_count:
            raise InvalidUsage("upsert keys must not be null")
        raw = keys.buffers()[1]
        offset = keys.offset * UPSERT_KEY_LEN
        data = np.frombuffer(raw, dtype=np.uint8, count=n * UPSERT_KEY_LEN, offset=offset)
    else:
        n = len(keys)
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        joined = b"".join(keys)
        if len(joined) != n * UPSERT_KEY_LEN:
            raise InvalidUsage(f"upsert keys must be {UPSERT_KEY_LEN} bytes each")
        data = np.frombuffer(joined, dtype=np.uint8)
    high = data.reshape(n, UPSERT_KEY_LEN)[:, :8].copy().view(">u8").reshape(n)
    return (high % np.uint64(buckets)).astype(np.int64)


def bucket_of(key: bytes, buckets: int) -> int:
    """The bucket of one key (the scalar form of :func:`bucket_of_keys`)."""
    return int.from_bytes(key[:8], "big") % buckets


def split_rows(table: pa.Table, bucket_column: IntArray) -> dict[int, pa.Table]:
    """``table``'s rows grouped by bucket (file order kept within each group)."""
    out: dict[int, pa.Table] = {}
    if table.num_rows == 0:
        return out
    # One stable sort and one take, then zero-copy slices (not one take per bucket).
    perm = np.argsort(bucket_column, kind="stable")
    ordered = table.take(pa.array(perm, type=pa.int64()))
    sorted_buckets = bucket_column[perm]
    values, starts = np.unique(sorted_buckets, return_index=True)
    ends = np.append(starts[1:], len(perm))
    for b, start, end in zip(values.tolist(), starts.tolist(), ends.tolist(), strict=True):
        out[int(b)] = ordered.slice(start, end - start)
    return out


def bucket_tables(
    batches: Iterable[pa.RecordBatch | pa.Table], bucket: int, buckets: int
) -> list[pa.Table]:
    """The updates of ``bucket`` among the shard updates ``batches`` (a snapshot or a
    changes read), as tables with the batches' columns."""
    out: list[pa.Table] = []
    for batch in batches:
        in_bucket = bucket_of_keys(batch.column("key"), buckets) == bucket
        if not in_bucket.any():
            continue
        table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        out.append(table if in_bucket.all() else table.filter(pa.array(in_bucket)))
    return out
