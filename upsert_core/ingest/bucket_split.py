"""New buckets' upsert states cut from old ones: the checkpoints a rebucket writes.

A shard rebucketed from ``N`` to ``M`` buckets (``ingest.rebucket``) needs, for every new
bucket ``b'``, its upsert state as of the shard's upper: exactly the keys of the old
states whose bucket of ``M`` is ``b'`` (``persist.write.buckets``), with their rows and, in the
global scope, their orders, tombstones included. The keys of ``b'`` all lie in old
buckets ``b`` with ``b = b' (mod gcd(N, M))``, so the caller loads the old buckets of one
residue at a time and hands them here with the new buckets of that residue.

Each new bucket's state is written as the checkpoint its own bucket step would write
for it (``tasks``): in the batch scope with values-only parts and part bases, a typed
base (``ingest.typed_base``), its values gathered from the old states' values without
encoding a row; otherwise a columnar checkpoint (``ingest.checkpoint``); in the global
scope also its tombstone set (``ingest.tombstones``), so no rebuild of the new bucket
ever forgets a delete. All are as of ``upper`` with nothing pending
(``tasks.Base(upper)``).

Invariants:

- The new states partition the old ones: every key of the old states is in exactly one
  new state, with the same row (bytes) and order; no key is added.
- A new bucket with no key gets no blob: checkpoint ``""`` (an empty state), and in the
  global scope tombstone set ``""`` (recorded: none).
- Every blob written is new (fresh keys) and listed in :attr:`NewBucket.new_blobs`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from upsert_core.columnar import ColumnarState
from upsert_core.columnar.derived_rows import as_row_array, take_rows
from upsert_core.columnar.merge import fold
from upsert_core.columnar.state import ROW_TYPE
from upsert_core.ingest.checkpoint import write_checkpoint
from upsert_core.ingest.tasks import Base, FileTask
from upsert_core.ingest.tombstones import write_tombstones
from upsert_core.ingest.typed_base import state_values, write_typed_base_values
from upsert_core.landing import SourceSchema
from upsert_core.order_keys import concat_orders
from upsert_core.order_scope import OrderScope
from upsert_core.persist.keys import current_writer_id, writing_as
from upsert_core.persist.location import Blob
from upsert_core.persist.maintenance.relabel import WRITE_THREADS


@dataclass
class NewBucket:
    """What was written for one new bucket: its checkpoint ref (``""``: empty), base
    (``Base.encode``) and, in the global scope, tombstone set (``""``: none)."""

    bucket: int
    checkpoint: str
    base: str
    tombstones: str | None = None
    keys: int = 0
    live_rows: int = 0
    bytes_written: int = 0
    new_blobs: list[str] = field(default_factory=list)


def typed_bases(task: FileTask) -> bool:
    """Whether ``task``'s bucket steps write typed bases (``tasks._run_bucket``)."""
    return (task.scope is OrderScope.BATCH and task.typed_parts and task.values_only
            and task.part_bases)


def _take(table: pa.Table, index: np.ndarray) -> pa.Table:
    """Rows ``index`` of ``table`` (chunked columns of any size)."""
    return pa.Table.from_arrays(
        [take_rows(column, index) for column in table.columns], schema=table.schema
    )


def write_new_buckets(
    blob: Blob, task: FileTask, olds: Sequence[ColumnarState], new_buckets: Sequence[int],
    buckets: int,
) -> list[NewBucket]:
    """Write the states of ``new_buckets`` (of ``buckets``) cut from ``olds`` (the old
    buckets of the same residue, as of ``task.ts``) as checkpoints as of ``task.ts``;
    see the module docstring. The buckets are written concurrently (a store's writes are
    latency-bound); on a failure the blobs already written are deleted."""
    write = _typed(blob, task, olds, buckets) if typed_bases(task) else _columnar(
        blob, task, olds, buckets)
    writer = current_writer_id()

    def run(bucket: int) -> NewBucket:
        with writing_as(writer):  # (a context variable: each thread sets its own)
            return write(bucket)

    written: list[NewBucket] = []
    failure: BaseException | None = None
    with ThreadPoolExecutor(max_workers=WRITE_THREADS) as pool:
        for future in [pool.submit(run, bucket) for bucket in new_buckets]:
            try:
                written.append(future.result())
            except BaseException as exc:  # noqa: BLE001 - re-raised below, once all ended
                failure = failure or exc
    if failure is not None:
        for new in written:
            for key in new.new_blobs:
                blob.delete(key)
        raise failure
    return written


