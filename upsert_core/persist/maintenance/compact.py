"""Size-tiered compaction: merge adjacent batches so their number stays logarithmic.

Policy: walking from the oldest batch, a batch should hold at least twice the updates
of the batch after it. Where it does not, that batch and its successor (and further
successors while the merged size still would not be twice the next one) are merged
into one batch. Once no such pair remains, sizes at least halve from batch to batch,
so a shard with N updates has at most about log2(N) + 1 batches, and each update is
rewritten O(log N) times over the shard's life (the binary-counter argument). A
backlog (many batches since the last pass: a run of many small files) is brought to
the tiers those pairwise merges would end with in one merge per tier
(:func:`plan_backlog`), not one merge per step.

Invariants:

- A merged batch covers ``[first.lower, last.upper)``; its updates are those of the
  merged batches with ``ts`` advanced to the compaction frontier (the shard's since,
  lowered to any leased reader's since) and consolidated. Every read at a time at or
  after the frontier therefore sees exactly the same contents.
- Bucket-preserving: when every part of the run is typed and labelled with a bucket of
  one N (``parts``: the ingest writes them so), or the caller passes a
  :class:`PartTyper` (which decodes plain parts' rows and buckets unlabelled keys;
  labels of another N, value columns that disagree or rows that do not decode still
  leave the run plain), the
  run is merged bucket by bucket and each bucket's result is written as typed parts with
  that bucket's label, so a compacted shard keeps (or gains) the layout ``typed_read``
  reads without a merge. A plain part whose rows do not decode leaves the run plain.
  Each bucket of the run is held in memory while it is merged (as the ingest holds a
  bucket's state), up to :data:`MAX_MERGE_THREADS` buckets at once, one per core;
  the parts come out in bucket order whatever thread wrote them; unlabelled parts
  (older shards) are read once and held split by bucket, up to
  :data:`UNLABELLED_TYPED_MAX_ROWS` updates (beyond that the run is merged plain).
  Any other run streams (``read.merge_sorted``) into plain parts, memory bounded by
  about (number of input parts x batch size) plus one output part.
- The new batch replaces exactly the merged batches in ONE transition, and only if
  they are all still present unchanged; otherwise the transition changes nothing.
- The new parts are deleted after a failed commit only when re-read states PROVE that
  no state references them: every seqno at which a state holding them was proposed
  is now taken by a state that does not reference them (a taken seqno never changes,
  so that proposal can never land later). Anything less (an error, a seqno not
  visible yet, one truncated away) leaves them to GC's leaked-blob sweep, which only
  deletes blobs no live state references. Deleting on a mistaken "not committed"
  would break the current state; leaking only costs space until the next sweep.
- Old parts are never deleted here: older live states may still reference them; GC
  deletes blobs once no live state does.
- With a ``writer_id`` (every production caller: GC and ``Shard.compact`` register one),
  the new parts name that writer and the replace transition requires it to be
  registered (``persist.write.writers``), so a compactor stalled past its lease, whose parts
  GC may have deleted, can never commit them. Without one the parts are unnamed and
  GC's grace period protects them (kept for callers that write no other blobs).
"""

from __future__ import annotations

import contextvars
import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from upsert_core.errors import InvalidUsage, UpsertPlatformError
from upsert_core.persist.keys import part_key, writing_as
from upsert_core.persist.location import Blob
from upsert_core.persist.read.read import Transform, consolidated, part_sources
from upsert_core.persist.state.machine import Machine
from upsert_core.persist.state.state import BlobPart, HollowBatch, InlinePart, Part, ShardState
from upsert_core.persist.write.buckets import bucket_of_keys
from upsert_core.persist.write.consolidate import UPDATE_SCHEMA, advance_ts, consolidate
from upsert_core.persist.write.parts import (
    DEFAULT_BATCH_ROWS,
    DEFAULT_INLINE_THRESHOLD,
    DEFAULT_PART_ROWS,
    DEFAULT_ROW_GROUP_ROWS,
    VALUE_PREFIX,
    OpenPart,
    delete_parts,
    value_table,
    write_parts,
)
from upsert_core.persist.write.writers import require_new_references_registered, require_registered

log = logging.getLogger(__name__)


