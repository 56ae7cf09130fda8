"""Consolidated reads of a shard: ``snapshot`` as of a time and ``changes`` in a range.

Reads stream: every relevant part is read record batch by record batch and the parts
are merged by key (:func:`merge_sorted`), so the decoded data held at once is bounded
by about (number of parts x batch size), never the whole shard. Compaction keeps the
number of parts logarithmic in the shard's history. (Blob has no ranged reads, so the
*encoded* bytes of each part being merged are held while it is read; writers bound
them with ``parts.DEFAULT_PART_ROWS``.)

Invariants:

- A read is allowed only inside ``[since, upper)``: ``snapshot(as_of)`` needs
  ``since <= as_of < upper``; ``changes(lower, upper)`` needs
  ``since <= lower <= upper <= shard upper``. Otherwise :class:`NotReadable` is raised
  at the call (not at the first ``next``) saying what is readable.
- ``snapshot(as_of)``: every update with ``ts <= as_of``, times advanced to ``as_of``,
  consolidated; by default only rows with a positive multiplicity (``diff`` is kept so
  callers can check it is 1).
- ``changes(lower, upper)``: every update with ``lower <= ts' < upper`` where
  ``ts' = max(ts, since)``, consolidated per ``(key, row, ts')``. Updates from before
  ``since`` are indistinguishable and reported at ``since``, the same whether or not
  compaction already advanced them, so reads never depend on compaction.
- Output record batches are sorted by ``(key, row, ts)`` across the whole read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from upsert_core.errors import NotReadable
from upsert_core.persist.consolidate import (
    UPDATE_SCHEMA,
    advance_ts,
    as_table,
    consolidate_in_order,
    sort_indices,
    with_constant_ts,
)
from upsert_core.persist.location import Blob
from upsert_core.persist.parts import DEFAULT_BATCH_ROWS, read_part
from upsert_core.persist.state import HollowBatch, ShardState

Transform = Callable[[pa.Table], pa.Table]
"""Maps a sorted chunk of one part to a sorted chunk (filter rows, advance times)."""


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


def _merge_pieces(pieces: list[pa.Table]) -> tuple[pa.Table, np.ndarray | None]:
    """Concatenate pieces covering the same key range, with the order that sorts them
    (``None`` when the concatenation is sorted already)."""
    if len(pieces) == 1:
        return pieces[0], None
    firsts = [p.column("key")[0].as_py() for p in pieces]
    by_first = sorted(range(len(pieces)), key=firsts.__getitem__)
    ordered = [pieces[i] for i in by_first]
    # One copy into contiguous columns: sorting and gathering from chunked columns
    # costs several times more.
    table = pa.concat_tables(ordered).combine_chunks()
    lasts = [p.column("key")[p.num_rows - 1].as_py() for p in ordered]
    if all(lasts[i] < firsts[by_first[i + 1]] for i in range(len(ordered) - 1)):
        return table, None  # disjoint key ranges: already sorted
    return table, sort_indices(table)


def _chunks(
    sources: Sequence[Iterable[pa.Table | pa.RecordBatch]],
) -> Iterator[tuple[pa.Table, np.ndarray | None]]:
    """The streaming merge: chunks holding every row of the keys they cover, in
    increasing key ranges, each with the order that sorts it by ``(key, row, ts)``.

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
            yield _merge_pieces(pieces)
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
    chunks = (t if o is None else t.take(pa.array(o)) for t, o in _chunks(sources))
    return _coalesce(chunks, target_rows)


def _transformed(
    batches: Iterable[pa.RecordBatch], transform: Transform
) -> Iterator[pa.Table]:
    for batch in batches:
        table = transform(as_table(batch))
        if table.num_rows:
            yield table


def part_sources(
    blob: Blob,
    shard: str,
    batches: Iterable[HollowBatch],
    transform_for: Callable[[HollowBatch], Transform],
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> list[Iterator[pa.Table]]:
    """One lazy, transformed, key-sorted source per part of ``batches``."""
    sources: list[Iterator[pa.Table]] = []
    for batch in batches:
        transform = transform_for(batch)
        for part in batch.parts:
            if part.num_updates:
                batches_of_part = read_part(blob, part, shard=shard, batch_rows=batch_rows)
                sources.append(_transformed(batches_of_part, transform))
    return sources


def consolidated(
    sources: Sequence[Iterator[pa.Table]], *, batch_rows: int = DEFAULT_BATCH_ROWS
) -> Iterator[pa.Table]:
    """Merge ``sources`` and consolidate each chunk (non-empty tables only)."""
    tables = (consolidate_in_order(t, o) for t, o in _chunks(sources))
    return _coalesce(tables, batch_rows)


def _emit(tables: Iterator[pa.Table]) -> Iterator[pa.RecordBatch]:
    for table in tables:
        yield from table.to_batches()


# --- reads ----------------------------------------------------------------------------


def _readable(state: ShardState) -> str:
    if state.upper == state.since:
        return f"nothing is readable yet (since = upper = {state.upper})"
    return f"readable times are [{state.since}, {state.upper})"


def check_snapshot_readable(state: ShardState, as_of: int) -> None:
    """Raise :class:`NotReadable` unless ``since <= as_of < upper``."""
    if not state.since <= as_of < state.upper:
        raise NotReadable(
            f"shard {state.shard_id}: cannot read a snapshot as of {as_of}: {_readable(state)}"
        )


def check_changes_readable(state: ShardState, lower: int, upper: int) -> None:
    """Raise :class:`NotReadable` unless ``since <= lower <= upper <= shard upper``."""
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


def read_all(batches: Iterable[pa.RecordBatch]) -> pa.Table:
    """Collect a read into one table (for tests and small shards)."""
    return pa.Table.from_batches(list(batches), schema=UPDATE_SCHEMA)
