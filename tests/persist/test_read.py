"""Consolidated streaming reads (snapshot, changes) against a dict model."""

from __future__ import annotations

import io
from collections import Counter
from dataclasses import dataclass

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from upsert_core.errors import NotReadable
from upsert_core.persist.location import Blob
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.read.read import changes, changes_after, merge_sorted, read_all, snapshot
from upsert_core.persist.state.state import HollowBatch, ShardState, initial_state
from upsert_core.persist.testing import DelegatingBlob
from upsert_core.persist.write.consolidate import (
    consolidate,
    is_sorted,
    merge_consolidate,
    merge_indices,
    sort_updates,
)
from upsert_core.persist.write.parts import write_parts

from .test_parts import Update, key, rows_of, updates_table

SHARD = "reads"


@dataclass
class Shard:
    blob: Blob
    state: ShardState
    updates: list[Update]


@st.composite
def shards(draw: st.DrawFn) -> Shard:
    """A shard of random batches, each split into random parts, with a random since."""
    blob = MemoryBlob()
    num_batches = draw(st.integers(1, 6))
    batches = []
    updates: list[Update] = []
    lower = 0
    for _ in range(num_batches):
        width = draw(st.integers(1, 3))
        upper = lower + width
        batch_updates = draw(
            st.lists(
                st.tuples(
                    st.integers(0, 5).map(key),
                    st.sampled_from([b"a", b"b", b"c"]),
                    st.integers(lower, upper - 1),
                    st.sampled_from([1, 1, -1, 2]),
                ),
                max_size=15,
            )
        )
        part_rows = draw(st.integers(1, 8))
        parts = write_parts(
            blob,
            SHARD,
            updates_table(batch_updates),
            part_rows=part_rows,
            inline_threshold=draw(st.sampled_from([0, 10**9])),
        )
        batches.append(HollowBatch(lower=lower, upper=upper, since=0, parts=parts))
        updates += batch_updates
        lower = upper
    since = draw(st.integers(0, lower - 1))
    state = initial_state(SHARD).evolve(batches=tuple(batches), upper=lower, since=since)
    state.check_invariants()
    return Shard(blob, state, updates)


def model_snapshot(updates: list[Update], as_of: int, positive_only: bool) -> list[Update]:
    acc: Counter[tuple[bytes, bytes]] = Counter()
    for k, r, t, d in updates:
        if t <= as_of:
            acc[(k, r)] += d
    return sorted(
        (k, r, as_of, d) for (k, r), d in acc.items() if d > 0 or (d < 0 and not positive_only)
    )


def model_changes(updates: list[Update], since: int, lower: int, upper: int) -> list[Update]:
    acc: Counter[tuple[bytes, bytes, int]] = Counter()
    for k, r, t, d in updates:
        t = max(t, since)
        if lower <= t < upper:
            acc[(k, r, t)] += d
    return sorted((k, r, t, d) for (k, r, t), d in acc.items() if d != 0)


def assert_no_key_straddles(batches: list[pa.RecordBatch]) -> None:
    """Each batch holds all rows of its keys: keys strictly increase across batches."""
    keys = [b.column("key").to_pylist() for b in batches if b.num_rows]
    assert all(a[-1] < b[0] for a, b in zip(keys, keys[1:], strict=False))


@given(shards(), st.booleans(), st.sampled_from([1, 2, 5, 1000]))
def test_snapshot_at_every_readable_time_matches_model(
    shard: Shard, positive_only: bool, batch_rows: int
) -> None:
    state = shard.state
    for as_of in range(state.since, state.upper):
        batches = list(
            snapshot(
                shard.blob, state, as_of, positive_only=positive_only, batch_rows=batch_rows
            )
        )
        result = read_all(batches)
        assert rows_of(result) == model_snapshot(shard.updates, as_of, positive_only)
        assert is_sorted(result)
        assert_no_key_straddles(batches)


@given(shards(), st.data())
def test_changes_match_model_and_compose_into_snapshots(shard: Shard, data: st.DataObject) -> None:
    state = shard.state
    lower = data.draw(st.integers(state.since, state.upper))
    upper = data.draw(st.integers(lower, state.upper))
    batches = list(changes(shard.blob, state, lower, upper, batch_rows=3))
    assert rows_of(read_all(batches)) == model_changes(shard.updates, state.since, lower, upper)
    assert_no_key_straddles(batches)
    # snapshot(ts) = snapshot(ts - 1) + changes at ts, for every readable ts > since.
    for ts in range(state.since + 1, state.upper):
        before = {
            (k, r): d
            for k, r, _, d in rows_of(
                read_all(snapshot(shard.blob, state, ts - 1, positive_only=False))
            )
        }
        for k, r, _, d in rows_of(read_all(changes(shard.blob, state, ts, ts + 1))):
            before[(k, r)] = before.get((k, r), 0) + d
        after = rows_of(read_all(snapshot(shard.blob, state, ts, positive_only=False)))
        assert {kr: d for kr, d in before.items() if d} == {(k, r): d for k, r, _, d in after}