class PartTyper(Protocol):
    """What compaction needs to write typed parts from plain ones: the shard's bucket
    count and a decoder of encoded rows into its value columns (the ingest's schema; see
    ``ingest.part_typer``). Persist itself knows neither."""

    @property
    def buckets(self) -> int: ...

    @property
    def fields(self) -> list[pa.Field]:
        """The value columns, in order (the shard's current columns)."""
        ...

    def values(self, rows: pa.Array | pa.ChunkedArray) -> pa.Table:
        """``rows`` decoded: one column per field, row ``i`` from ``rows[i]``."""
        ...

    @property
    def values_only(self) -> bool:
        """Whether typed parts are written in format 3 (rows stored once, as values)."""
        ...

DEFAULT_MAX_BATCHES_PER_MERGE = 8
MAX_MERGE_THREADS = 4
"""At most this many buckets of a run are merged at once (see :func:`merge_threads`)."""
MAX_BACKLOG_FAN_IN = 64
"""At most this many batches are merged at once by :func:`plan_backlog`."""
MAX_FAILED_COMMITS = 3


# --- policy -----------------------------------------------------------------------------


def batch_weight(batch: HollowBatch) -> int:
    """A batch's size for the policy; empty batches weigh 1 so they merge too."""
    return max(batch.num_updates, 1)


def plan_merge(
    batches: Sequence[HollowBatch],
    *,
    max_batches_per_merge: int = DEFAULT_MAX_BATCHES_PER_MERGE,
) -> tuple[int, int] | None:
    """The first run ``batches[start:end]`` to merge, or ``None`` when tiers hold."""
    if max_batches_per_merge < 2:
        raise InvalidUsage(f"max_batches_per_merge must be >= 2, got {max_batches_per_merge}")
    return _first_run([batch_weight(b) for b in batches], 0, max_batches_per_merge)


def _first_run(weights: Sequence[int], begin: int, max_batches_per_merge: int
               ) -> tuple[int, int] | None:
    """:func:`plan_merge` on batches of ``weights``, given that every pair before
    ``begin`` holds (each at least twice its successor)."""
    for i in range(begin, len(weights) - 1):
        if weights[i] >= 2 * weights[i + 1]:
            continue
        end = i + 2
        total = weights[i] + weights[i + 1]
        while (
            end < len(weights)
            and end - i < max_batches_per_merge
            and total < 2 * weights[end]
        ):
            total += weights[end]
            end += 1
        return i, end
    return None


def plan_backlog(
    batches: Sequence[HollowBatch],
    *,
    max_batches_per_merge: int = DEFAULT_MAX_BATCHES_PER_MERGE,
    max_fan_in: int = MAX_BACKLOG_FAN_IN,
) -> tuple[int, int] | None:
    """The first run ``batches[start:end]`` to merge, merged in one pass where
    :func:`plan_merge` would reach it in several, or ``None`` when tiers hold.

    :func:`plan_merge`'s merges are simulated on the batches' weights until the tiers
    hold; each group of batches the simulation ends with is one merge here (a backlog
    of 100 one-file batches took 95 merges pairwise, each a read, a write and a commit:
    now a handful). Merging a group at once writes what the pairwise merges would have
    written last, so the result holds the same updates; its weight may be smaller
    (consolidation), and the caller plans again after each merge until this returns
    None, which is exactly when :func:`plan_merge` does. A group of more than
    ``max_fan_in`` batches is merged ``max_fan_in`` at a time (from its oldest)."""
    if max_fan_in < 2:
        raise InvalidUsage(f"max_fan_in must be >= 2, got {max_fan_in}")
    if max_batches_per_merge < 2:
        raise InvalidUsage(f"max_batches_per_merge must be >= 2, got {max_batches_per_merge}")
    groups = [(i, i + 1) for i in range(len(batches))]
    weights = [batch_weight(b) for b in batches]
    # SUBTLE: a merge at ``start`` changes only the pair (start - 1, start); every pair
    # before it held and still holds, so the next step is searched from there. Searching
    # from the first batch each time was quadratic in the backlog (5000 one-file
    # batches: 95 s of planning).
    scan = 0
    while (step := _first_run(weights, scan, max_batches_per_merge)) is not None:
        start, end = step
        groups[start:end] = [(groups[start][0], groups[end - 1][1])]
        weights[start:end] = [sum(weights[start:end])]
        scan = max(0, start - 1)
    for start, end in groups:
        if end - start > 1:
            return start, min(end, start + max_fan_in)
    return None


def compaction_frontier(state: ShardState) -> int:
    """The time updates may be advanced to: the since, lowered to any reader's since."""
    return min([state.since, *(r.since for r in state.leased_readers.values())])


