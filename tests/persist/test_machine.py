"""The Machine: compare-and-set with retries, racing writers landing exactly once,
periodic rollups without leaks, and the cached state."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from upsert_core.errors import ConcurrentModification, InvariantViolation, NotReadable
from upsert_core.persist.keys import rollup_prefix
from upsert_core.persist.location import (
    Blob,
    BlobMetadata,
    CasResult,
    Consensus,
    SeqNo,
    VersionedData,
)
from upsert_core.persist.location.blob_local import LocalBlob
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.location.consensus_sql import SqlConsensus
from upsert_core.persist.location.unreliable import FaultRates, UnreliableBlob, UnreliableConsensus
from upsert_core.persist.state.machine import Machine
from upsert_core.persist.state.state import ErrorBatch, HollowBatch, InlinePart, ShardState
from upsert_core.persist.state.state_versions import StateVersions, check_invariants
from upsert_core.persist.testing import DelegatingBlob

Stores = tuple[Consensus, Blob]
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@pytest.fixture(params=["memory", "sqlite+local"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    if request.param == "memory":
        yield MemoryConsensus(), MemoryBlob()
        return
    consensus = SqlConsensus(f"sqlite:///{tmp_path}/consensus.db")
    yield consensus, LocalBlob(tmp_path / "blob")
    consensus.close()


def counter(state: ShardState) -> int:
    return int(state.config.get("n", "0"))


def bump(state: ShardState) -> ShardState:
    return state.evolve(config={**state.config, "n": str(counter(state) + 1)})


def new_machine(stores: Stores, shard: str, **kwargs: int) -> Machine:
    versions = StateVersions(stores[0], stores[1], shard)
    versions.maybe_init_shard()
    return Machine(versions, **kwargs)


def stored_rollups(blob: Blob, shard: str) -> set[str]:
    return {m.key for m in blob.list_keys(rollup_prefix(shard))}


class CountingConsensus:
    """Counts calls per method of an inner consensus."""

    def __init__(self, inner: Consensus) -> None:
        self.inner = inner
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def head(self, key: str) -> VersionedData | None:
        self._count("head")
        return self.inner.head(key)

    def compare_and_set(self, key: str, expected: SeqNo | None, new: VersionedData) -> CasResult:
        self._count("compare_and_set")
        return self.inner.compare_and_set(key, expected, new)

    def scan(self, key: str, from_seqno: SeqNo, limit: int) -> list[VersionedData]:
        self._count("scan")
        return self.inner.scan(key, from_seqno, limit)

    def truncate(self, key: str, seqno: SeqNo) -> int:
        return self.inner.truncate(key, seqno)

    def list_keys(self) -> Iterator[str]:
        return self.inner.list_keys()


class HookedSetBlob(DelegatingBlob):
    """A blob that runs a hook once, before the first ``set``."""

    def __init__(self, inner: Blob, hook: object) -> None:
        super().__init__(inner)
        self.hook = hook

    def set(self, key: str, value: bytes) -> None:
        hook, self.hook = self.hook, None
        if callable(hook):
            hook()
        self.inner.set(key, value)

    def list_keys(self, prefix: str) -> Iterator[BlobMetadata]:
        return self.inner.list_keys(prefix)



# --- single writer ----------------------------------------------------------------------


def test_apply_bumps_seqno_and_keeps_walltime_monotonic(stores: Stores) -> None:
    times = iter([10**13, 5, 10**13 + 7])
    machine = new_machine(stores, "stamp", clock_ms=lambda: next(times))
    s2 = machine.apply(bump)
    s3 = machine.apply(bump)
    s4 = machine.apply(bump)
    assert [s.seqno for s in (s2, s3, s4)] == [2, 3, 4]
    assert [s.walltime_ms for s in (s2, s3, s4)] == [10**13, 10**13, 10**13 + 7]
    assert machine.versions.fetch_current_state() == s4 and counter(s4) == 3


def test_no_change_writes_nothing(stores: Stores) -> None:
    machine = new_machine(stores, "noop")
    before = machine.apply(bump)
    assert machine.apply(lambda s: None) == before
    assert machine.versions.head_seqno() == before.seqno


def test_cached_state_saves_fetches_when_no_one_else_writes(stores: Stores) -> None:
    counting = CountingConsensus(stores[0])
    machine = new_machine((counting, stores[1]), "cache", rollup_every=1000)
    machine.apply(bump)
    counting.calls.clear()
    for _ in range(5):
        machine.apply(bump)
    assert counting.calls == {"compare_and_set": 5}


def test_no_change_on_a_stale_cache_is_rechecked_on_the_fresh_state(stores: Stores) -> None:
    a = new_machine(stores, "stale-none")
    b = Machine(StateVersions(stores[0], stores[1], "stale-none"))
    a.apply(lambda s: s.evolve(config={"n": "0"}))
    b.apply(bump)  # a's cache still says n == 0

    def flag_when_bumped(s: ShardState) -> ShardState | None:
        if counter(s) == 0 or "flag" in s.config:
            return None
        return s.evolve(config={**s.config, "flag": "y"})

    result = a.apply(flag_when_bumped)
    assert result.config == {"n": "1", "flag": "y"}
    assert a.apply(flag_when_bumped) == result


def test_an_error_on_a_stale_cache_is_retried_on_the_fresh_state(stores: Stores) -> None:
    a = new_machine(stores, "stale-err")
    b = Machine(StateVersions(stores[0], stores[1], "stale-err"))
    a.apply(lambda s: s.evolve(config={"n": "0"}))
    b.apply(bump)
    calls: list[int] = []

    def needs_one(s: ShardState) -> ShardState:
        calls.append(counter(s))
        if counter(s) != 1:
            raise NotReadable(f"n is {counter(s)}")
        return s.evolve(config={**s.config, "ok": "1"})

    assert a.apply(needs_one).config["ok"] == "1"
    assert calls == [0, 1]
    calls.clear()
    # An error on the fresh state too is the caller's: it propagates, nothing commits.
    with pytest.raises(NotReadable, match="n is 5"):
        a.apply(lambda s: needs_one(s.evolve(config={"n": "5"})))
    assert calls == [5, 5]
    assert "ok" in a.state().config and counter(a.state()) == 1


def test_a_transition_that_breaks_invariants_commits_nothing(stores: Stores) -> None:
    machine = new_machine(stores, "broken")
    before = machine.apply(bump)
    with pytest.raises(InvariantViolation, match="since"):
        machine.apply(lambda s: s.evolve(since=5))
    assert machine.state() == before


def test_gives_up_after_max_retries_with_concurrent_modification(stores: Stores) -> None:
    machine = new_machine(stores, "give-up")
    rival = Machine(StateVersions(stores[0], stores[1], "give-up"))
    calls: list[int] = []

    def always_loses(s: ShardState) -> ShardState:
        calls.append(s.seqno)
        rival.apply(bump)  # someone else commits before our compare-and-set
        return s.evolve(config={**s.config, "mine": "1"})

    with pytest.raises(ConcurrentModification, match="losing 4 compare-and-set races"):
        machine.apply(always_loses, max_retries=3)
    assert len(calls) == 4 and calls == sorted(calls)
    assert "mine" not in machine.state().config


def test_committed_states_are_canonical_so_readers_rebuild_them_equal(stores: Stores) -> None:
    machine = new_machine(stores, "canon")
    part = InlinePart(b"e", 1)

    def append_out_of_order(s: ShardState) -> ShardState:
        batch = HollowBatch(0, 3, 0, (part,))
        errors = (ErrorBatch(2, part, 1), ErrorBatch(0, part, 2), ErrorBatch(2, part, 3))
        return s.evolve(upper=3, batches=(batch,), errors=errors)

    state = machine.apply(append_out_of_order)
    assert [(e.ts, e.num_errors) for e in state.errors] == [(0, 2), (2, 1), (2, 3)]
    assert machine.versions.fetch_current_state() == state


# --- rollups ------------------------------------------------------------------------------


def test_rolls_up_every_n_seqnos(stores: Stores) -> None:
    machine = new_machine(stores, "cadence", rollup_every=4)
    for _ in range(12):
        machine.apply(bump)
    state = machine.state()
    # Rollup of state s is recorded by the follow-up transition at s + 1.
    assert sorted(state.rollups) == [1, 5, 9, 13]
    assert stored_rollups(stores[1], "cadence") == {r.key for r in state.rollups.values()}
    assert counter(state) == 12 and check_invariants(machine.versions) == []


def test_a_rollup_beaten_by_a_newer_one_is_deleted(stores: Stores) -> None:
    rival = Machine(StateVersions(stores[0], stores[1], "beaten"), rollup_every=1)
    hooked = HookedSetBlob(stores[1], None)
    machine = Machine(StateVersions(stores[0], hooked, "beaten"), rollup_every=2)
    machine.versions.maybe_init_shard()
    hooked.hook = lambda: rival.apply(bump)
    machine.apply(bump)
    machine.apply(bump)  # seqno 3: writes a rollup; meanwhile the rival records one at 4
    state = machine.state()
    assert sorted(state.rollups) == [1, 4]
    assert stored_rollups(stores[1], "beaten") == {r.key for r in state.rollups.values()}
    assert check_invariants(machine.versions) == []


# --- racing writers -------------------------------------------------------------------------


def race_counters(stores: Stores, shard: str, threads: int, each: int) -> ShardState:
    """``threads`` machines each add 1 to the counter ``each`` times, concurrently."""
    StateVersions(stores[0], stores[1], shard).maybe_init_shard({"n": "0"})
    barrier = threading.Barrier(threads)
    failures: list[BaseException] = []

    def work() -> None:
        machine = Machine(StateVersions(stores[0], stores[1], shard), rollup_every=3)
        barrier.wait()
        try:
            for _ in range(each):
                machine.apply(bump)
        except BaseException as exc:  # reported below, the thread must not die silently
            failures.append(exc)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert failures == []
    return StateVersions(stores[0], stores[1], shard).fetch_current_state()


def assert_each_increment_landed_once(stores: Stores, shard: str, total: int) -> None:
    versions = StateVersions(stores[0], stores[1], shard)
    states = list(versions.fetch_all_live_states())
    steps = [counter(b) - counter(a) for a, b in zip(states, states[1:], strict=False)]
    assert set(steps) <= {0, 1}  # 0: a rollup being recorded
    assert sum(steps) == total == counter(states[-1])
    assert stored_rollups(stores[1], shard) == {r.key for r in states[-1].rollups.values()}
    assert check_invariants(versions) == []


def test_racing_machines_land_every_increment_exactly_once(stores: Stores) -> None:
    race_counters(stores, "racing", threads=4, each=15)
    assert_each_increment_landed_once(stores, "racing", 60)


def test_racing_machines_on_unreliable_stores(stores: Stores) -> None:
    rates = FaultRates(fail=0.03, timeout=0.03, effect_then_timeout=0.03)
    consensus = UnreliableConsensus(stores[0], seed=7, rates=rates)
    blob = UnreliableBlob(stores[1], seed=8, rates=rates)
    with consensus.reliable(), blob.reliable():
        StateVersions(consensus, blob, "flaky").maybe_init_shard({"n": "0"})
    race_counters((consensus, blob), "flaky", threads=3, each=10)
    assert sum(consensus.injected.values()) > 0
    assert_each_increment_landed_once(stores, "flaky", 30)


@pytest.mark.postgres
def test_racing_machines_on_postgres(tmp_path: Path) -> None:
    consensus = SqlConsensus(PG_URL)
    try:
        stores: Stores = (consensus, LocalBlob(tmp_path / "blob"))
        shard = f"h4-race-{uuid.uuid4().hex[:12]}"
        race_counters(stores, shard, threads=4, each=10)
        assert_each_increment_landed_once(stores, shard, 40)
    finally:
        consensus.close()
