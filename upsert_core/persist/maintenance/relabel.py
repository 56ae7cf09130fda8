"""Relabelling: a shard's bucket-labelled parts rewritten for another bucket count.

The key-to-bucket map (``persist.write.buckets``) has one parameter, the bucket count, and a
part labelled ``b/N`` promises that every key in it lies in bucket ``b`` of ``N``
(``parts``). Changing a shard's bucket count from ``N`` to ``M`` (``ingest.rebucket``)
rewrites every labelled part of every batch the shard holds as parts labelled for
``M``, and commits the new spine in one transition, so that every state of the shard
is labelled with one count, as every reader, checker and compactor expects. This module
does the rewriting and the commit; it knows nothing of the ingest, which adds its own
config entries (bucket count, checkpoints) to the same transition.

Invariants:

- :func:`relabel_batch` returns a batch with the same ``lower``, ``upper`` and ``since``
  holding exactly the same updates ``(key, row, ts, diff)`` as a multiset: nothing is
  consolidated and no time is advanced, so every read at every time answers as it did.
- In the result, each part that carried a label of another count is replaced by parts
  labelled ``b'/M``, each holding exactly that part's keys of bucket ``b'`` of ``M``
  (merged with the keys of bucket ``b'`` from the batch's other parts). Parts without
  a label (they claim no bucket) and parts already labelled for ``M`` are kept as the
  same ``Part`` values. A batch with nothing to relabel is returned itself.
- What the old parts stored is kept: their value columns (aligned to the longest list
  when parts merge, as compaction aligns them: columns are only ever appended) and
  their format (values-only parts stay values-only, parts that store the encoded row
  keep storing it; where both merge the result is values-only, as compaction decides).
  Parts without value columns, or whose columns cannot be aligned, are rewritten apart.
- The new parts of a residue are written on :data:`WRITE_THREADS` threads, each naming
  the caller's writer (``keys.writing_as``); a failure deletes every one written.
- Memory: a new bucket's keys come only from the old buckets of its residue modulo
  ``g = gcd(N, M)``, so the old parts are read one residue at a time: about ``1/g`` of
  the batch is held. Growing by a factor (4 -> 16) or shrinking by one (16 -> 4) holds
  a quarter; counts with no common factor hold the whole batch.
- :func:`commit_relayout` replaces the whole spine in ONE transition, and only if the
  shard's upper and batches are still exactly those planned on and the writer is still
  registered. The same transition applies config updates (``None`` deletes an entry)
  and removes the registration of every OTHER writer: the fence. A writer that planned
  on the old labels (an ingest) gets :class:`~upsert_core.errors.WriterFenced` at its
  next commit, nothing of it committed, and redoes its work on the new layout; GC may
  delete its blobs at once (``persist.write.writers``). Anything else changed meanwhile:
  nothing is committed, and the result says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
import pyarrow as pa

from upsert_core.persist.keys import current_writer_id, writing_as
from upsert_core.persist.location import Blob
from upsert_core.persist.maintenance.compact import extending_fields
from upsert_core.persist.state.machine import Machine
from upsert_core.persist.state.state import BlobPart, HollowBatch, Part, ShardState
from upsert_core.persist.write.buckets import bucket_of_keys
from upsert_core.persist.write.consolidate import UPDATE_SCHEMA
from upsert_core.persist.write.parts import (
    DEFAULT_INLINE_THRESHOLD,
    DEFAULT_PART_ROWS,
    VALUE_PREFIX,
    OpenPart,
    delete_parts,
    value_table,
    write_parts,
)
from upsert_core.persist.write.writers import refresh_in, require_new_references_registered

WRITE_THREADS = 8
"""New parts written at once (as typed reads open parts: latency-bound on S3)."""


@dataclass
class RelabelStats:
    """What relabelling read and wrote (summed over the batches it was given)."""

    parts_read: int = 0
    bytes_read: int = 0
    updates: int = 0
    parts_written: int = 0
    bytes_written: int = 0
    new_blobs: list[str] = field(default_factory=list)
    """The blob keys of the parts written (referenced by no state until committed)."""


def relabel_batch(
    blob: Blob, shard: str, batch: HollowBatch, buckets: int, *,
    inline_threshold: int = DEFAULT_INLINE_THRESHOLD, part_rows: int = DEFAULT_PART_ROWS,
    stats: RelabelStats | None = None,
) -> HollowBatch:
    """``batch`` with every part labelled for another count rewritten for ``buckets``
    (see the module docstring). The new parts name the current writer
    (``keys.writing_as``); they are deleted again if the rewrite fails."""
    stats = stats if stats is not None else RelabelStats()
    opened: list[OpenPart] = []
    try:
        for part in batch.parts:
            opened.append(OpenPart(blob, part, shard=shard))
        moving = [
            i for i, o in enumerate(opened)
            if o.layout.bucket is not None and o.layout.bucket[1] != buckets
        ]
        if not moving:
            return batch
        counts = {opened[i].layout.bucket[1] for i in moving}  # type: ignore[index]
        g = math.gcd(buckets, *counts)
        written: list[tuple[int, Part]] = []
        try:
            for residue in range(g):
                members = [
                    opened[i] for i in moving
                    if opened[i].layout.bucket[0] % g == residue  # type: ignore[index]
                ]
                for group, fields in _groups(members):
                    written.extend(_rewrite(
                        blob, shard, group, fields, buckets, inline_threshold, part_rows,
                        stats,
                    ))
        except BaseException:
            delete_parts(blob, [p for _, p in written])  # referenced by nothing yet
            raise
    finally:
        for o in opened:
            o.close()
    for i in moving:
        stats.parts_read += 1
        stats.bytes_read += batch.parts[i].encoded_size_bytes
        stats.updates += batch.parts[i].num_updates
    moved = set(moving)
    kept = [p for i, p in enumerate(batch.parts) if i not in moved]
    written.sort(key=lambda item: item[0])
    parts = (*kept, *(p for _, p in written))
    for _, part in written:
        stats.parts_written += 1
        stats.bytes_written += part.encoded_size_bytes
        if isinstance(part, BlobPart):
            stats.new_blobs.append(part.key)
    return HollowBatch(lower=batch.lower, upper=batch.upper, since=batch.since, parts=parts)


def _groups(
    members: Sequence[OpenPart],
) -> list[tuple[list[OpenPart], list[pa.Field] | None]]:
    """``members`` in groups that can be written together, each with its value fields
    (None: no value columns): all of them when every one has value columns and one
    list extends the others, else one group per distinct layout."""
    if not members:
        return []
    if all(m.layout.values for m in members):
        fields = extending_fields([m.layout.values for m in members])
        if fields is not None:
            return [(list(members), fields)]
    groups: dict[tuple[tuple[pa.Field, ...], bool], list[OpenPart]] = {}
    for m in members:
        groups.setdefault((m.layout.values, m.layout.derived_rows), []).append(m)
    return [(group, list(values) or None) for (values, _), group in groups.items()]


def _rewrite(
    blob: Blob, shard: str, group: Sequence[OpenPart], fields: list[pa.Field] | None,
    buckets: int, inline_threshold: int, part_rows: int, stats: RelabelStats,
) -> list[tuple[int, Part]]:
    """The updates of ``group`` written as parts labelled for ``buckets``:
    ``(new bucket, part)`` pairs."""
    names = UPDATE_SCHEMA.names
    updates: list[pa.Table] = []
    values: list[pa.Table] = []
    for member in group:
        stored = [VALUE_PREFIX + v.name for v in member.layout.values] if fields else []
        table = member.read_whole([*names, *stored])  # format 3: rows computed
        updates.append(table.select(names))
        if fields is not None:
            values.append(value_table(table, fields))
    merged = pa.concat_tables(updates) if len(updates) > 1 else updates[0]
    merged_values = None
    if fields is not None:
        merged_values = pa.concat_tables(values) if len(values) > 1 else values[0]
    # Values-only when any part was (as compaction decides): the values are every row
    # column, decoded from the rows, so nothing is lost by not storing the rows.
    values_only = fields is not None and any(m.layout.derived_rows for m in group)
    ids = bucket_of_keys(merged.column("key"), buckets)
    order = np.argsort(ids, kind="stable")
    ordered = merged.take(pa.array(order, pa.int64()))
    ordered_values = None if merged_values is None else merged_values.take(
        pa.array(order, pa.int64()))
    sorted_ids = ids[order]
    found, starts = np.unique(sorted_ids, return_index=True)
    ends = [*starts[1:].tolist(), len(sorted_ids)]
    writer = current_writer_id()

    def write(bucket: int, start: int, end: int) -> list[tuple[int, Part]]:
        piece = ordered.slice(start, end - start)
        piece_values = None if ordered_values is None else ordered_values.slice(
            start, end - start)
        with writing_as(writer):  # (a context variable: each thread sets its own)
            return [(bucket, part) for part in write_parts(
                blob, shard, piece, values=piece_values, bucket=(bucket, buckets),
                values_only=values_only, inline_threshold=inline_threshold,
                part_rows=part_rows,
                # One sorted part filtered stays sorted; pieces of several need a sort.
                presorted=len(group) == 1,
            )]

    out: list[tuple[int, Part]] = []
    # The new buckets' parts are written concurrently: a store's writes are latency-bound
    # (an S3 PUT, a local write's fsyncs), and encoding releases the GIL.
    with ThreadPoolExecutor(max_workers=WRITE_THREADS) as pool:
        futures = [pool.submit(write, int(b), s, e)
                   for b, s, e in zip(found.tolist(), starts.tolist(), ends, strict=True)]
        failure: BaseException | None = None
        for future in futures:
            try:
                out.extend(future.result())
            except BaseException as exc:  # noqa: BLE001 - re-raised below, once all ended
                failure = failure or exc
    if failure is not None:
        delete_parts(blob, [p for _, p in out])
        raise failure
    return out


# --- committing -------------------------------------------------------------------------


@dataclass(frozen=True)
class Relayout:
    """A new layout of a shard planned at ``upper`` on the spine ``batches``: the
    ``relabelled`` batches (one for one) and the ``config_updates`` (``None`` deletes
    the entry) that commit together."""

    upper: int
    batches: tuple[HollowBatch, ...]
    relabelled: tuple[HollowBatch, ...]
    config_updates: Mapping[str, str | None]

    def __post_init__(self) -> None:
        if len(self.batches) != len(self.relabelled):
            raise ValueError("a relayout replaces the spine batch for batch")
        object.__setattr__(self, "config_updates", MappingProxyType(dict(self.config_updates)))

    def applied_in(self, state: ShardState) -> bool:
        """Whether ``state`` holds this layout (its batches and config entries)."""
        return state.batches == self.relabelled and all(
            state.config.get(name) == value for name, value in self.config_updates.items()
        )


@dataclass
class RelayoutResult:
    """The outcome of :func:`commit_relayout`: ``committed``, the current ``state``, and
    the seqnos at which a state holding the layout was proposed (for
    :func:`~upsert_core.persist.maintenance.compact.provably_unreferenced`)."""

    committed: bool
    state: ShardState
    proposed: list[int]


def commit_relayout(
    machine: Machine, layout: Relayout, *, writer_id: str, now_ms: Callable[[], int],
) -> RelayoutResult:
    """Commit ``layout`` iff the shard's upper and batches are still the planned ones;
    fence every other writer in the same transition (module docstring). Raises
    :class:`~upsert_core.errors.WriterFenced` when ``writer_id`` is not registered."""
    proposed: list[int] = []

    def relayout(state: ShardState) -> ShardState | None:
        if layout.applied_in(state):
            return None
        if state.upper != layout.upper or state.batches != layout.batches:
            return None
        refreshed = refresh_in(state, writer_id, now_ms())  # raises WriterFenced
        config = dict(state.config)
        for name, value in layout.config_updates.items():
            if value is None:
                config.pop(name, None)
            else:
                config[name] = value
        after = refreshed.evolve(
            batches=layout.relabelled, config=config,
            # SUBTLE: the fence. Every other writer planned on the old labels; without
            # its registration none of its commits (or blobs) can land any more.
            writers={writer_id: refreshed.writers[writer_id]},
        )
        require_new_references_registered(state, after)
        proposed.append(state.seqno + 1)
        return after

    state = machine.apply(relayout)
    return RelayoutResult(layout.applied_in(state), state, proposed)


__all__ = ["RelabelStats", "Relayout", "RelayoutResult", "commit_relayout", "relabel_batch"]
