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

import pyarrow as pa
import pyarrow.compute as pc

from upsert_core.errors import NotReadable
from upsert_core.persist.consolidate import (
    UPDATE_SCHEMA,
    advance_ts,
    as_table,
    consolidate_sorted,
    sort_updates,
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
            self.buf = pa.concat_tables([self.buf, pulled]).combine_chunks()

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


def _merge_pieces(pieces: list[pa.Table]) -> pa.Table:
    if len(pieces) == 1:
        return pieces[0]
    return sort_updates(pa.concat_tables(pieces))


def merge_sorted(
    sources: Sequence[Iterator[pa.Table | pa.RecordBatch]], *, target_rows: int = DEFAULT_BATCH_ROWS
) -> Iterator[pa.Table]:
    """Merge key-sorted sources into chunks sorted by ``(key, row, ts)``.

    Every chunk holds *all* rows of the keys it covers (from every source) and chunks
    cover increasing key ranges, so each chunk can be consolidated on its own. The
    cutoff is the smallest last buffered key among sources that may still yield rows:
    every row with a smaller key has already been buffered by every source.
    Small chunks are coalesced up to about ``target_rows``.
    """
    cursors = [_Cursor(iter(s)) for s in sources]
    pending: list[pa.Table] = []
    pending_rows = 0
    while True:
        for cursor in cursors:
            cursor.fill()
        live = [c for c in cursors if not c.done]
        if not any(c.buf.num_rows for c in cursors):
            break
        cutoff = min(c.last_key() for c in live) if live else None
        pieces = [p for c in cursors if (p := c.take_below(cutoff)) is not None]
        if not pieces:
            # Every buffered row has key >= cutoff: read further in the sources whose
            # buffers end at the cutoff key so that key's rows can be completed.
            for cursor in live:
                if cursor.last_key() == cutoff:
                    cursor.extend()
            continue
        chunk = _merge_pieces(pieces)
        pending.append(chunk)
        pending_rows += chunk.num_rows
        if pending_rows >= target_rows:
            yield pa.concat_tables(pending).combine_chunks()
            pending, pending_rows = [], 0
    if pending:
        yield pa.concat_tables(pending).combine_chunks()


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
    for chunk in merge_sorted(sources, target_rows=batch_rows):
        result = consolidate_sorted(chunk)
        if result.num_rows:
            yield result


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
            kept = table.filter(pc.greater(table.column("diff"), 0)) if positive_only else table
            if kept.num_rows:
                yield kept

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
