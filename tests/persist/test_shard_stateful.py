"""A stateful property test of the shard against a list-of-updates model.

Two handles on the same stores append (one at a time and racing from two threads),
append with a stale upper, write rollups, compact, truncate, run GC with and without
``retain`` and hold a leased reader; reads as of every readable time and changes over
the readable range must equal the model's, and after every GC exactly the blobs that no
live state references are gone. Runs on memory stores and on SQLite + local files.
"""

from __future__ import annotations

import tempfile
import threading
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from upsert_core.errors import InvalidUsage
from upsert_core.persist.keys import rollup_prefix, writer_id_of
from upsert_core.persist.location import Blob, Consensus
from upsert_core.persist.location.blob_local import LocalBlob
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.location.consensus_sql import SqlConsensus
from upsert_core.persist.maintenance.gc import rollup_current, truncation_point
from upsert_core.persist.read.read import read_all
from upsert_core.persist.shard import LeasedReader, Shard
from upsert_core.persist.write.append import AppendRequest, AppendResult, delete_uncommitted

from .helpers_proc import (
    RecordingBlob,
    Update,
    data_blob_keys,
    live_referenced,
    live_rollup_keys,
    rows_of,
    updates_table,
    upsert_updates,
)

SHARD = "stateful"

ops_strategy = st.lists(
    st.tuples(st.integers(0, 4), st.one_of(st.none(), st.sampled_from([b"a", b"b", b"c"]))),
    max_size=4,
)


def consolidate(updates: list[Update]) -> list[Update]:
    sums: dict[tuple[bytes, bytes, int], int] = defaultdict(int)
    for k, row, ts, diff in updates:
        sums[(k, row, ts)] += diff
    return sorted((k, row, ts, d) for (k, row, ts), d in sums.items() if d != 0)