def _bucket_index(hi: np.ndarray, lo: np.ndarray, buckets: int) -> dict[int, np.ndarray]:
    """For each new bucket present, the positions of its keys in ``(hi, lo)`` order."""
    ids = (hi % np.uint64(buckets)).astype(np.int64)
    out: dict[int, np.ndarray] = {}
    for bucket in np.unique(ids).tolist():
        where = np.flatnonzero(ids == bucket)
        out[int(bucket)] = where[np.lexsort((lo[where], hi[where]))]
    return out


def _typed(
    blob: Blob, task: FileTask, olds: Sequence[ColumnarState], buckets: int,
) -> Callable[[int], NewBucket]:
    """The writer of one new bucket's typed base, its values gathered from ``olds``'."""
    schema = SourceSchema.from_json(task.schema_json)
    cut = [state_values(state, schema) for state in olds]
    hi = np.concatenate([c[0] for c in cut])
    lo = np.concatenate([c[1] for c in cut])
    values = pa.concat_tables([c[2] for c in cut])
    index = _bucket_index(hi, lo, buckets)

    def write(bucket: int) -> NewBucket:
        at = index.get(bucket)
        if at is None or not len(at):
            return NewBucket(bucket, "", Base(task.ts).encode())
        key, size = write_typed_base_values(
            blob, task.shard_id, bucket, buckets, task.ts, hi[at], lo[at], _take(values, at)
        )
        return NewBucket(
            bucket, key, Base(task.ts, 0, len(at), size).encode(), keys=len(at),
            live_rows=len(at), bytes_written=size, new_blobs=[key],
        )

    return write


def _columnar(
    blob: Blob, task: FileTask, olds: Sequence[ColumnarState], buckets: int,
) -> Callable[[int], NewBucket]:
    """The writer of one new bucket's columnar checkpoint (and, global scope, its
    tombstone set), its keys, rows and orders cut from ``olds``."""
    folded = [fold(state) for state in olds]
    hi = np.concatenate([s.hi for s in folded])
    lo = np.concatenate([s.lo for s in folded])
    rows = pa.concat_arrays([as_row_array(s.rows).cast(ROW_TYPE) for s in folded])
    keeps = task.scope is OrderScope.GLOBAL
    orders = concat_orders([s.orders for s in folded if s.orders is not None]) if keeps \
        else None
    index = _bucket_index(hi, lo, buckets)

    def write(bucket: int) -> NewBucket:
        at = index.get(bucket, np.zeros(0, np.int64))
        state = ColumnarState.checked(
            hi[at], lo[at], rows.take(pa.array(at, pa.int64())),
            None if orders is None else orders[at],
        )
        new = NewBucket(bucket, "", Base(task.ts).encode(), keys=len(at))
        new.live_rows = len(at) - (state.rows.null_count if keeps else 0)
        try:
            if keeps:
                key, size = write_tombstones(
                    blob, task.shard_id, bucket, buckets, task.ts, state)
                new.tombstones = key
                if key:
                    new.new_blobs.append(key)
                    new.bytes_written += size
            if len(at):
                key, size = write_checkpoint(
                    blob, task.shard_id, bucket, buckets, task.scope, task.ts, state
                )
                new.checkpoint, new.base = key, Base(task.ts, 0, len(at), size).encode()
                new.new_blobs.append(key)
                new.bytes_written += size
        except BaseException:
            for key in new.new_blobs:
                blob.delete(key)
            raise
        return new

    return write


__all__ = ["NewBucket", "typed_bases", "write_new_buckets"]
