"""Buckets: which upsert-state bucket a key belongs to, and rows split by bucket.

A shard's keys are spread over N buckets (N fixed per shard). Each bucket has its own
upsert state and checkpoint, so buckets are drained independently (one Spark task
each), like Materialize exchanging updates by the hashed upsert key.

Invariants:

- The key-to-bucket map is :mod:`upsert_core.persist.buckets` (re-exported here):
  ``bucket = (first 8 bytes of the key, big-endian) mod N``, the same in every process.
- :func:`split_rows` keeps file order within a bucket and loses no row.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from upsert_core.persist.buckets import IntArray, bucket_of, bucket_of_keys

__all__ = ["IntArray", "bucket_of", "bucket_of_keys", "bucket_tables", "split_rows"]


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