class ShardModel(RuleBasedStateMachine):
    """Drives two shard handles and a model side by side."""

    def make_stores(self) -> tuple[Consensus, Blob]:
        raise NotImplementedError

    def __init__(self) -> None:
        super().__init__()
        self.exits = ExitStack()
        consensus, blob = self.make_stores()
        self.blob = RecordingBlob(blob)
        self.handles = [
            Shard.open(consensus, self.blob, SHARD, inline_threshold=0, rollup_every=3),
            Shard.open(consensus, self.blob, SHARD, rollup_every=5),
        ]
        self.updates: list[Update] = []
        self.current: dict[bytes, bytes] = {}
        self.upper = 0
        self.since = 0
        self.reader: LeasedReader | None = None
        self.reader_exits = ExitStack()
        self.reader_expected: list[Update] | None = None

    # --- the model ------------------------------------------------------------------

    def snapshot_at(self, ts: int) -> list[Update]:
        rows = consolidate([(k, r, ts, d) for k, r, t, d in self.updates if t <= ts])
        return [u for u in rows if u[3] > 0]

    def changes_between(self, lower: int, upper: int) -> list[Update]:
        moved = [(k, r, max(t, self.since), d) for k, r, t, d in self.updates]
        return consolidate([u for u in moved if lower <= u[2] < upper])

    def commit(self, updates: list[Update], model: dict[bytes, bytes]) -> None:
        self.updates.extend(updates)
        self.current = model
        self.upper += 1

    # --- rules ----------------------------------------------------------------------

    @rule(h=st.integers(0, 1), ops=ops_strategy)
    def append(self, h: int, ops: list[tuple[int, bytes | None]]) -> None:
        model = dict(self.current)
        updates = upsert_updates(model, self.upper, ops)
        result = self.handles[h].append(updates_table(updates), self.upper)
        assert result.committed, result
        self.commit(updates, model)

    @rule(ops_a=ops_strategy, ops_b=ops_strategy)
    def racing_appends(
        self, ops_a: list[tuple[int, bytes | None]], ops_b: list[tuple[int, bytes | None]]
    ) -> None:
        models = [dict(self.current), dict(self.current)]
        updates = [upsert_updates(models[0], self.upper, ops_a),
                   upsert_updates(models[1], self.upper, ops_b)]
        batches = [h.write_batch(updates_table(u), self.upper, self.upper + 1)
                   for h, u in zip(self.handles, updates, strict=True)]
        results: list[AppendResult | None] = [None, None]
        barrier = threading.Barrier(2)

        def run(i: int) -> None:
            barrier.wait()
            # Distinct file names: identical batches would be recognised as one append.
            files = {f"racer{i}-{self.upper}": self.upper}
            results[i] = self.handles[i].compare_and_append(
                AppendRequest(batches[i], self.upper, ingested_files=files)
            )

        threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results[0] is not None and results[1] is not None
        won = [r.committed for r in results]
        assert sorted(won) == [False, True], results
        winner = won.index(True)
        loser = results[1 - winner]
        assert loser is not None and loser.upper_mismatch and loser.actual_upper == self.upper + 1
        delete_uncommitted(self.blob, batches[1 - winner])
        self.commit(updates[winner], models[winner])

    @precondition(lambda self: self.upper > 0)
    @rule(h=st.integers(0, 1))
    def stale_append(self, h: int) -> None:
        before = data_blob_keys(self.blob, SHARD)
        ts = self.upper - 1
        rows = [(b"\x00" * 16, b"stale", ts, 1)]
        result = self.handles[h].append(updates_table(rows), ts)
        assert not result.committed and result.actual_upper == self.upper
        assert data_blob_keys(self.blob, SHARD) == before  # its parts were deleted

    @rule(h=st.integers(0, 1))
    def rollup(self, h: int) -> None:
        rollup_current(self.handles[h].machine)

    @rule(h=st.integers(0, 1))
    def compact(self, h: int) -> None:
        self.handles[h].compact()

    @rule(h=st.integers(0, 1))
    def truncate(self, h: int) -> None:
        versions = self.handles[h].versions
        state = versions.fetch_current_state()
        point = truncation_point(state)
        assert point is not None
        versions.truncate(point)
        newer = [s for s in state.rollups if s > point]
        if self.reader is not None and newer:
            with pytest.raises(InvalidUsage, match="leased reader"):
                versions.truncate(max(newer))

    @rule(h=st.integers(0, 1), retain=st.one_of(st.none(), st.integers(1, 4)))
    def gc(self, h: int, retain: int | None) -> None:
        self.blob.deleted.clear()
        report = self.handles[h].gc(retain=retain, leak_grace_ms=0)
        deleted = set(self.blob.deleted)
        assert deleted == set(report.deleted_keys)
        shard = self.handles[h]
        referenced = live_referenced(shard)
        rollups = live_rollup_keys(shard)
        assert not deleted & (referenced | rollups)
        # What is left beyond the referenced blobs belongs to a registered (live) writer
        # and waits for its registration to end (see ``persist.maintenance.gc``).
        registered = set(shard.state().writers)
        left = data_blob_keys(self.blob, SHARD)
        assert referenced <= left
        assert all(writer_id_of(k) in registered for k in left - referenced)
        assert {m.key for m in self.blob.list_keys(rollup_prefix(SHARD))} == rollups
        if retain is not None:
            target = min(self.upper, max(self.since, self.upper - retain))
            if self.reader is not None:
                target = min(target, self.reader.state.since)
            self.since = max(self.since, target)
        assert report.since_after == self.since
        if self.reader is not None:
            assert set(self.reader.state.referenced_blob_keys()) <= referenced

    @precondition(lambda self: self.reader is None)
    @rule(h=st.integers(0, 1))
    def open_reader(self, h: int) -> None:
        self.reader = self.reader_exits.enter_context(self.handles[h].register_reader())
        state = self.reader.state
        self.reader_expected = self.snapshot_at(state.upper - 1) if state.upper else None

    @precondition(lambda self: self.reader is not None)
    @rule()
    def read_with_reader(self) -> None:
        assert self.reader is not None
        if self.reader_expected is not None and self.reader.state.since < self.reader.state.upper:
            assert rows_of(read_all(self.reader.snapshot())) == self.reader_expected

    @precondition(lambda self: self.reader is not None)
    @rule()
    def close_reader(self) -> None:
        self.reader_exits.close()
        self.reader = None

    @rule(h=st.integers(0, 1))
    def read_every_time(self, h: int) -> None:
        shard = self.handles[h]
        for ts in range(self.since, self.upper):
            assert rows_of(read_all(shard.snapshot(ts))) == self.snapshot_at(ts), ts
        got = rows_of(read_all(shard.changes(self.since, self.upper)))
        assert got == self.changes_between(self.since, self.upper)

    # --- invariants -------------------------------------------------------------------

    @invariant()
    def frontiers_and_newest_read(self) -> None:
        state = self.handles[0].state()
        assert (state.upper, state.since) == (self.upper, self.since)
        if self.since < self.upper:
            got = rows_of(read_all(self.handles[1].snapshot(self.upper - 1)))
            assert got == self.snapshot_at(self.upper - 1)

    def teardown(self) -> None:
        try:
            self.reader_exits.close()
            report = self.handles[0].check()
            assert report.ok, report.problems
        finally:
            self.exits.close()


class MemoryShardModel(ShardModel):
    def make_stores(self) -> tuple[Consensus, Blob]:
        return MemoryConsensus(), MemoryBlob()


class SqliteShardModel(ShardModel):
    def make_stores(self) -> tuple[Consensus, Blob]:
        root = Path(self.exits.enter_context(tempfile.TemporaryDirectory()))
        consensus = SqlConsensus(f"sqlite:///{root}/consensus.db")
        self.exits.callback(consensus.close)
        return consensus, LocalBlob(root / "blob")


TestShardOnMemory = MemoryShardModel.TestCase
TestShardOnMemory.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)

TestShardOnSqlite = SqliteShardModel.TestCase
TestShardOnSqlite.settings = settings(max_examples=12, stateful_step_count=30, deadline=None)