def has_work(
    state: ShardState,
    *,
    merge_all: bool = False,
    max_batches_per_merge: int = DEFAULT_MAX_BATCHES_PER_MERGE,
) -> bool:
    """Whether :func:`compact` on ``state`` would merge anything (so a caller registers a
    writer only when it will write)."""
    if merge_all:
        batches = state.batches
        target = compaction_frontier(state)
        return len(batches) > 1 or (len(batches) == 1 and batches[0].since < target)
    return plan_merge(state.batches, max_batches_per_merge=max_batches_per_merge) is not None


# --- merging ----------------------------------------------------------------------------


class _PartWriter:
    """Writes a sorted stream of updates as parts of at most about ``part_rows`` rows."""

    def __init__(self, blob: Blob, shard: str, part_rows: int, inline_threshold: int) -> None:
        self._blob = blob
        self._shard = shard
        self._part_rows = max(1, part_rows)
        self._inline_threshold = inline_threshold
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._sink: pa.BufferOutputStream | None = None
        self._writer: pq.ParquetWriter | None = None
        self._part_rows_written = 0
        self.parts: list[Part] = []

    def add(self, table: pa.Table) -> None:
        self._pending.append(table)
        self._pending_rows += table.num_rows
        if self._pending_rows >= min(DEFAULT_ROW_GROUP_ROWS, self._part_rows):
            self._write_pending()

    def _write_pending(self) -> None:
        if not self._pending_rows:
            return
        table = pa.concat_tables(self._pending)
        self._pending, self._pending_rows = [], 0
        while table.num_rows:
            if self._writer is None:
                self._sink = pa.BufferOutputStream()
                self._writer = pq.ParquetWriter(self._sink, UPDATE_SCHEMA)
                self._part_rows_written = 0
            room = self._part_rows - self._part_rows_written
            piece, table = table.slice(0, room), table.slice(room)
            self._writer.write_table(piece, row_group_size=DEFAULT_ROW_GROUP_ROWS)
            self._part_rows_written += piece.num_rows
            if self._part_rows_written >= self._part_rows:
                self._close_part()

    def _close_part(self) -> None:
        if self._writer is None or self._sink is None:
            return
        self._writer.close()
        data = self._sink.getvalue().to_pybytes()
        rows = self._part_rows_written
        self._writer, self._sink = None, None
        if len(data) <= self._inline_threshold:
            self.parts.append(InlinePart(data=data, num_updates=rows))
        else:
            key = part_key(self._shard)
            self._blob.set(key, data)
            self.parts.append(BlobPart(key=key, encoded_size_bytes=len(data), num_updates=rows))

    def finish(self) -> tuple[Part, ...]:
        self._write_pending()
        self._close_part()
        return tuple(self.parts)


def merge_batches(
    blob: Blob,
    shard: str,
    batches: Sequence[HollowBatch],
    since: int,
    *,
    inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
    part_rows: int = DEFAULT_PART_ROWS,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    writer_id: str | None = None,
    typer: PartTyper | None = None,
) -> HollowBatch:
    """Write the consolidated union of adjacent ``batches``, ts advanced to ``since``,
    as parts named after ``writer_id``. With a ``typer`` the output is typed and
    bucket-labelled even where the input was not (see the module docstring).

    Streams: parts are merged record batch by record batch and written as they fill.
    The result is referenced by no state yet; commit it with :func:`commit_merge`.
    """
    if not batches:
        raise InvalidUsage("merge_batches needs at least one batch")
    for before, after in zip(batches, batches[1:], strict=False):
        if before.upper != after.lower:
            raise InvalidUsage(
                f"batches [{before.lower}, {before.upper}) and [{after.lower}, {after.upper})"
                " are not adjacent"
            )

    with writing_as(writer_id):
        by_bucket = _merge_by_bucket(
            blob, shard, batches, since, inline_threshold=inline_threshold,
            part_rows=part_rows, typer=typer,
        )
    if by_bucket is not None:
        return HollowBatch(
            lower=batches[0].lower, upper=batches[-1].upper, since=since, parts=by_bucket
        )

    def transform_for(_: HollowBatch) -> Transform:
        return lambda table: advance_ts(table, since)

    sources = part_sources(blob, shard, batches, transform_for, batch_rows=batch_rows)
    writer = _PartWriter(blob, shard, part_rows, inline_threshold)
    try:
        with writing_as(writer_id):
            for table in consolidated(sources, batch_rows=batch_rows):
                writer.add(table)
            parts = writer.finish()
    except BaseException:
        delete_parts(blob, writer.parts)  # referenced by nothing yet
        raise
    return HollowBatch(lower=batches[0].lower, upper=batches[-1].upper, since=since, parts=parts)


