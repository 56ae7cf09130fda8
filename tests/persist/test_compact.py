"""Compaction: same logical content at and after since, fewer batches, safe commits."""

from __future__ import annotations

import contextlib
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.persist.writer_helpers import compare_and_append
from upsert_core.errors import InvalidUsage, LocationError
from upsert_core.persist.location import Blob
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.location.unreliable import FaultRates, UnreliableConsensus
from upsert_core.persist.maintenance.compact import (
    batch_weight,
    commit_merge,
    compact,
    merge_batches,
    plan_backlog,
    plan_merge,
)
from upsert_core.persist.read.read import changes, read_all, snapshot
from upsert_core.persist.state.machine import Machine, Transition
from upsert_core.persist.state.state import BlobPart, HollowBatch, ReaderState, ShardState
from upsert_core.persist.state.state_versions import StateVersions
from upsert_core.persist.write.consolidate import is_sorted
from upsert_core.persist.write.parts import read_part_table, write_batch

from .test_parts import Update, key, rows_of, updates_table
from .test_read import model_changes, model_snapshot

SHARD = "compacts"


def new_machine(blob: Blob) -> Machine:
    versions = StateVersions(MemoryConsensus(), blob, SHARD)
    versions.maybe_init_shard()
    return Machine(versions, rollup_every=8)


def append(machine: Machine, blob: Blob, rows: list[Update], *, part_rows: int = 4) -> None:
    upper = machine.state().upper
    table = updates_table([(k, r, upper, d) for k, r, _, d in rows])
    batch = write_batch(blob, SHARD, table, upper, upper + 1, part_rows=part_rows,
                        inline_threshold=0)
    assert compare_and_append(machine, batch, upper).committed


def advance_since(machine: Machine, since: int) -> None:
    machine.apply(lambda s: s.evolve(since=max(s.since, min(since, s.upper - 1))))


def contents(blob: Blob, state: ShardState) -> tuple[list[list[Update]], list[Update]]:
    snaps = [
        rows_of(read_all(snapshot(blob, state, ts, positive_only=False)))
        for ts in range(state.since, state.upper)
    ]
    return snaps, rows_of(read_all(changes(blob, state, state.since, state.upper)))


batch_rows_strategy = st.lists(
    st.tuples(
        st.integers(0, 7).map(key),
        st.sampled_from([b"x", b"y", b"z"]),
        st.just(0),
        st.sampled_from([1, 1, -1]),
    ),
    max_size=12,
)


@given(
    st.lists(st.tuples(batch_rows_strategy, st.integers(0, 3), st.booleans()), min_size=1,
             max_size=12),
    st.sampled_from([2, 3, 8]),
    st.sampled_from([1, 5, 1000]),
)
def test_compaction_keeps_content_from_since_and_reduces_batches(
    steps: list[tuple[list[Update], int, bool]], per_merge: int, part_rows: int
) -> None:
    blob = MemoryBlob()
    machine = new_machine(blob)
    model: list[Update] = []
    for rows, since_lag, compact_now in steps:
        ts = machine.state().upper
        append(machine, blob, rows)
        model += [(k, r, ts, d) for k, r, _, d in rows]
        advance_since(machine, ts - since_lag)
        if compact_now:
            compact(machine, blob, max_batches_per_merge=per_merge, part_rows=part_rows)
    before = machine.state()
    expected = contents(blob, before)
    result = compact(machine, blob, max_batches_per_merge=per_merge, part_rows=part_rows)
    after = machine.state()
    assert result.state.batches == after.batches and result.batches_after == len(after.batches)
    assert len(after.batches) <= len(before.batches)
    assert contents(blob, after) == expected
    # ... which is also the model's content.
    snaps, changed = expected
    for as_of, snap in zip(range(after.since, after.upper), snaps, strict=True):
        assert snap == model_snapshot(model, as_of, positive_only=False)
    assert changed == model_changes(model, after.since, after.since, after.upper)
    # The tiers hold afterwards, so the batch count is logarithmic in the updates.
    assert plan_merge(after.batches, max_batches_per_merge=per_merge) is None
    total = sum(batch_weight(b) for b in after.batches)
    assert len(after.batches) <= math.log2(total) + 1
    for batch in after.batches:
        for part in batch.parts:
            assert is_sorted(read_part_table(blob, part))