def test_streaming_merge_of_many_small_record_batches_stays_bounded() -> None:
    blob = MemoryBlob()
    batches = []
    expected: Counter[tuple[bytes, bytes]] = Counter()
    for ts in range(12):
        rows = [(key((i * 7 + ts) % 200), b"v%d" % (i % 3), ts, 1) for i in range(150)]
        rows += [(key((i * 11 + ts) % 200), b"v%d" % (i % 3), ts, -1) for i in range(40)]
        for k, r, _, d in rows:
            expected[(k, r)] += d
        parts = write_parts(blob, SHARD, updates_table(rows), part_rows=60, inline_threshold=0)
        batches.append(HollowBatch(lower=ts, upper=ts + 1, since=0, parts=parts))
    state = initial_state(SHARD).evolve(batches=tuple(batches), upper=12)
    num_parts = sum(len(b.parts) for b in state.batches)
    batch_rows = 4
    out = list(snapshot(blob, state, 11, batch_rows=batch_rows, positive_only=False))
    assert len(out) > 20
    # Each emitted batch is at most one coalescing target plus one merged chunk.
    assert max(b.num_rows for b in out) <= batch_rows + num_parts * batch_rows
    result = read_all(out)
    assert is_sorted(result)
    assert rows_of(result) == sorted((k, r, 11, d) for (k, r), d in expected.items() if d)


def test_merge_sorted_keeps_a_key_whole_across_source_batches() -> None:
    # Source A repeats key 1 over several record batches; key 1 must land in one chunk.
    a = [updates_table([(key(1), bytes([i]), 0, 1)]) for i in range(5)]
    a.append(updates_table([(key(3), b"z", 0, 1)]))
    b = [updates_table([(key(1), b"\x02", 0, -1), (key(2), b"y", 0, 1)])]
    chunks = list(merge_sorted([iter(a), iter(b)], target_rows=1))
    for chunk in chunks:
        assert is_sorted(chunk)
    keys_per_chunk = [set(chunk.column("key").to_pylist()) for chunk in chunks]
    assert sum(key(1) in ks for ks in keys_per_chunk) == 1
    assert sum(c.num_rows for c in chunks) == 8


def test_reads_outside_since_and_upper_say_what_is_readable() -> None:
    blob = MemoryBlob()
    parts = write_parts(blob, SHARD, updates_table([(key(1), b"a", 2, 1)]))
    batch = HollowBatch(lower=0, upper=4, since=0, parts=parts)
    state = initial_state(SHARD).evolve(batches=(batch,), upper=4, since=1)
    for as_of in (0, 4):
        with pytest.raises(NotReadable, match=r"readable times are \[1, 4\)"):
            snapshot(blob, state, as_of)
    with pytest.raises(NotReadable, match=r"since 1 <= lower <= upper <= 4"):
        changes(blob, state, 0, 2)
    with pytest.raises(NotReadable, match=r"since 1 <= lower <= upper <= 4"):
        changes(blob, state, 2, 5)
    with pytest.raises(NotReadable, match="nothing is readable yet"):
        snapshot(blob, initial_state(SHARD), 0)
    assert read_all(changes(blob, state, 3, 3)).num_rows == 0
    assert rows_of(read_all(snapshot(blob, state, 1))) == []
    assert rows_of(read_all(snapshot(blob, state, 3))) == [(key(1), b"a", 3, 1)]


def test_compacted_batches_read_like_uncompacted_ones() -> None:
    # A batch [0, 3) whose updates were advanced to since 2 by compaction, beside the
    # same data uncompacted: reads at and after since agree.
    blob = MemoryBlob()
    raw = [(key(1), b"a", 0, 1), (key(1), b"a", 1, -1), (key(1), b"b", 1, 1), (key(2), b"c", 2, 1)]
    compacted = [(key(1), b"b", 2, 1), (key(2), b"c", 2, 1)]
    states = []
    for rows, batch_since in ((raw, 0), (compacted, 2)):
        parts = write_parts(blob, SHARD, updates_table(rows))
        batch = HollowBatch(lower=0, upper=3, since=batch_since, parts=parts)
        states.append(initial_state(SHARD).evolve(batches=(batch,), upper=3, since=2))
    results = [
        (rows_of(read_all(snapshot(blob, s, 2))), rows_of(read_all(changes(blob, s, 2, 3))))
        for s in states
    ]
    assert results[0] == results[1]
    assert results[0][1] == [(key(1), b"b", 2, 1), (key(2), b"c", 2, 1)]


def test_empty_parts_and_batches_read_as_nothing() -> None:
    blob = MemoryBlob()
    empty = HollowBatch(lower=0, upper=1, since=0, parts=())
    state = initial_state(SHARD).evolve(batches=(empty,), upper=1)
    assert list(snapshot(blob, state, 0)) == []
    assert list(changes(blob, state, 0, 1)) == []