def extending_fields(candidates: Sequence[Sequence[pa.Field]]) -> list[pa.Field] | None:
    """The longest of ``candidates`` when it extends every other one (columns are only
    ever appended), else None."""
    longest = max(candidates, key=len)
    if any(tuple(c) != tuple(longest[: len(c)]) for c in candidates):
        return None
    return list(longest)


def _with_values(updates: pa.Table, values: pa.Table) -> pa.Table:
    """``updates`` with ``values`` appended as value columns."""
    return pa.Table.from_arrays(
        [*updates.columns, *values.columns],
        schema=pa.schema([*UPDATE_SCHEMA, *(pa.field(VALUE_PREFIX + f.name, f.type)
                                            for f in values.schema)]),
    )


class _Untypeable(Exception):  # noqa: N818 - internal signal, never escapes this module
    """A plain part's rows do not decode: the run is merged plain instead."""


UNLABELLED_TYPED_MAX_ROWS = 8 * 1024 * 1024
"""A typer merge holds a run's unlabelled parts whole (each is read once and split by
bucket); a run with more unlabelled updates than this is merged plain instead."""


def _plan_buckets(
    opened: Sequence[OpenPart], typer: PartTyper | None
) -> tuple[int, list[pa.Field]] | None:
    """``(N, value fields)`` of a bucket-preserving merge of ``opened``, or None when the
    run cannot be written typed: labels of different N (or not the typer's), parts
    without labels or values and no typer, value columns that disagree, or more
    unlabelled updates than :data:`UNLABELLED_TYPED_MAX_ROWS`."""
    counts = {p.layout.bucket[1] for p in opened if p.layout.bucket is not None}
    if typer is None:
        if any(p.layout.bucket is None or not p.layout.values for p in opened):
            return None
        fields = extending_fields([p.layout.values for p in opened])
        return None if fields is None or len(counts) != 1 else (counts.pop(), fields)
    if counts - {typer.buckets}:
        return None
    unlabelled = sum(p.metadata.num_rows for p in opened if p.layout.bucket is None)
    if unlabelled > UNLABELLED_TYPED_MAX_ROWS:
        return None
    # The typer's columns, or a part's if an ingest added columns after the typer was
    # made (columns are only appended, so one list must extend all the others).
    fields = extending_fields([typer.fields, *(p.layout.values for p in opened)])
    return None if fields is None else (typer.buckets, fields)


def _typed_rows(part: OpenPart, fields: list[pa.Field], typer: PartTyper | None) -> pa.Table:
    """The whole part with every value column (decoded by the typer where it has none)."""
    if part.layout.values or typer is None:
        stored = [VALUE_PREFIX + v.name for v in part.layout.values]
        table = part.read_whole([*part.update_columns, *stored])
        return _with_values(table.select(part.update_columns), value_table(table, fields))
    updates = part.read_whole()
    try:
        values = typer.values(updates.column("row"))
    except UpsertPlatformError as exc:
        raise _Untypeable(f"{part.where}: {exc}") from exc
    return _with_values(updates, value_table(values, fields, prefix=""))


def _split_unlabelled(
    opened: Sequence[OpenPart], buckets: int, fields: list[pa.Field],
    typer: PartTyper | None,
) -> dict[int, list[pa.Table]]:
    """The unlabelled parts' updates by bucket, each part read and decoded once."""
    pieces: dict[int, list[pa.Table]] = {}
    for part in opened:
        if part.layout.bucket is not None:
            continue
        table = _typed_rows(part, fields, typer)
        ids = bucket_of_keys(table.column("key"), buckets)
        for bucket in np.unique(ids).tolist():
            pieces.setdefault(int(bucket), []).append(table.filter(pa.array(ids == bucket)))
    return pieces


def merge_threads(buckets: int) -> int:
    """Buckets merged at once: each is read, sorted and written on its own thread (the
    Parquet decode and encode and the sort release the GIL), at most
    :data:`MAX_MERGE_THREADS` and one per core, since each holds its bucket's run."""
    return max(1, min(buckets, os.cpu_count() or 1, MAX_MERGE_THREADS))