def test_plan_merge_follows_the_size_tiers() -> None:
    def batches(*sizes: int) -> list[HollowBatch]:
        return [
            HollowBatch(lower=i, upper=i + 1, since=0,
                        parts=() if not n else (write_batch(
                            MemoryBlob(), SHARD,
                            updates_table([(key(j), b"r", i, 1) for j in range(n)]),
                            i, i + 1).parts))
            for i, n in enumerate(sizes)
        ]

    assert plan_merge(batches(8, 4, 2, 1)) is None
    assert plan_merge(batches(8, 4, 3)) == (1, 3)
    assert plan_merge(batches(8, 1, 1, 3, 1)) == (1, 4)  # 1 < 2, 1+1 < 6, not 5 < 2
    assert plan_merge(batches(8, 1, 1, 3, 4)) == (1, 5)  # ... and 5 < 8
    assert plan_merge(batches(8, 1, 1, 3), max_batches_per_merge=2) == (1, 3)
    assert plan_merge(batches(8, 1, 1, 1)) == (1, 3)  # 1+1 is not below 2 * 1
    assert plan_merge(batches(0, 0)) == (0, 2)  # empty batches merge too
    with pytest.raises(InvalidUsage):
        plan_merge(batches(1, 1), max_batches_per_merge=1)


def test_merged_batch_is_written_in_parts_and_keeps_old_parts() -> None:
    blob = MemoryBlob()
    machine = new_machine(blob)
    for ts in range(4):
        append(machine, blob, [(key(i), b"v%d" % ts, 0, 1) for i in range(30)], part_rows=7)
        if ts:
            append_retract = [(key(i), b"v%d" % (ts - 1), 0, -1) for i in range(30)]
            append(machine, blob, append_retract, part_rows=7)
    advance_since(machine, 6)
    state = machine.state()
    old_keys = set(state.referenced_blob_keys())
    result = compact(machine, blob, merge_all=True, part_rows=10, batch_rows=4)
    after = result.state
    assert result.merges >= 1 and len(after.batches) == 1
    merged = after.batches[0]
    assert (merged.lower, merged.upper, merged.since) == (0, 7, 6)
    # At since 6 everything but the latest value of each key consolidated away.
    assert merged.num_updates == 30 and len(merged.parts) == 3
    assert old_keys <= {m.key for m in blob.list_keys(f"{SHARD}/part/")}
    assert rows_of(read_all(snapshot(blob, after, 6))) == [
        (key(i), b"v3", 6, 1) for i in range(30)
    ]


def test_commit_is_refused_and_parts_deleted_when_batches_changed_meanwhile() -> None:
    blob = MemoryBlob()
    machine = new_machine(blob)
    for ts in range(3):
        append(machine, blob, [(key(ts), b"r", 0, 1)] * 40)
    state = machine.state()
    run = state.batches[0:2]
    merged = merge_batches(blob, SHARD, run, state.since, inline_threshold=0)
    new_keys = {p.key for p in merged.parts if isinstance(p, BlobPart)}
    assert new_keys and all(blob.get(k) is not None for k in new_keys)
    # Someone else compacts first: our run is no longer present.
    other = Machine(machine.versions)
    assert compact(other, blob, merge_all=True).merges == 1
    committed, current = commit_merge(machine, blob, run, merged)
    assert not committed and len(current.batches) == 1
    assert all(blob.get(k) is None for k in new_keys)


def test_compaction_respects_leased_readers_and_rejects_since_beyond_frontier() -> None:
    blob = MemoryBlob()
    machine = new_machine(blob)
    for ts in range(4):
        append(machine, blob, [(key(1), b"v%d" % ts, 0, 1)])
    advance_since(machine, 3)
    machine.apply(
        lambda s: s.evolve(leased_readers={"r": ReaderState(since=1, seqno=s.seqno,
                                                            last_heartbeat_ms=0,
                                                            lease_duration_ms=1000)})
    )
    with pytest.raises(InvalidUsage, match="beyond the compaction frontier 1"):
        compact(machine, blob, since=2)
    result = compact(machine, blob, merge_all=True)
    assert result.state.batches[0].since == 1
    # The reader can still read at its since.
    assert rows_of(read_all(snapshot(blob, result.state.evolve(since=1), 1))) == [
        (key(1), b"v0", 1, 1), (key(1), b"v1", 1, 1)
    ]


# --- indeterminate commits ("Nothing lost, ever", item 3) ---------------------------------


def flaky_machine(
    blob: Blob, rates: FaultRates, *, seed: int = 0, stale_reads: int = 1
) -> tuple[Machine, UnreliableConsensus, MemoryConsensus]:
    """A machine on an unreliable consensus, its shard created with faults off."""
    inner = MemoryConsensus()
    flaky = UnreliableConsensus(inner, seed=seed, rates=rates, stale_reads=stale_reads)
    with flaky.reliable():
        versions = StateVersions(flaky, blob, SHARD)
        versions.maybe_init_shard()
    return Machine(versions, rollup_every=8), flaky, inner


