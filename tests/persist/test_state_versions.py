"""State versions on MemoryConsensus + MemoryBlob and on SqlConsensus (SQLite) + LocalBlob:
init (and its race), fetch with GC races, compare-and-set, truncation, invariants."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from upsert_core.errors import (
    CorruptData,
    IndeterminateError,
    InvalidStateDiff,
    InvalidUsage,
    InvariantViolation,
    ShardNotFound,
)
from upsert_core.persist.keys import parse_rollup_seqno, rollup_prefix
from upsert_core.persist.location import (
    Blob,
    BlobMetadata,
    CasCommitted,
    CasMismatch,
    Consensus,
    VersionedData,
)
from upsert_core.persist.location.blob_local import LocalBlob
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.location.consensus_sql import SqlConsensus
from upsert_core.persist.location.unreliable import FaultRates, UnreliableConsensus
from upsert_core.persist.maintenance.gc import rollup_current
from upsert_core.persist.state.codec_state import encode_diff
from upsert_core.persist.state.machine import Machine
from upsert_core.persist.state.state import HollowBatch, InlinePart, ReaderState, ShardState
from upsert_core.persist.state.state_diff import FieldDiff, StateDiff, Update
from upsert_core.persist.state.state_versions import (
    StateMismatch,
    StateVersions,
    assert_invariants,
    check_invariants,
)
from upsert_core.persist.testing import DelegatingBlob

Stores = tuple[Consensus, Blob]


@pytest.fixture(params=["memory", "sqlite+local"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    if request.param == "memory":
        yield MemoryConsensus(), MemoryBlob()
        return
    consensus = SqlConsensus(f"sqlite:///{tmp_path}/consensus.db")
    yield consensus, LocalBlob(tmp_path / "blob")
    consensus.close()


class HookBlob(DelegatingBlob):
    """A blob that runs a hook (once) before getting or setting chosen keys."""

    def __init__(self, inner: Blob) -> None:
        super().__init__(inner)
        self.before_get: dict[str, Callable[[], None]] = {}
        self.before_set: Callable[[str], None] | None = None
        self.gets: list[str] = []

    def get(self, key: str) -> bytes | None:
        self.gets.append(key)
        hook = self.before_get.pop(key, None)
        if hook is not None:
            hook()
        return self.inner.get(key)

    def set(self, key: str, value: bytes) -> None:
        hook, self.before_set = self.before_set, None
        if hook is not None:
            hook(key)
        self.inner.set(key, value)

    def list_keys(self, prefix: str) -> Iterator[BlobMetadata]:
        return self.inner.list_keys(prefix)



def bump(state: ShardState) -> ShardState:
    return state.evolve(config={**state.config, "n": str(int(state.config.get("n", "0")) + 1)})


def rollup_keys(blob: Blob, shard: str) -> set[str]:
    return {m.key for m in blob.list_keys(rollup_prefix(shard))}


def gc_to_new_rollup(machine: Machine) -> int:
    """A GC pass: roll up the current state, drop older rollups, delete them, truncate."""
    versions = machine.versions
    state = machine.state()
    if state.seqno in state.rollups:
        return state.seqno  # the current state is its own rollup already
    ref = versions.write_rollup(state)
    old = [r.key for s, r in state.rollups.items() if s < ref.seqno]
    machine.apply(lambda s: s.evolve(rollups={ref.seqno: ref}))
    for key in old:
        versions.delete_rollup(key)
    versions.truncate(ref.seqno)
    return ref.seqno


# --- init -------------------------------------------------------------------------------


def test_init_writes_rollup_then_seqno_1_and_is_idempotent(stores: Stores) -> None:
    consensus, blob = stores
    versions = StateVersions(consensus, blob, "init")
    with pytest.raises(ShardNotFound):
        versions.fetch_current_state()
    with pytest.raises(ShardNotFound):
        versions.fetch_all_live_states()
    assert versions.earliest_live_seqno() is None
    assert check_invariants(versions) == [
        "shard 'init': not initialised (no versions in Consensus)"
    ]

    state = versions.maybe_init_shard({"k": "v"}, walltime_ms=7)
    assert (state.seqno, dict(state.config), state.walltime_ms) == (1, {"k": "v"}, 7)
    assert list(state.rollups) == [1]
    assert rollup_keys(blob, "init") == {state.rollups[1].key}
    assert versions.maybe_init_shard({"k": "other"}) == state
    assert versions.fetch_current_state() == state
    assert list(versions.fetch_all_live_states()) == [state]
    assert check_invariants(versions) == []


def test_init_race_loser_deletes_its_rollup(stores: Stores) -> None:
    consensus, blob = stores
    winner = StateVersions(consensus, blob, "race")
    hooked = HookBlob(blob)
    loser = StateVersions(consensus, hooked, "race")
    won: list[ShardState] = []
    # The winner runs its whole init while the loser is about to write its rollup.
    hooked.before_set = lambda _key: won.append(winner.maybe_init_shard({"who": "winner"}))

    state = loser.maybe_init_shard({"who": "loser"})

    assert state == won[0] and state.config["who"] == "winner"
    assert rollup_keys(blob, "race") == {state.rollups[1].key}
    assert check_invariants(winner) == []


def _race_init(stores: Stores, shard: str, n: int) -> list[ShardState]:
    barrier = threading.Barrier(n)
    results: list[ShardState] = []

    def init(i: int) -> None:
        versions = StateVersions(stores[0], stores[1], shard)
        barrier.wait()
        results.append(versions.maybe_init_shard({"who": str(i)}))

    threads = [threading.Thread(target=init, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_init_race_from_threads_leaves_one_rollup(stores: Stores) -> None:
    for round_ in range(3):
        shard = f"threads-{round_}"
        results = _race_init(stores, shard, 4)
        assert len(results) == 4 and all(r == results[0] for r in results)
        assert rollup_keys(stores[1], shard) == {results[0].rollups[1].key}


def test_init_with_indeterminate_cas_that_committed_keeps_the_rollup(stores: Stores) -> None:
    consensus, blob = stores
    flaky = UnreliableConsensus(consensus, seed=1, rates=FaultRates(0, 0, 1.0))
    versions = StateVersions(flaky, blob, "indet")
    state = versions.maybe_init_shard()
    assert flaky.injected["effect_then_timeout"] >= 1
    assert rollup_keys(blob, "indet") == {state.rollups[1].key}
    assert StateVersions(consensus, blob, "indet").fetch_current_state() == state


# --- compare and set ----------------------------------------------------------------------


def test_compare_and_set_commits_or_returns_the_fresh_state(stores: Stores) -> None:
    consensus, blob = stores
    a = StateVersions(consensus, blob, "cas")
    b = StateVersions(consensus, blob, "cas")
    s1 = a.maybe_init_shard()
    s2 = bump(s1).evolve(seqno=2)
    assert a.try_compare_and_set_current(s1, s2) == CasCommitted()
    stale = b.try_compare_and_set_current(s1, bump(bump(s1)).evolve(seqno=2))
    assert stale == StateMismatch(s2)
    # Two versions behind: the mismatch is resolved by a full fetch.
    s3 = bump(s2).evolve(seqno=3)
    assert a.try_compare_and_set_current(s2, s3) == CasCommitted()
    assert b.try_compare_and_set_current(s1, s2) == StateMismatch(s3)
    with pytest.raises(InvalidUsage, match="must be expected seqno"):
        a.try_compare_and_set_current(s3, s3.evolve(seqno=5))
    with pytest.raises(InvalidUsage, match="shard"):
        a.try_compare_and_set_current(s3, ShardState("other", 4))


@pytest.mark.parametrize("stale_reads", [0, 1, 3])
def test_a_commit_that_timed_out_is_committed_even_when_reads_see_it_late(
    stores: Stores, stale_reads: int
) -> None:
    """"Did it, then timed out", with the verification read not (yet) seeing it: the
    outcome is settled by the taken seqno, never guessed from a read that lags."""
    consensus, blob = stores
    flaky = UnreliableConsensus(consensus, seed=0, rates=FaultRates(0, 0, 1.0),
                                stale_reads=stale_reads)
    versions = StateVersions(flaky, blob, "late")
    with flaky.reliable():
        s1 = versions.maybe_init_shard()
    s2 = bump(s1).evolve(seqno=2)
    assert versions.try_compare_and_set_current(s1, s2) == CasCommitted()
    assert flaky.stale_reads_served >= min(stale_reads, 1)
    assert [v.seqno for v in consensus.scan("late", 0, 10)] == [1, 2]
    assert StateVersions(consensus, blob, "late").fetch_current_state() == s2


def test_a_timeout_before_the_work_is_retried_with_the_same_bytes(stores: Stores) -> None:
    consensus, blob = stores
    flaky = UnreliableConsensus(consensus, seed=0, rates=FaultRates(0, 0.5, 0))
    versions = StateVersions(flaky, blob, "retry")
    with flaky.reliable():
        state = versions.maybe_init_shard()
    for _ in range(12):
        new = bump(state).evolve(seqno=state.seqno + 1)
        assert versions.try_compare_and_set_current(state, new) == CasCommitted()
        state = new
    assert flaky.injected["timeout"] > 0
    with flaky.reliable():
        assert versions.fetch_current_state() == state


@pytest.mark.parametrize("seed", range(4))
def test_machine_rollups_whose_recording_was_seen_late_are_kept(
    stores: Stores, seed: int
) -> None:
    """Half the compare-and-sets commit, time out, and the next read misses them. A
    rollup whose recording landed must not be deleted: the current state would name a
    missing rollup and no one could read the shard (the old verdict did this on every
    seed). The transitions are idempotent ("set n to i"): the old verdict also applied
    a non-idempotent one again on the state its own commit produced."""
    consensus, blob = stores
    flaky = UnreliableConsensus(
        consensus, seed=seed, rates=FaultRates(0, 0, 0.5), stale_reads=1
    )
    versions = StateVersions(flaky, blob, "late-machine")
    with flaky.reliable():
        versions.maybe_init_shard()
    machine = Machine(versions, rollup_every=2)

    def set_n(i: int) -> Callable[[ShardState], ShardState | None]:
        def fn(state: ShardState) -> ShardState | None:
            n = str(i)
            return None if state.config.get("n") == n else state.evolve(config={"n": n})

        return fn

    for i in range(1, 21):
        machine.apply(set_n(i))
    machine.rollup_every = 100
    machine.apply(set_n(21))
    machine.apply(set_n(22))
    ref = rollup_current(machine)
    assert flaky.stale_reads_served > 0
    plain = StateVersions(consensus, blob, "late-machine")
    assert_invariants(plain)
    current = plain.fetch_current_state()
    assert current.config["n"] == "22"
    assert ref is not None and current.rollups[ref.seqno] == ref
    assert {r.key for r in current.rollups.values()} <= rollup_keys(blob, "late-machine")


class BlackHoleConsensus:
    """Every compare-and-set times out without effect; reads work."""

    def __init__(self, inner: Consensus) -> None:
        self.inner = inner
        self.cas_calls = 0

    def head(self, key: str) -> VersionedData | None:
        return self.inner.head(key)

    def compare_and_set(
        self, key: str, expected: int | None, new: VersionedData
    ) -> CasCommitted | CasMismatch:
        self.cas_calls += 1
        raise IndeterminateError("timed out")

    def scan(self, key: str, from_seqno: int, limit: int) -> list[VersionedData]:
        return self.inner.scan(key, from_seqno, limit)

    def truncate(self, key: str, seqno: int) -> int:
        return self.inner.truncate(key, seqno)

    def list_keys(self) -> Iterator[str]:
        return self.inner.list_keys()


def test_an_outcome_that_stays_unknown_is_indeterminate_not_a_guess(stores: Stores) -> None:
    consensus, blob = stores
    s1 = StateVersions(consensus, blob, "hole").maybe_init_shard()
    before = consensus.scan("hole", 0, 10)
    hole = BlackHoleConsensus(consensus)
    versions = StateVersions(hole, blob, "hole")
    with pytest.raises(IndeterminateError, match="could not be established"):
        versions.try_compare_and_set_current(s1, bump(s1).evolve(seqno=2))
    assert hole.cas_calls == 1 + versions.location_attempts
    assert consensus.scan("hole", 0, 10) == before


def test_a_diff_that_does_not_apply_fails_loudly(stores: Stores) -> None:
    consensus, blob = stores
    versions = StateVersions(consensus, blob, "bad-diff")
    s1 = versions.maybe_init_shard({"x": "real"})
    bad = StateDiff(
        "bad-diff", 1, 2, s1.rollups[1].key, (FieldDiff("config", "x", Update("wrong", "y")),)
    )
    assert consensus.compare_and_set("bad-diff", 1, VersionedData(2, encode_diff(bad)))
    with pytest.raises(InvalidStateDiff, match="field 'config' key 'x'"):
        versions.fetch_current_state()
    assert consensus.compare_and_set("bad-diff", 2, VersionedData(3, b"garbage"))
    with pytest.raises(CorruptData):
        versions.fetch_current_state()


# --- GC races -------------------------------------------------------------------------------


def test_rollup_deleted_while_reader_fetches_is_retried(stores: Stores) -> None:
    consensus, blob = stores
    writer = Machine(StateVersions(consensus, blob, "gc"), rollup_every=1000)
    writer.versions.maybe_init_shard()
    for _ in range(5):
        writer.apply(bump)
    old_key = writer.state().rollups[1].key
    hooked = HookBlob(blob)
    reader = StateVersions(consensus, hooked, "gc")
    gc_seqnos: list[int] = []
    # The reader has read the head naming `old_key`; GC replaces and deletes it.
    hooked.before_get[old_key] = lambda: gc_seqnos.append(gc_to_new_rollup(writer))

    state = reader.fetch_current_state()

    assert hooked.gets[0] == old_key and len(hooked.gets) == 2  # one retry
    assert state == writer.state() and state.config["n"] == "5"
    assert reader.earliest_live_seqno() == gc_seqnos[0]
    assert check_invariants(reader) == []


def test_earliest_rollup_deleted_while_listing_live_states_is_retried(stores: Stores) -> None:
    consensus, blob = stores
    writer = Machine(StateVersions(consensus, blob, "gc-all"), rollup_every=1000)
    writer.versions.maybe_init_shard()
    writer.apply(bump)
    first = gc_to_new_rollup(writer)
    for _ in range(3):
        writer.apply(bump)
    hooked = HookBlob(blob)
    reader = StateVersions(consensus, hooked, "gc-all")
    earliest_key = writer.state().rollups[first].key
    gc_seqnos: list[int] = []
    hooked.before_get[earliest_key] = lambda: gc_seqnos.append(gc_to_new_rollup(writer))

    states = list(reader.fetch_all_live_states())

    current = writer.state()
    assert states[-1] == current
    assert [s.seqno for s in states] == list(range(states[0].seqno, current.seqno + 1))
    assert states[0].seqno > first and states[0].seqno in current.rollups
    assert gc_seqnos and gc_seqnos[0] == states[0].seqno


def test_a_rollup_that_keeps_vanishing_gives_a_clear_error(stores: Stores) -> None:
    consensus, blob = stores
    versions = StateVersions(consensus, blob, "vanish", fetch_attempts=3)
    state = versions.maybe_init_shard()
    blob.delete(state.rollups[1].key)
    with pytest.raises(InvariantViolation, match="after 3 attempts"):
        versions.fetch_current_state()
    assert any("rollup" in p for p in check_invariants(versions))


# --- truncation --------------------------------------------------------------------------


def test_truncate_keeps_a_rollup_reachable_and_the_newest_version(stores: Stores) -> None:
    consensus, blob = stores
    versions = StateVersions(consensus, blob, "trunc")
    versions.maybe_init_shard()
    machine = Machine(versions, rollup_every=3)
    for _ in range(10):
        machine.apply(bump)
    current = machine.state()
    rollups = sorted(current.rollups)
    assert rollups[0] == 1 and len(rollups) >= 3
    with pytest.raises(InvalidUsage, match="beyond the current seqno"):
        versions.truncate(current.seqno + 1)
    with pytest.raises(InvalidUsage, match="no rollup is recorded"):
        versions.truncate(rollups[1] + 1)
    target = rollups[-1]
    machine.apply(lambda s: s.evolve(leased_readers={"r": ReaderState(0, rollups[1], 0, 10)}))
    with pytest.raises(InvalidUsage, match="a leased reader holds seqno"):
        versions.truncate(target)

    assert versions.truncate(rollups[1]) == rollups[1] - 1
    assert versions.earliest_live_seqno() == rollups[1]
    assert versions.truncate(rollups[1]) == 0  # already there
    assert check_invariants(versions) == []
    states = list(versions.fetch_all_live_states())
    assert states[0].seqno == rollups[1] and states[-1] == versions.fetch_current_state()

    # With the earliest rollup gone from Blob, the check reports it.
    blob.delete(current.rollups[rollups[1]].key)
    assert any("earliest" in p for p in check_invariants(versions))
    with pytest.raises(InvariantViolation):
        assert_invariants(versions)


# --- property: versions rebuilt from storage equal the writer's states ----------------------


OPS = st.lists(
    st.sampled_from(["bump", "append", "reader", "unreader", "truncate", "gc", "fresh"]),
    max_size=25,
)


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, rollup_every=st.integers(1, 5))
def test_stored_versions_match_the_writer(
    stores: Stores, ops: list[str], rollup_every: int
) -> None:
    consensus, blob = stores
    shard = f"prop-{uuid.uuid4().hex[:12]}"
    versions = StateVersions(consensus, blob, shard)
    versions.maybe_init_shard()
    machine = Machine(versions, rollup_every=rollup_every)
    seen: dict[int, ShardState] = {1: machine.state()}
    for op in ops:
        if op == "bump":
            machine.apply(bump)
        elif op == "append":

            def append(s: ShardState) -> ShardState:
                batch = HollowBatch(s.upper, s.upper + 2, 0, (InlinePart(b"p", 1),))
                return s.evolve(upper=s.upper + 2, batches=(*s.batches, batch))

            machine.apply(append)
        elif op == "reader":
            machine.apply(
                lambda s: s.evolve(leased_readers={"r": ReaderState(s.since, s.seqno, 0, 1)})
            )
        elif op == "unreader":
            machine.apply(lambda s: s.evolve(leased_readers={}) if s.leased_readers else None)
        elif op == "truncate":
            state = machine.state()
            held = min((r.seqno for r in state.leased_readers.values()), default=state.seqno)
            allowed = [r for r in state.rollups if r <= held]
            if allowed:
                versions.truncate(max(allowed))
        elif op == "gc" and not machine.state().leased_readers:
            gc_to_new_rollup(machine)
        elif op == "fresh":
            assert StateVersions(consensus, blob, shard).fetch_current_state() == machine.state()
        seen[machine.cached_state().seqno] = machine.cached_state()

    current = StateVersions(consensus, blob, shard).fetch_current_state()
    assert current == machine.state()
    live = list(versions.fetch_all_live_states())
    assert live[-1] == current
    for state in live:
        state.check_invariants()
        if state.seqno in seen:
            assert state == seen[state.seqno]
        latest = state.latest_rollup()
        assert latest is not None and state.seqno - latest.seqno <= rollup_every + 1
    assert check_invariants(versions) == []
    recorded = {r.key for r in current.rollups.values()}
    stored = rollup_keys(blob, shard)
    # Every recorded rollup at or after earliest exists; the only unrecorded ones are
    # those a GC pass dropped (none here, the helper deletes them).
    earliest = versions.earliest_live_seqno()
    assert earliest is not None
    assert {k for k in recorded if (parse_rollup_seqno(k) or 0) >= earliest} <= stored
    assert stored <= recorded