def _each_bucket(
    merge: Callable[[int, list[pa.Table]], list[Part]],
    jobs: Sequence[tuple[int, list[pa.Table]]],
    written: list[Part],
) -> None:
    """Run ``merge`` on every job, :func:`merge_threads` at a time, and extend
    ``written`` with their parts in the jobs' order. Every job has finished when this
    returns or raises, and ``written`` then holds the parts of every job that
    succeeded (so the caller can delete them after a failure); the first failure, in
    job order, is raised.

    SUBTLE: each job runs in a copy of the caller's context: the writer the parts must
    name (``keys.writing_as``) is a context variable, which a pool's threads do not
    inherit; a part naming no writer is a legacy blob to GC, deleted after its grace
    period even while the compaction may still commit it."""
    threads = merge_threads(len(jobs))
    if threads <= 1:
        for bucket, extra in jobs:
            written.extend(merge(bucket, extra))
        return
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="compact") as pool:
        futures = [pool.submit(contextvars.copy_context().run, merge, bucket, extra)
                   for bucket, extra in jobs]
        wait(futures)
    failure: BaseException | None = None
    for future in futures:
        error = future.exception()
        if error is None:
            written.extend(future.result())
        elif failure is None:
            failure = error
    if failure is not None:
        raise failure


def _merge_by_bucket(
    blob: Blob, shard: str, batches: Sequence[HollowBatch], since: int, *,
    inline_threshold: int, part_rows: int, typer: PartTyper | None = None,
) -> tuple[Part, ...] | None:
    """The bucket-preserving merge (see the module docstring), or None when the run's
    parts cannot be written typed (the caller then streams)."""
    opened: list[OpenPart] = []
    written: list[Part] = []
    try:
        for batch in batches:
            for stored in batch.parts:
                if stored.num_updates:
                    opened.append(OpenPart(blob, stored, shard=shard))
        planned = _plan_buckets(opened, typer) if opened else None
        if planned is None:
            return None
        buckets, fields = planned
        # Format 3 when the ingest writes it, or (no typer) when the run already holds it:
        # the shard's readers read it then, and the rows are stored once.
        values_only = typer.values_only if typer is not None else any(
            p.layout.derived_rows for p in opened
        )
        unlabelled = _split_unlabelled(opened, buckets, fields, typer)
        labelled: dict[int, list[OpenPart]] = {}
        for reader in opened:
            if reader.layout.bucket is not None:
                labelled.setdefault(reader.layout.bucket[0], []).append(reader)
        width = len(UPDATE_SCHEMA)

        def merge_bucket(bucket: int, extra: list[pa.Table]) -> list[Part]:
            pieces = [_typed_rows(p, fields, typer) for p in labelled.get(bucket, [])]
            merged = consolidate(advance_ts(pa.concat_tables([*pieces, *extra]), since))
            if not merged.num_rows:
                return []
            values = merged.select(list(range(width, merged.num_columns)))
            values = values.rename_columns([f.name for f in fields])
            return list(write_parts(
                blob, shard, merged.select(UPDATE_SCHEMA.names), values=values,
                bucket=(bucket, buckets), values_only=values_only,
                presorted=True, inline_threshold=inline_threshold, part_rows=part_rows,
            ))

        order = sorted(labelled.keys() | unlabelled.keys())
        jobs = [(bucket, unlabelled.pop(bucket, [])) for bucket in order]
        _each_bucket(merge_bucket, jobs, written)
        return tuple(written)
    except _Untypeable as exc:
        delete_parts(blob, written)
        log.warning("shard %s: compacting without typing: %s", shard, exc)
        return None
    except BaseException:
        delete_parts(blob, written)  # referenced by nothing yet
        raise
    finally:
        for reader in opened:
            reader.close()


