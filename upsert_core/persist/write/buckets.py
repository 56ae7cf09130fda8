"""The key-to-bucket map: which of a shard's N buckets a 16-byte upsert key belongs to.

Buckets partition a shard's keys: the ingest drains each bucket on its own, and a
part labelled with a bucket (``parts``) holds only keys of that bucket, so reads treat
differently labelled parts as sharing no key.

Invariants:

- ``bucket = (first 8 bytes of the 16-byte upsert key, big-endian) mod N``. Upsert keys
  are xxh3-128 digests, so buckets are balanced; the map depends on nothing but the key
  and N, so every process and engine agrees on it, and it never changes.
"""

from __future__ import annotations

from collections.abc import Sequence

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
