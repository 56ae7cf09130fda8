"""Buckets: which upsert-state bucket a key belongs to, and rows split by bucket.

A shard's keys are spread over N buckets (N fixed per shard). Each bucket has its own
upsert state and checkpoint, so buckets are drained independently (one Spark task
each), like Materialize exchanging updates by the hashed upsert key.

Invariants:

- The key-to-bucket map is :mod:`upsert_core.persist.write.buckets` (re-exported here):
  ``bucket = (first 8 bytes of the key, big-endian) mod N``, the same in every process.
- :func:`split_rows` and :func:`bucket_indices` keep file order within a bucket and lose
  no row.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from upsert_core.persist.write.buckets import IntArray, bucket_of, bucket_of_keys

__all__ = [
    "IntArray", "bucket_indices", "bucket_of", "bucket_of_keys", "bucket_tables", "split_rows",
    "take_rows",
]


def _bucket_runs(bucket_column: IntArray) -> tuple[IntArray, list[tuple[int, int, int]]]:
    """A stable permutation grouping rows by bucket, and each bucket's ``(bucket, start,
    end)`` range in it (ascending buckets; file order within each)."""
    perm = np.argsort(bucket_column, kind="stable")
    values, starts = np.unique(bucket_column[perm], return_index=True)
    ends = np.append(starts[1:], len(perm))
    return perm, list(zip(values.tolist(), starts.tolist(), ends.tolist(), strict=True))


def bucket_indices(bucket_column: IntArray) -> dict[int, IntArray]:
    """For each bucket present in ``bucket_column``, the indices of its rows, ascending
    (file order)."""
    if not len(bucket_column):
        return {}
    perm, runs = _bucket_runs(bucket_column)
    return {int(b): perm[start:end] for b, start, end in runs}


def take_rows(table: pa.Table, indices: IntArray) -> pa.Table:
    """The rows ``indices`` (ascending, distinct) of ``table``: ``table`` itself when
    they are all of its rows."""
    if len(indices) == table.num_rows:
        return table  # ascending and distinct over 0..n-1: the identity
    return table.take(pa.array(indices, type=pa.int64()))


def split_rows(table: pa.Table, bucket_column: IntArray) -> dict[int, pa.Table]:
    """``table``'s rows grouped by bucket (file order kept within each group)."""
    if table.num_rows == 0:
        return {}
    perm, runs = _bucket_runs(bucket_column)
    if len(runs) == 1:
        return {int(runs[0][0]): table}  # one bucket: the rows as they are
    # One take, then zero-copy slices (not one take per bucket).
    ordered = table.take(pa.array(perm, type=pa.int64()))
    return {int(b): ordered.slice(start, end - start) for b, start, end in runs}


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