def commit_merge(
    machine: Machine,
    blob: Blob,
    replaced: Sequence[HollowBatch],
    merged: HollowBatch,
    writer_id: str | None = None,
) -> tuple[bool, ShardState]:
    """Replace ``replaced`` by ``merged`` iff they are still present, unchanged.

    Returns (committed, current state). When not committed, ``merged``'s parts are
    deleted if no state provably references them, else left for GC.
    """
    run = tuple(replaced)
    proposed: list[int] = []  # seqnos at which a state holding ``merged`` was proposed

    def replace(state: ShardState) -> ShardState | None:
        for start, batch in enumerate(state.batches):
            if batch == run[0]:
                if state.batches[start : start + len(run)] != run:
                    return None
                if writer_id is not None:
                    require_registered(state, writer_id)  # raises WriterFenced
                batches = (*state.batches[:start], merged, *state.batches[start + len(run) :])
                replaced_state = state.evolve(batches=batches)
                require_new_references_registered(state, replaced_state)
                proposed.append(state.seqno + 1)
                return replaced_state
        return None

    # SUBTLE: if apply raises (e.g. an indeterminate store error) the new parts may or
    # may not be referenced now; they are left for GC, which only deletes unreferenced
    # blobs.
    state = machine.apply(replace)
    # Judged by the state, not by which answer ``replace`` gave last: if an earlier
    # proposal landed unnoticed, ``replace`` finds the run gone and answers "no change".
    committed = merged in state.batches
    keys = {p.key for p in merged.parts if isinstance(p, BlobPart)}
    if not committed and provably_unreferenced(machine, keys, proposed):
        delete_parts(blob, merged.parts)
    return committed, state


def provably_unreferenced(machine: Machine, keys: set[str], proposed: list[int]) -> bool:
    """Whether no state references any of the blob ``keys``, now or ever, when the only
    states that ever held them were proposed at the seqnos ``proposed`` (see the module
    docstring). False whenever in doubt."""
    if not keys or not proposed:
        return True  # nothing to delete, or no state holding them was ever proposed
    pending = set(proposed)
    try:
        for state in machine.versions.fetch_all_live_states():
            if state.seqno < min(proposed):
                continue
            if not keys.isdisjoint(state.referenced_blob_keys()):
                return False
            pending.discard(state.seqno)
    except UpsertPlatformError as exc:
        log.info("shard %s: leaving written blobs to GC: %s", machine.shard_id, exc)
        return False
    if pending:
        # Not visible (yet) or truncated away: a proposal there may still land, or
        # may have landed; GC's sweep decides later, from the live states.
        log.info("shard %s: leaving written blobs to GC: seqnos %s not settled",
                 machine.shard_id, sorted(pending))
        return False
    return True


# --- the driver -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """What :func:`compact` did: merges committed and batch counts before and after."""

    merges: int
    failed_commits: int
    batches_before: int
    batches_after: int
    state: ShardState


def compact(
    machine: Machine,
    blob: Blob,
    *,
    since: int | None = None,
    max_batches_per_merge: int = DEFAULT_MAX_BATCHES_PER_MERGE,
    max_merges: int | None = None,
    merge_all: bool = False,
    inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
    part_rows: int = DEFAULT_PART_ROWS,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    writer_id: str | None = None,
    typer: PartTyper | None = None,
) -> CompactionResult:
    """Merge batches until the size tiers hold (or ``max_merges`` merges were done).

    ``since``: advance updates to this time instead of the compaction frontier; it must
    not exceed it. ``merge_all``: merge every batch into one (e.g. after ``gc --retain``
    advanced the since), in one streaming pass, then continue by the tiers. ``typer``:
    write typed, labelled parts even from plain ones (see :class:`PartTyper`).
    """
    state = machine.state()
    before = len(state.batches)
    merges = failed = 0
    while max_merges is None or merges < max_merges:
        frontier = compaction_frontier(state)
        if since is not None and since > frontier:
            raise InvalidUsage(
                f"shard {state.shard_id}: cannot compact to {since}: beyond the compaction"
                f" frontier {frontier} (the since, lowered to leased readers' sinces)"
            )
        target = frontier if since is None else since
        if merge_all:
            batches = state.batches
            rewrite = len(batches) > 1 or (len(batches) == 1 and batches[0].since < target)
            plan = (0, len(batches)) if rewrite else None
        else:
            plan = plan_backlog(state.batches, max_batches_per_merge=max_batches_per_merge)
        if plan is None:
            break
        run = state.batches[plan[0] : plan[1]]
        merged = merge_batches(
            blob, state.shard_id, run, target, inline_threshold=inline_threshold,
            part_rows=part_rows, batch_rows=batch_rows, writer_id=writer_id, typer=typer,
        )
        committed, state = commit_merge(machine, blob, run, merged, writer_id)
        if committed:
            merges += 1
            merge_all = False
        else:
            failed += 1
            if failed >= MAX_FAILED_COMMITS:
                break
    return CompactionResult(
        merges=merges,
        failed_commits=failed,
        batches_before=before,
        batches_after=len(state.batches),
        state=state,
    )