def assert_referenced_blobs_exist(inner: MemoryConsensus, blob: Blob) -> ShardState:
    """Every blob a live state references exists; returns the current state."""
    versions = StateVersions(inner, blob, SHARD)
    for state in versions.fetch_all_live_states():
        missing = [k for k in state.referenced_blob_keys() if blob.get(k) is None]
        assert not missing, f"state {state.seqno} references deleted blobs {missing}"
    return versions.fetch_current_state()


def test_a_merge_that_committed_then_timed_out_keeps_its_parts_when_seen_late() -> None:
    """The compare-and-set of the merge commits but reports a timeout, and the first
    read after it does not see the commit yet. Compaction must not conclude "not
    committed" and delete the parts the current state now references."""
    blob = MemoryBlob()
    machine, flaky, inner = flaky_machine(blob, FaultRates(0, 0, effect_then_timeout=1.0))
    with flaky.reliable():
        for ts in range(3):
            append(machine, blob, [(key(ts), b"r", 0, 1)] * 40)
        before = contents(blob, machine.state())
    result = compact(machine, blob, merge_all=True, inline_threshold=0)
    assert result.merges == 1 and result.failed_commits == 0
    assert flaky.injected["effect_then_timeout"] >= 1 and flaky.stale_reads_served >= 1
    current = assert_referenced_blobs_exist(inner, blob)
    assert len(current.batches) == 1  # the merge did land
    assert contents(blob, current) == before


def test_commit_merge_reports_a_commit_seen_late_as_committed() -> None:
    blob = MemoryBlob()
    machine, flaky, inner = flaky_machine(blob, FaultRates(0, 0, effect_then_timeout=1.0))
    with flaky.reliable():
        for ts in range(3):
            append(machine, blob, [(key(ts), b"r", 0, 1)] * 40)
        state = machine.state()
    run = state.batches[0:2]
    merged = merge_batches(blob, SHARD, run, state.since, inline_threshold=0)
    committed, current = commit_merge(machine, blob, run, merged)
    assert committed and merged in current.batches
    assert assert_referenced_blobs_exist(inner, blob) == current


@pytest.mark.parametrize("seed", range(12))
def test_compaction_under_unreliable_consensus_never_loses_a_referenced_blob(
    seed: int,
) -> None:
    """Appends and compactions, each step under seeded consensus faults (failures,
    timeouts, commits that time out and are then seen late); after every step every
    blob a live state references exists and the contents are the model's."""
    rng = random.Random(seed)
    blob = MemoryBlob()
    rates = FaultRates(fail=0.15, timeout=0.15, effect_then_timeout=0.2)
    machine, flaky, inner = flaky_machine(blob, rates, seed=seed, stale_reads=rng.choice([1, 2]))
    model: list[Update] = []
    for step in range(14):
        rows = [(key(rng.randrange(6)), rng.choice([b"x", b"y"]), 0, 1) for _ in range(6)]
        with flaky.reliable():
            upper = machine.state().upper
            append(machine, blob, rows)
            model.extend((k, r, upper, d) for k, r, _, d in rows)
            if step % 3 == 2:
                advance_since(machine, upper - 1)
        # An honest "failed" or "cannot tell" may surface; what matters is what remains.
        with contextlib.suppress(LocationError):
            compact(machine, blob, merge_all=rng.random() < 0.3, inline_threshold=0,
                    part_rows=5)
        current = assert_referenced_blobs_exist(inner, blob)
        snaps, _ = contents(blob, current)
        assert snaps[-1] == model_snapshot(model, current.upper - 1, positive_only=False)
    assert flaky.injected["effect_then_timeout"] > 0 and flaky.stale_reads_served > 0


class MisjudgingMachine(Machine):
    """Commits the transition, then behaves as if it had not: it re-runs the transition
    on the state its commit produced (which finds the run gone and asks for no change)
    and returns the state from before, as an unsound "not committed" verdict would."""

    def apply(self, fn: Transition, *, max_retries: int | None = None) -> ShardState:
        before = self.cached_state()
        after = super().apply(fn, max_retries=max_retries)
        assert after.seqno == before.seqno + 1 and fn(after) is None
        return before


def test_cleanup_after_a_misjudged_commit_deletes_nothing_a_state_references() -> None:
    """Whatever the commit path claims, the merged parts are deleted only when the
    re-read states prove that no state references them."""
    blob = MemoryBlob()
    machine = new_machine(blob)
    for ts in range(3):
        append(machine, blob, [(key(ts), b"r", 0, 1)] * 40)
    before = contents(blob, machine.state())
    misjudging = MisjudgingMachine(machine.versions)
    state = misjudging.state()
    run = state.batches[0:2]
    merged = merge_batches(blob, SHARD, run, state.since, inline_threshold=0)
    committed, _ = commit_merge(misjudging, blob, run, merged)
    assert not committed  # the misjudged answer ...
    current = machine.state()
    assert merged in current.batches  # ... yet the merge landed
    assert all(blob.get(p.key) is not None for p in merged.parts if isinstance(p, BlobPart))
    assert contents(blob, current) == before


