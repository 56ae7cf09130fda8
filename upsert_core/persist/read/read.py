"""Consolidated reads of a shard: ``snapshot`` as of a time and ``changes`` in a range.

Reads stream: every relevant part is read row group by row group through a ranged
blob reader (``parts.OpenPart``) and the parts are merged by key (:func:`merge_sorted`),
so the data held at once is bounded by about (number of parts x 2 batches) plus the
row groups decoded ahead (at least one per part, in all about the number of prefetch
threads, :data:`MAX_PREFETCH_THREADS` at most), never the whole shard nor a whole part.
Decoding runs on a small thread pool (pyarrow and numpy release the GIL), so parts, and
row groups of one part, decode in parallel with each other and with the merge, whose
per-chunk work (ordering, consolidating, gathering) runs on the same pool one chunk
ahead. Compaction keeps the number of parts logarithmic in the shard's history.

Invariants:

- A read is allowed only inside ``[since, upper)``: ``snapshot(as_of)`` needs
  ``since <= as_of < upper``; ``changes(lower, upper)`` needs
  ``since <= lower <= upper <= shard upper``; ``changes_after(lower, upper)`` (catching
  up a collection known at upper ``lower``) needs ``since < lower`` (or ``since == 0``).
  Otherwise :class:`NotReadable` is raised
  at the call (not at the first ``next``) saying what is readable. A time that is not
  an integer (a float, a bool) is :class:`InvalidUsage`, never rounded.
- ``snapshot(as_of)``: every update with ``ts <= as_of``, times advanced to ``as_of``,
  consolidated; by default only rows with a positive multiplicity (``diff`` is kept so
  callers can check it is 1).
- ``changes(lower, upper)``: every update with ``lower <= ts' < upper`` where
  ``ts' = max(ts, since)``, consolidated per ``(key, row, ts')``. Updates from before
  ``since`` are indistinguishable and reported at ``since``, the same whether or not
  compaction already advanced them, so reads never depend on compaction.
- Output record batches are sorted by ``(key, row, ts)`` across the whole read, and
  each batch holds ALL the output rows of every key it covers (a key never straddles
  two batches), so a consumer may resume a read after the last key of a batch.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from upsert_core.errors import InvalidUsage, NotReadable
from upsert_core.persist.location import Blob
from upsert_core.persist.state.state import BlobPart, HollowBatch, Part, ShardState
from upsert_core.persist.write.consolidate import (
    UPDATE_SCHEMA,
    advance_ts,
    as_table,
    consolidate_in_order,
    merge_consolidate,
    merge_indices,
    with_constant_ts,
)
from upsert_core.persist.write.parts import (
    BUCKET_META,
    DEFAULT_BATCH_ROWS,
    OpenPart,
    format_bucket,
    parse_bucket,
)
from upsert_core.read_times import require_ts

Transform = Callable[[pa.Table], pa.Table]
"""Maps a sorted chunk of one part to a sorted chunk (filter rows, advance times)."""


# --- prefetching ---------------------------------------------------------------------

MAX_PREFETCH_THREADS = 4
"""Threads decoding parts ahead of the merge (at most one per part)."""

_END = object()


class _Ahead:
    """Iterates ``source`` with its next item always being computed in ``pool``.

    At most one call of ``next(source)`` is in flight, so ``source`` (a generator) is
    never run by two threads at once; its exceptions surface at the matching ``next``.
    """

    __slots__ = ("_source", "_pool", "_future")

    def __init__(self, source: Iterator[pa.Table], pool: ThreadPoolExecutor) -> None:
        self._source = source
        self._pool = pool
        self._future: Future[object] | None = pool.submit(next, source, _END)

    def __iter__(self) -> Iterator[pa.Table]:
        return self

    def __next__(self) -> pa.Table:
        if self._future is None:
            raise StopIteration
        future, self._future = self._future, None
        item = future.result()
        if item is _END:
            raise StopIteration
        self._future = self._pool.submit(next, self._source, _END)
        return item


class _GroupsAhead:
    """Iterates a :class:`PartSource` with up to ``depth`` of its row groups being
    decoded in ``pool`` at once, handed over in order."""

    __slots__ = ("_source", "_pool", "_depth", "_opening", "_groups", "_next_group",
                 "_pending", "_ready")

    def __init__(self, source: PartSource, pool: ThreadPoolExecutor, depth: int) -> None:
        self._source = source
        self._pool = pool
        self._depth = depth
        self._opening: Future[int] | None = pool.submit(source.open)
        self._groups = 0
        self._next_group = 0
        self._pending: deque[Future[list[pa.Table]]] = deque()
        self._ready: deque[pa.Table] = deque()

    def _submit(self) -> None:
        while len(self._pending) < self._depth and self._next_group < self._groups:
            self._pending.append(self._pool.submit(self._source.group, self._next_group))
            self._next_group += 1

    def __iter__(self) -> Iterator[pa.Table]:
        return self

    def __next__(self) -> pa.Table:
        if self._opening is not None:
            opening, self._opening = self._opening, None
            self._groups = opening.result()
            self._submit()
        while not self._ready:
            if not self._pending:
                raise StopIteration
            tables = self._pending.popleft().result()
            self._submit()
            self._ready.extend(tables)
        return self._ready.popleft()


@contextmanager
def _prefetched(
    sources: Sequence[Iterable[pa.Table | pa.RecordBatch]],
) -> Iterator[tuple[list[Iterator[pa.Table]], ThreadPoolExecutor]]:
    """``sources`` decoded ahead on a thread pool: a :class:`PartSource` up to a few row
    groups at once (more when there are fewer parts), any other iterable one item
    ahead. Yields them with the pool (for the merge's own work). On exit the pool is
    drained and every source is closed (closing readers).
    """
    threads = min(MAX_PREFETCH_THREADS, max(2, os.cpu_count() or 2))
    depth = max(1, -(-threads // max(1, len(sources))))  # ceil: keep every thread busy
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="part-read")
    iterators: list[Iterator[pa.Table | pa.RecordBatch]] = []
    try:
        ahead: list[Iterator[pa.Table]] = []
        for source in sources:
            if isinstance(source, PartSource):
                iterators.append(source)
                ahead.append(_GroupsAhead(source, pool, depth))
            else:
                iterator = iter(source)
                iterators.append(iterator)
                ahead.append(_Ahead(iterator, pool))
        yield ahead, pool
    finally:
        # Wait for in-flight work: a source may only be closed when no thread is
        # running it.
        pool.shutdown(wait=True, cancel_futures=True)
        for iterator in iterators:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()


def _mapped_ahead(
    pool: ThreadPoolExecutor, fn: Callable[[list[pa.Table]], pa.Table],
    items: Iterator[list[pa.Table]],
) -> Iterator[pa.Table]:
    """``fn`` of every item, in order, computed on ``pool`` with one item in flight while
    the caller works on the next (the merge overlaps with its own bookkeeping and with
    decoding)."""
    pending: deque[Future[pa.Table]] = deque()
    for item in items:
        pending.append(pool.submit(fn, item))
        if len(pending) > 1:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


# --- the streaming merge ------------------------------------------------------------


class _Cursor:
    """A buffered, key-sorted stream of updates from one part."""

    __slots__ = ("_source", "buf", "done")

    def __init__(self, source: Iterator[pa.Table | pa.RecordBatch]) -> None:
        self._source = source
        self.buf: pa.Table = UPDATE_SCHEMA.empty_table()
        self.done = False

    def _pull(self) -> pa.Table | None:
        for batch in self._source:
            table = as_table(batch)
            if table.num_rows:
                return table
        self.done = True
        return None

    def fill(self) -> None:
        """Make the buffer non-empty unless the source is exhausted."""
        if self.buf.num_rows == 0 and not self.done:
            pulled = self._pull()
            if pulled is not None:
                self.buf = pulled

    def extend(self) -> None:
        """Append the next non-empty batch of the source to the buffer."""
        pulled = self._pull()
        if pulled is not None:
            self.buf = pa.concat_tables([self.buf, pulled])

    def last_key(self) -> bytes:
        return self.buf.column("key")[self.buf.num_rows - 1].as_py()

    def take_below(self, cutoff: bytes | None) -> pa.Table | None:
        """Remove and return the buffered rows with key < cutoff (all when None)."""
        n = self.buf.num_rows if cutoff is None else _count_below(self.buf, cutoff)
        if n == 0:
            return None
        taken = self.buf.slice(0, n)
        self.buf = self.buf.slice(n)
        return taken


def _count_below(table: pa.Table, cutoff: bytes) -> int:
    """How many leading rows of key-sorted ``table`` have key < cutoff (binary search)."""
    keys = table.column("key")
    lo, hi = 0, table.num_rows
    while lo < hi:
        mid = (lo + hi) // 2
        if keys[mid].as_py() < cutoff:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _in_key_order(pieces: list[pa.Table]) -> tuple[pa.Table, bool]:
    """Concatenate pieces covering the same key range (zero-copy), ordered by first key,
    and say whether the result is sorted already (one piece, or disjoint key ranges)."""
    if len(pieces) == 1:
        return pieces[0], True
    firsts = [p.column("key")[0].as_py() for p in pieces]
    by_first = sorted(range(len(pieces)), key=firsts.__getitem__)
    ordered = [pieces[i] for i in by_first]
    # Chunked columns are fine here: the one gather that follows (a take) costs about
    # the same on chunks as on contiguous columns, and saves a copy.
    table = pa.concat_tables(ordered)
    lasts = [p.column("key")[p.num_rows - 1].as_py() for p in ordered]
    disjoint = all(lasts[i] < firsts[by_first[i + 1]] for i in range(len(ordered) - 1))
    return table, disjoint


def _merged(pieces: list[pa.Table]) -> pa.Table:
    """Pieces covering the same key range as one table sorted by ``(key, row, ts)``."""
    table, is_sorted = _in_key_order(pieces)
    return table if is_sorted else table.take(pa.array(merge_indices(table)))


def _merged_consolidated(pieces: list[pa.Table]) -> pa.Table:
    """Pieces covering the same key range, merged and consolidated."""
    table, is_sorted = _in_key_order(pieces)
    return consolidate_in_order(table, None) if is_sorted else merge_consolidate(table)


def _chunks(
    sources: Sequence[Iterable[pa.Table | pa.RecordBatch]],
) -> Iterator[list[pa.Table]]:
    """The streaming merge: chunks holding every row of the keys they cover, in
    increasing key ranges, each as its sorted pieces (one per source that has rows).

    The cutoff is the smallest last buffered key among sources that may still yield
    rows; every row with a smaller key has then been buffered by every source.
    """
    cursors = [_Cursor(iter(s)) for s in sources]
    while True:
        for cursor in cursors:
            cursor.fill()
        live = [c for c in cursors if not c.done]
        if not any(c.buf.num_rows for c in cursors):
            return
        cutoff = min(c.last_key() for c in live) if live else None
        pieces = [p for c in cursors if (p := c.take_below(cutoff)) is not None]
        if pieces:
            yield pieces
            continue
        # Every buffered row has key >= cutoff: read further in the sources whose
        # buffers end at the cutoff key so that key's rows can be completed.
        for cursor in live:
            if cursor.last_key() == cutoff:
                cursor.extend()


def _coalesce(tables: Iterable[pa.Table], target_rows: int) -> Iterator[pa.Table]:
    """Pass big tables (half the target or more) through; gather small consecutive ones
    up to about ``target_rows``."""
    pending: list[pa.Table] = []
    pending_rows = 0
    for table in tables:
        if not table.num_rows:
            continue
        if not pending and 2 * table.num_rows >= target_rows:
            yield table
            continue
        pending.append(table)
        pending_rows += table.num_rows
        if pending_rows >= target_rows:
            yield pa.concat_tables(pending).combine_chunks()
            pending, pending_rows = [], 0
    if pending:
        yield pa.concat_tables(pending).combine_chunks()


def merge_sorted(
    sources: Sequence[Iterable[pa.Table | pa.RecordBatch]],
    *,
    target_rows: int = DEFAULT_BATCH_ROWS,
) -> Iterator[pa.Table]:
    """Merge key-sorted sources into tables sorted by ``(key, row, ts)``.

    Every table holds *all* rows of the keys it covers (from every source) and tables
    cover increasing key ranges, so each can be consolidated on its own. Small chunks
    are coalesced up to about ``target_rows``.
    """

    def chunks() -> Iterator[pa.Table]:
        with _prefetched(sources) as (ahead, pool):
            yield from _mapped_ahead(pool, _merged, _chunks(ahead))

    return _coalesce(chunks(), target_rows)


class PartSource:
    """One part's updates, transformed, in key order: the unit the merge reads.

    Iterating it decodes row groups one after another in the calling thread; the
    prefetcher (:func:`_prefetched`) instead decodes up to ``depth`` row groups of it
    at once on a thread pool (each with its own blob reader) and hands them over in
    order. Tables the transform empties are skipped. Nothing is opened before the
    first table is asked for.
    """

    def __init__(
        self, blob: Blob, part: Part, shard: str, transform: Transform, batch_rows: int
    ) -> None:
        self._blob = blob
        self._part = part
        self._shard = shard
        self._transform = transform
        self._batch_rows = max(1, batch_rows)
        self._opened: OpenPart | None = None
        self._sequential: Iterator[pa.Table] | None = None

    def open(self) -> int:
        """Open the part (once); returns its number of row groups."""
        if self._opened is None:
            self._opened = OpenPart(self._blob, self._part, shard=self._shard)
        return self._opened.num_row_groups

    def group(self, index: int) -> list[pa.Table]:
        """Row group ``index`` decoded and transformed, as non-empty tables of at most
        ``batch_rows`` rows. Thread-safe once :meth:`open` returned."""
        if self._opened is None:
            raise InvalidUsage("PartSource.group before open")
        table = self._transform(self._opened.read_row_group(index))
        if table.num_rows <= self._batch_rows:
            return [table] if table.num_rows else []
        step = self._batch_rows
        return [table.slice(i, step) for i in range(0, table.num_rows, step)]

    def _tables(self) -> Iterator[pa.Table]:
        for index in range(self.open()):
            yield from self.group(index)

    def __iter__(self) -> Iterator[pa.Table]:
        return self

    def __next__(self) -> pa.Table:
        if self._sequential is None:
            self._sequential = self._tables()
        return next(self._sequential)

    def close(self) -> None:
        """Close the part's readers (idempotent)."""
        if self._opened is not None:
            self._opened.close()


def part_sources(
    blob: Blob,
    shard: str,
    batches: Iterable[HollowBatch],
    transform_for: Callable[[HollowBatch], Transform],
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> list[PartSource]:
    """One lazy, transformed, key-sorted source per non-empty part of ``batches``."""
    return [
        PartSource(blob, part, shard, transform_for(batch), batch_rows)
        for batch in batches
        for part in batch.parts
        if part.num_updates
    ]


def consolidated(
    sources: Sequence[Iterator[pa.Table]], *, batch_rows: int = DEFAULT_BATCH_ROWS
) -> Iterator[pa.Table]:
    """Merge ``sources`` and consolidate each chunk (non-empty tables only).

    Every table holds all rows of the keys it covers; tables cover increasing keys.
    """

    def tables() -> Iterator[pa.Table]:
        with _prefetched(sources) as (ahead, pool):
            yield from _mapped_ahead(pool, _merged_consolidated, _chunks(ahead))

    return _coalesce(tables(), batch_rows)


def _emit(tables: Iterator[pa.Table]) -> Iterator[pa.RecordBatch]:
    """One record batch per table, so a key never straddles two batches."""
    for table in tables:
        yield from table.combine_chunks().to_batches()


# --- reads ----------------------------------------------------------------------------


def _readable(state: ShardState) -> str:
    if state.upper == state.since:
        return f"nothing is readable yet (since = upper = {state.upper})"
    return f"readable times are [{state.since}, {state.upper})"


def check_snapshot_readable(state: ShardState, as_of: int) -> None:
    """Raise :class:`NotReadable` unless ``since <= as_of < upper`` (and
    :class:`InvalidUsage` unless ``as_of`` is an integer: a time is never rounded)."""
    require_ts(as_of, "as_of")
    if not state.since <= as_of < state.upper:
        raise NotReadable(
            f"shard {state.shard_id}: cannot read a snapshot as of {as_of}: {_readable(state)}"
        )


def check_changes_readable(state: ShardState, lower: int, upper: int) -> None:
    """Raise :class:`NotReadable` unless ``since <= lower <= upper <= shard upper`` (and
    :class:`InvalidUsage` unless both are integers: a time is never rounded)."""
    require_ts(lower, "since")
    require_ts(upper, "until")
    if not state.since <= lower <= upper <= state.upper:
        raise NotReadable(
            f"shard {state.shard_id}: cannot read changes in [{lower}, {upper}): changes"
            f" need since {state.since} <= lower <= upper <= {state.upper}"
        )


def _snapshot_transform(as_of: int) -> Callable[[HollowBatch], Transform]:
    def transform_for(batch: HollowBatch) -> Transform:
        # Updates lie in [batch.lower, max(batch.upper - 1, batch.since)].
        if max(batch.upper - 1, batch.since) <= as_of:
            return lambda table: with_constant_ts(table, as_of)

        def transform(table: pa.Table) -> pa.Table:
            kept = table.filter(pc.less_equal(table.column("ts"), as_of))
            return with_constant_ts(kept, as_of)

        return transform

    return transform_for


def snapshot(
    blob: Blob,
    state: ShardState,
    as_of: int,
    *,
    positive_only: bool = True,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> Iterator[pa.RecordBatch]:
    """The consolidated contents as of ``as_of``: ``(key, row, ts=as_of, diff)`` batches.

    With ``positive_only`` (default) rows whose multiplicity is negative are dropped;
    pass False to see them (``check`` does, to report broken consolidation).
    """
    check_snapshot_readable(state, as_of)
    relevant = [b for b in state.batches if b.lower <= as_of]
    sources = part_sources(
        blob, state.shard_id, relevant, _snapshot_transform(as_of), batch_rows=batch_rows
    )

    def positive(tables: Iterator[pa.Table]) -> Iterator[pa.Table]:
        for table in tables:
            if positive_only:
                positive_rows = table.column("diff").to_numpy() > 0
                if not positive_rows.all():
                    table = table.filter(pa.array(positive_rows))
            if table.num_rows:
                yield table

    return _emit(positive(consolidated(sources, batch_rows=batch_rows)))


def _changes_transform(
    since: int, lower: int, upper: int
) -> Callable[[HollowBatch], Transform]:
    def transform_for(batch: HollowBatch) -> Transform:
        lowest = max(batch.lower, since)
        highest = max(batch.upper - 1, batch.since, since)
        if lower <= lowest and highest < upper:
            return lambda table: advance_ts(table, since)

        def transform(table: pa.Table) -> pa.Table:
            table = advance_ts(table, since)
            ts = table.column("ts")
            return table.filter(pc.and_(pc.greater_equal(ts, lower), pc.less(ts, upper)))

        return transform

    return transform_for


def changes(
    blob: Blob,
    state: ShardState,
    lower: int,
    upper: int,
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> Iterator[pa.RecordBatch]:
    """Consolidated updates with ``lower <= ts < upper`` (times before since at since)."""
    check_changes_readable(state, lower, upper)
    if lower == upper:
        return iter(())
    relevant = [
        b
        for b in state.batches
        if b.lower < upper and (b.upper > lower or state.since >= lower)
    ]
    transform_for = _changes_transform(state.since, lower, upper)
    sources = part_sources(blob, state.shard_id, relevant, transform_for, batch_rows=batch_rows)
    return _emit(consolidated(sources, batch_rows=batch_rows))


def check_catch_up_readable(state: ShardState, lower: int, upper: int) -> None:
    """Raise :class:`NotReadable` unless :func:`changes_after` may read ``[lower, upper)``.

    ``changes`` reports updates from before ``since`` at ``since``, so its updates at
    ``lower`` are the pure changes of ``lower`` only when nothing lies folded there:
    ``since < lower``, or ``since == 0`` (nothing is before time 0).
    """
    check_changes_readable(state, lower, upper)
    if state.since >= lower and state.since > 0:
        raise NotReadable(
            f"shard {state.shard_id}: cannot catch a state at upper {lower} up to {upper}:"
            f" the shard's since {state.since} is not below {lower}, so the updates at"
            f" {state.since} include history folded there from before it"
        )


def changes_after(
    blob: Blob,
    state: ShardState,
    lower: int,
    upper: int,
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> Iterator[pa.RecordBatch]:
    """The updates that bring a collection known at upper ``lower`` (i.e. the snapshot as
    of ``lower - 1``, or nothing for ``lower == 0``) to upper ``upper``.

    This is a Materialize *listen* from ``as_of = lower - 1``: it needs
    ``since <= as_of``. Plain :func:`changes` would add the history before ``since``
    a second time when ``since == lower``, because it reports it folded at ``since``.
    Raises :class:`NotReadable` when the shard cannot say (see
    :func:`check_catch_up_readable`); the caller then rebuilds from a snapshot.
    """
    check_catch_up_readable(state, lower, upper)
    return changes(blob, state, lower, upper, batch_rows=batch_rows)


def unmerged_changes_after(blob: Blob, state: ShardState, lower: int, upper: int) -> pa.Table:
    """The same updates as :func:`changes_after`, as one table *without* the merge: each
    part is read whole and transformed, and the parts are concatenated, in no particular
    order and not consolidated across parts.

    For readers that sort and check the updates themselves (replay onto an upsert
    state): skipping the k-way merge makes a catch-up read cost one Parquet decode per
    part. Updates of one ``(key, row, ts)`` that the merge would have summed may appear
    more than once; such a reader falls back to :func:`changes_after` when it meets
    them.
    """
    check_catch_up_readable(state, lower, upper)
    if lower == upper:
        return UPDATE_SCHEMA.empty_table()
    relevant = [
        b
        for b in state.batches
        if b.lower < upper and (b.upper > lower or state.since >= lower)
    ]
    transform_for = _changes_transform(state.since, lower, upper)
    sources = part_sources(blob, state.shard_id, relevant, transform_for)
    tables: list[pa.Table] = []
    try:
        for source in sources:
            tables.extend(source)
    finally:
        for source in sources:
            source.close()
    if not tables:
        return UPDATE_SCHEMA.empty_table()
    return pa.concat_tables(tables)


UNMERGED_READ_THREADS = 4
"""Parts an unmerged read decodes at once (decoding and deriving rows release the GIL)."""


class PartCopies(Protocol):
    """Decoded copies of parts, kept where a reader can map them (``ingest.base_cache``):
    a part's ``key, row, ts, diff`` as :meth:`OpenPart.read_whole` gives them, with the
    part's bucket label in the schema metadata."""

    def get(self, key: str, size: int) -> pa.Table | None:
        """The copy of blob part ``key`` while that blob exists with ``size`` bytes."""

    def put(self, key: str, table: pa.Table) -> None:
        """Keep a copy of blob part ``key`` (best effort)."""


def unmerged_changes_by_part(
    blob: Blob, state: ShardState, lower: int, upper: int,
    copies: PartCopies | None = None,
) -> list[tuple[tuple[int, int] | None, pa.Table]]:
    """:func:`unmerged_changes_after`'s updates part by part, each with the part's bucket
    label (None: unlabelled), the parts decoded on up to :data:`UNMERGED_READ_THREADS`
    threads: a reader of one bucket takes the parts labelled with it as they are,
    without splitting every update by key. With ``copies``, a blob part is read from
    its copy when one checks out (its columns, types and row count), else decoded and
    copied. Raises as :func:`unmerged_changes_after`."""
    check_catch_up_readable(state, lower, upper)
    if lower == upper:
        return []
    relevant = [
        (batch, part)
        for batch in state.batches
        if batch.lower < upper and (batch.upper > lower or state.since >= lower)
        for part in batch.parts
        if part.num_updates
    ]
    transform_for = _changes_transform(state.since, lower, upper)

    def read(item: tuple[HollowBatch, Part]) -> tuple[tuple[int, int] | None, pa.Table]:
        batch, part = item
        copy = (
            copies.get(part.key, part.encoded_size_bytes)
            if copies is not None and isinstance(part, BlobPart) else None
        )
        found = None if copy is None else _from_copy(copy, part)
        if found is None:
            opened = OpenPart(blob, part, shard=state.shard_id)
            try:
                label, raw = opened.layout.bucket, opened.read_whole()
            finally:
                opened.close()
            if copies is not None and isinstance(part, BlobPart):
                meta = None if label is None else {BUCKET_META: format_bucket(label)}
                copies.put(part.key, raw.replace_schema_metadata(meta))
            found = label, raw
        label, raw = found
        return label, transform_for(batch)(raw)

    if len(relevant) < 2:
        return [read(item) for item in relevant]
    with ThreadPoolExecutor(
        max_workers=min(UNMERGED_READ_THREADS, len(relevant)),
        thread_name_prefix="unmerged-read",
    ) as pool:
        return list(pool.map(read, relevant))


def _from_copy(copy: pa.Table, part: Part) -> tuple[tuple[int, int] | None, pa.Table] | None:
    """``(label, updates)`` of a part's copy, or None when it is not one this reader
    takes (other columns or types, another row count, an invalid label)."""
    if copy.schema.remove_metadata() != UPDATE_SCHEMA or copy.num_rows != part.num_updates:
        return None
    text = (copy.schema.metadata or {}).get(BUCKET_META)
    label = None
    if text is not None:
        label = parse_bucket(text.decode("ascii", errors="replace"))
        if label is None:
            return None
    return label, copy.replace_schema_metadata(None)


def read_all(batches: Iterable[pa.RecordBatch]) -> pa.Table:
    """Collect a read into one table (for tests and small shards)."""
    return pa.Table.from_batches(list(batches), schema=UPDATE_SCHEMA)