# Keys sharing their first 8 bytes tie on the high word, exercising the tie-break path.
tie_keys = st.sampled_from(
    [b"\x00" * 8 + bytes([i]) * 8 for i in range(3)] + [key(i) for i in range(4)]
)


@given(
    st.lists(
        st.lists(
            st.tuples(tie_keys, st.sampled_from([b"", b"a", b"ab", b"b"]), st.integers(0, 2),
                      st.sampled_from([1, -1, 2, 0])),
            max_size=12,
        ),
        max_size=5,
    )
)
def test_merging_sorted_runs_equals_sorting_and_consolidating(runs: list[list[Update]]) -> None:
    tables = [sort_updates(updates_table(run)) for run in runs]
    table = pa.concat_tables([updates_table([]), *tables])
    expected = consolidate(table)
    assert rows_of(merge_consolidate(table)) == rows_of(expected)
    merged = table.take(pa.array(merge_indices(table)))
    assert sorted(rows_of(merged)) == sorted(rows_of(table)) and is_sorted(merged)


class CountingBlob(DelegatingBlob):
    """A ranged blob that counts the readers it opened and closed."""

    def __init__(self) -> None:
        super().__init__(MemoryBlob())
        self.opened = 0
        self.readers: list[io.BytesIO] = []

    def open_reader(self, key: str) -> io.BytesIO | None:
        data = self.inner.get(key)
        if data is None:
            return None
        self.readers.append(io.BytesIO(data))
        return self.readers[-1]


def test_reads_close_every_part_reader_whether_finished_or_abandoned() -> None:
    blob = CountingBlob()
    batches = []
    for ts in range(4):
        rows = [(key(i), b"v%d" % ts, ts, 1) for i in range(ts, 30 + ts)]
        parts = write_parts(blob, SHARD, updates_table(rows), part_rows=10, inline_threshold=0,
                            row_group_rows=3)
        batches.append(HollowBatch(lower=ts, upper=ts + 1, since=0, parts=parts))
    state = initial_state(SHARD).evolve(batches=tuple(batches), upper=4)
    full = list(snapshot(blob, state, 3, batch_rows=2))
    assert sum(b.num_rows for b in full) == 4 * 30
    assert blob.readers and all(r.closed for r in blob.readers)
    blob.readers.clear()
    stream = snapshot(blob, state, 3, batch_rows=2)
    next(stream)
    assert any(not r.closed for r in blob.readers)  # parts are read lazily, while streaming
    stream.close()
    assert all(r.closed for r in blob.readers)


def test_reads_from_a_blob_without_ranged_reads_fetch_each_part_once() -> None:
    class PlainBlob(CountingBlob):
        open_reader = None  # type: ignore[assignment]

        def __init__(self) -> None:
            super().__init__()
            self.gets: list[str] = []

        def get(self, key: str) -> bytes | None:
            self.gets.append(key)
            return self.inner.get(key)

    blob = PlainBlob()
    rows = [(key(i % 9), b"r%d" % i, 0, 1) for i in range(40)]
    (part,) = write_parts(blob, SHARD, updates_table(rows), inline_threshold=0, row_group_rows=4)
    state = initial_state(SHARD).evolve(
        batches=(HollowBatch(lower=0, upper=1, since=0, parts=(part,)),), upper=1
    )
    assert rows_of(read_all(snapshot(blob, state, 0, batch_rows=3))) == sorted(rows)
    assert blob.gets == [part.key]  # type: ignore[union-attr]


@given(shards(), st.data())
def test_changes_after_catch_up_a_snapshot_or_refuse(shard: Shard, data: st.DataObject) -> None:
    """A collection known at upper ``lower`` plus ``changes_after(lower, upper)`` is the
    snapshot as of ``upper - 1``; where the shard cannot tell (the updates at ``since``
    hold folded history), the read is refused instead of double counting it."""
    state = shard.state
    lower = data.draw(st.integers(0, state.upper))
    upper = data.draw(st.integers(lower, state.upper))
    if state.since >= lower and state.since > 0:
        with pytest.raises(NotReadable):
            changes_after(shard.blob, state, lower, upper)
        return
    acc: Counter[tuple[bytes, bytes]] = Counter()
    if lower > 0:
        for k, r, _t, d in model_snapshot(shard.updates, lower - 1, positive_only=False):
            acc[(k, r)] += d
    for k, r, _t, d in rows_of(read_all(changes_after(shard.blob, state, lower, upper))):
        acc[(k, r)] += d
    expected = Counter(
        {(k, r): d for k, r, _t, d in model_snapshot(shard.updates, upper - 1, False)}
    ) if upper > 0 else Counter()
    assert +acc == +expected and -acc == -expected