def _run_planner(weights: list[int], planner: str, fan_in: int = 64) -> tuple[list[int], int]:
    """The weights after merging by ``planner`` until it has nothing to do (a merged
    batch weighs its batches' sum), and the number of merges."""
    sizes = list(weights)
    merges = 0
    while True:
        fake = [_FakeBatch(n) for n in sizes]
        if planner == "pairwise":
            plan = plan_merge(fake)  # type: ignore[arg-type]
        else:
            plan = plan_backlog(fake, max_fan_in=fan_in)  # type: ignore[arg-type]
        if plan is None:
            return sizes, merges
        start, end = plan
        sizes[start:end] = [sum(sizes[start:end])]
        merges += 1


class _FakeBatch:
    def __init__(self, num_updates: int) -> None:
        self.num_updates = num_updates


@given(st.lists(st.integers(0, 50), max_size=60), st.sampled_from([2, 3, 64]))
def test_a_backlog_reaches_the_pairwise_tiers_in_fewer_merges(
    weights: list[int], fan_in: int
) -> None:
    pairwise, pairwise_merges = _run_planner(weights, "pairwise")
    backlog, backlog_merges = _run_planner(weights, "backlog", fan_in)
    assert plan_merge([_FakeBatch(n) for n in backlog]) is None  # type: ignore[misc]
    # Never capped here, and every batch weighs its updates (an empty batch weighs 1 to
    # the planner but adds 0 to a merge, so with empty batches the tiers may differ):
    # the very same tiers.
    if fan_in == 64 and all(weights):
        assert backlog == pairwise
        assert backlog_merges <= pairwise_merges


def test_a_backlog_of_one_file_batches_is_a_handful_of_merges() -> None:
    sizes, merges = _run_planner([1] * 100, "backlog")
    _, pairwise = _run_planner([1] * 100, "pairwise")
    assert plan_merge([_FakeBatch(n) for n in sizes]) is None  # type: ignore[misc]
    assert merges <= 8 < pairwise
    with pytest.raises(InvalidUsage):
        plan_backlog([_FakeBatch(1)], max_fan_in=1)  # type: ignore[list-item]


def test_compacting_a_backlog_keeps_every_time_readable() -> None:
    blob = MemoryBlob()
    machine = new_machine(blob)
    rng = random.Random(3)
    for _ in range(40):
        append(machine, blob, [(key(rng.randrange(6)), rng.choice([b"x", b"y"]), 0, 1)])
    before = machine.state()
    expected = contents(blob, before)
    result = compact(machine, blob)
    after = machine.state()
    assert result.merges <= 8 and plan_merge(after.batches) is None
    assert contents(blob, after) == expected


def _backlog_by_pairwise_steps(
    weights: list[int], max_batches_per_merge: int, max_fan_in: int
) -> tuple[int, int] | None:
    """:func:`plan_backlog` as specified: :func:`plan_merge`'s steps simulated from the
    first batch every time until the tiers hold; the first group of several batches."""
    groups = [(i, i + 1, max(w, 1)) for i, w in enumerate(weights)]
    while (step := plan_merge([_FakeBatch(w) for _, _, w in groups],  # type: ignore[misc]
                              max_batches_per_merge=max_batches_per_merge)) is not None:
        start, end = step
        groups[start:end] = [(groups[start][0], groups[end - 1][1],
                              sum(w for _, _, w in groups[start:end]))]
    for start, end, _ in groups:
        if end - start > 1:
            return start, min(end, start + max_fan_in)
    return None


@given(st.lists(st.integers(0, 40), max_size=80), st.sampled_from([2, 3, 8]),
       st.sampled_from([2, 5, 64]))
def test_the_backlog_plan_is_the_pairwise_simulation(
    weights: list[int], per_merge: int, fan_in: int
) -> None:
    fake = [_FakeBatch(w) for w in weights]
    assert plan_backlog(fake, max_batches_per_merge=per_merge,  # type: ignore[arg-type]
                        max_fan_in=fan_in) == _backlog_by_pairwise_steps(weights, per_merge,
                                                                         fan_in)


def test_planning_a_long_backlog_is_not_quadratic() -> None:
    """A run of many small files leaves a backlog of one batch per file, and compaction
    plans once per merge: simulating each step from the first batch again took 16 s of
    CPU for one plan of 10000 batches (95 s for a backlog of 5000 brought to its tiers)."""
    import time

    fake = [_FakeBatch(1) for _ in range(20000)]
    started = time.process_time()
    plan = plan_backlog(fake)  # type: ignore[arg-type]
    assert plan == (0, 64)
    assert time.process_time() - started < 2.0  # ~0.05 s; the quadratic search took ~60 s
