"""Commit times: recorded by every commit path, monotone under a clock that goes back,
kept through compaction, GC and rollups, dropped only below since; old states decode;
times resolve to ts exactly as a simple oracle says."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from upsert_core.errors import InvalidUsage, InvariantViolation, NotReadable
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.read.read import read_all
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.codec_state import decode_rollup, decode_state, encode_rollup
from upsert_core.persist.state.commit_times import (
    format_time_ms,
    last_commit_ms,
    resolve_as_of_time,
    resolve_since_time,
    resolve_until_time,
    since_commit_ms,
)
from upsert_core.persist.state.state import COMMIT_TIME_PREFIX, ShardState
from upsert_core.persist.state.state_versions import StateVersions
from upsert_core.persist.write.append import AppendRequest
from upsert_core.read_times import require_time

from .helpers_proc import key, rows_of, updates_table

BASE_MS = 1_700_000_000_000


class Clock:
    """A settable clock (UTC ms)."""

    def __init__(self, now: int = BASE_MS) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def new_shard(clock: Clock, name: str = "times") -> Shard:
    return Shard.open(MemoryConsensus(), MemoryBlob(), name, inline_threshold=0,
                      rollup_every=3, clock_ms=clock)


def append_at(shard: Shard, clock: Clock, ms: int) -> None:
    """Append one batch (a new key each time) with the clock at ``ms``."""
    clock.now = ms
    upper = shard.upper
    assert shard.append(updates_table([(key(upper), b"v%d" % upper, upper, 1)]), upper).committed


def times(state: ShardState) -> dict[int, int]:
    return dict(state.commit_times())


def us(ms: int) -> int:
    return ms * 1000


def test_every_append_records_its_commit_time() -> None:
    clock = Clock()
    shard = new_shard(clock)
    for i in range(4):
        append_at(shard, clock, BASE_MS + 1000 * i)
    state = shard.state()
    assert times(state) == {i: BASE_MS + 1000 * i for i in range(4)}
    assert last_commit_ms(state) == BASE_MS + 3000
    assert since_commit_ms(state) == BASE_MS
    info = shard.inspect()
    assert info["since_time"] == format_time_ms(BASE_MS) == "2023-11-14T22:13:20.000+00:00"
    assert info["last_commit_time"] == format_time_ms(BASE_MS + 3000)


def test_compare_and_append_records_the_commit_time() -> None:
    """The ingest's path: write a batch, then ``Shard.compare_and_append``."""
    clock = Clock(BASE_MS + 5)
    shard = new_shard(clock)
    batch = shard.write_batch(updates_table([(key(0), b"a", 0, 1)]), 0, 1)
    assert shard.compare_and_append(AppendRequest(batch, 0, ingested_files={"f": 0})).committed
    assert times(shard.state()) == {0: BASE_MS + 5}


def test_a_clock_that_goes_back_records_the_previous_time() -> None:
    clock = Clock()
    shard = new_shard(clock)
    append_at(shard, clock, BASE_MS + 5000)
    append_at(shard, clock, BASE_MS + 1000)  # the clock went back
    append_at(shard, clock, BASE_MS + 7000)
    assert times(shard.state()) == {0: BASE_MS + 5000, 1: BASE_MS + 5000, 2: BASE_MS + 7000}


def test_a_batch_of_several_ts_is_one_entry_covering_them() -> None:
    clock = Clock()
    shard = new_shard(clock)
    append_at(shard, clock, BASE_MS)
    clock.now = BASE_MS + 10
    assert shard.append(updates_table([(key(1), b"x", 3, 1)]), 1, 4).committed
    append_at(shard, clock, BASE_MS + 20)
    state = shard.state()
    assert times(state) == {0: BASE_MS, 1: BASE_MS + 10, 4: BASE_MS + 20}
    assert resolve_as_of_time(state, us(BASE_MS + 15)) == 3  # the batch's last ts
    assert resolve_since_time(state, us(BASE_MS + 5)) == 1  # its first


def test_times_survive_compaction_gc_rollups_and_a_fresh_reader() -> None:
    clock = Clock()
    consensus, blob = MemoryConsensus(), MemoryBlob()
    shard = Shard.open(consensus, blob, "kept", inline_threshold=0, rollup_every=2,
                       clock_ms=clock)
    for i in range(10):
        append_at(shard, clock, BASE_MS + 100 * i)
    before = times(shard.state())
    report = shard.gc(leak_grace_ms=0)  # compacts, rolls up, truncates
    state = shard.state()
    assert len(state.batches) < 10 and report is not None
    assert times(state) == before
    # A reader that starts from the newest rollup sees the same times.
    fresh = Shard.open(consensus, blob, "kept", create=False)
    assert times(fresh.state()) == before
    latest = state.latest_rollup()
    assert latest is not None
    rollup = blob.get(latest.key)
    assert rollup is not None
    assert times(decode_rollup(rollup, latest.key)) == {
        ts: ms for ts, ms in before.items() if ts < decode_rollup(rollup, latest.key).upper
    }


def test_gc_retain_drops_the_times_wholly_below_since_and_keeps_what_reads_need() -> None:
    clock = Clock()
    shard = new_shard(clock)
    for i in range(8):
        append_at(shard, clock, BASE_MS + 100 * i)
    shard.gc(retain=3, leak_grace_ms=0)
    state = shard.state()
    assert state.since == 5
    assert times(state) == {ts: BASE_MS + 100 * ts for ts in range(5, 8)}
    assert since_commit_ms(state) == BASE_MS + 500
    # A time before the earliest readable commit is refused, naming the range.
    with pytest.raises(NotReadable, match="readable commit times are 2023-11-14T22:13:20.500"):
        resolve_as_of_time(state, us(BASE_MS + 499))
    assert resolve_as_of_time(state, us(BASE_MS + 500)) == 5
    assert resolve_since_time(state, us(BASE_MS + 500)) == 5
    # The snapshot at the resolved ts reads.
    assert rows_of(read_all(shard.snapshot(resolve_as_of_time(state, us(BASE_MS + 650)))))


def test_a_multi_ts_batch_straddling_since_keeps_its_entry() -> None:
    clock = Clock()
    shard = new_shard(clock)
    clock.now = BASE_MS
    assert shard.append(updates_table([(key(1), b"x", 0, 1)]), 0, 4).committed
    append_at(shard, clock, BASE_MS + 50)
    shard.gc(retain=3, leak_grace_ms=0)  # since 2: inside the first batch
    state = shard.state()
    assert state.since == 2
    assert times(state) == {0: BASE_MS, 4: BASE_MS + 50}
    assert since_commit_ms(state) == BASE_MS
    assert resolve_since_time(state, us(BASE_MS)) == 2  # the first READABLE ts


def test_an_old_shard_has_no_times_for_its_old_ts() -> None:
    """A shard written before times were recorded: its old ts have none; the ts committed
    after the upgrade have theirs; a time needing an old ts is refused."""
    clock = Clock()
    shard = new_shard(clock)
    for i in range(3):
        append_at(shard, clock, BASE_MS + i)

    def forget(state: ShardState) -> ShardState:  # what an older version wrote
        return state.evolve(config={k: v for k, v in state.config.items()
                                    if not k.startswith(COMMIT_TIME_PREFIX)})

    shard.machine.apply(forget)
    state = shard.state()
    assert times(state) == {} and since_commit_ms(state) is None
    assert shard.inspect()["since_time"] is None
    assert shard.inspect()["last_commit_time"] is None
    with pytest.raises(NotReadable, match="no commit time is recorded"):
        resolve_as_of_time(state, us(BASE_MS + 10))
    append_at(shard, clock, BASE_MS + 100)
    append_at(shard, clock, BASE_MS + 200)
    state = shard.state()
    assert times(state) == {3: BASE_MS + 100, 4: BASE_MS + 200}
    assert since_commit_ms(state) is None  # ts 0 (since) has no time
    assert shard.inspect()["last_commit_time"] == format_time_ms(BASE_MS + 200)
    with pytest.raises(NotReadable, match="ts 0 to 2 were committed before the shard"):
        resolve_since_time(state, us(BASE_MS + 99))
    assert resolve_as_of_time(state, us(BASE_MS + 150)) == 3
    assert resolve_since_time(state, us(BASE_MS + 150)) == 4
    assert resolve_until_time(state, us(BASE_MS + 201)) == 5  # none after: the upper


def test_an_old_state_encoding_without_times_decodes() -> None:
    """Bytes as a build before commit times wrote them (format 1, config without times)."""
    old = {
        "v": 1, "t": "state", "shard": "old", "seqno": 4, "since": 0, "upper": 2,
        "walltime_ms": 5, "batches": [[0, 2, 0, []]], "rollups": [], "writers": {},
        "leased_readers": {}, "ingested_files": {"a.jsonl": 0, "b.jsonl": 1},
        "errors": [], "config": {"ingest.key": "id"},
    }
    state = decode_state(json.dumps(old).encode())
    assert state.upper == 2 and state.commit_times() == ()
    assert since_commit_ms(state) is None and last_commit_ms(state) is None
    with pytest.raises(NotReadable):
        resolve_until_time(state, 0)


def test_a_state_with_times_round_trips_through_a_rollup() -> None:
    clock = Clock()
    shard = new_shard(clock)
    append_at(shard, clock, BASE_MS)
    state = shard.state()
    assert decode_rollup(encode_rollup(state), "k").commit_times() == state.commit_times()


def test_invariants_refuse_decreasing_or_malformed_times() -> None:
    clock = Clock()
    shard = new_shard(clock)
    append_at(shard, clock, BASE_MS)
    append_at(shard, clock, BASE_MS + 1)
    state = shard.state()
    state.check_invariants()
    back = state.evolve(config={**state.config, f"{COMMIT_TIME_PREFIX}1": str(BASE_MS - 1)})
    with pytest.raises(InvariantViolation, match="before that of ts 0"):
        back.check_invariants()
    beyond = state.evolve(config={**state.config, f"{COMMIT_TIME_PREFIX}2": str(BASE_MS + 2)})
    with pytest.raises(InvariantViolation, match="upper is 2"):
        beyond.check_invariants()
    bad = state.evolve(config={**state.config, f"{COMMIT_TIME_PREFIX}x": "1"})
    with pytest.raises(InvariantViolation, match="malformed"):
        bad.check_invariants()


def test_state_diff_of_a_commit_carries_one_small_time_entry() -> None:
    """The state stays small: an append adds one config entry to its diff."""
    from upsert_core.persist.state.codec_state import decode_diff

    clock = Clock()
    shard = new_shard(clock, "small")
    for i in range(5):
        append_at(shard, clock, BASE_MS + i)
    versions: StateVersions = shard.versions
    head = versions.consensus.head(versions.shard_id)
    assert head is not None
    diff = decode_diff(head.data)
    config_changes = [c for c in diff.changes if c.field == "config"]
    assert [c.key for c in config_changes] == [f"{COMMIT_TIME_PREFIX}4"]


def test_require_time_reads_datetimes_and_iso_text_as_utc() -> None:
    assert require_time("1970-01-01T00:00:01", "t") == 1_000_000
    assert require_time("1970-01-01T01:00:01+01:00", "t") == 1_000_000
    assert require_time("1970-01-01T00:00:01Z", "t") == 1_000_000
    assert require_time(datetime(1970, 1, 1, 0, 0, 1), "t") == 1_000_000
    assert require_time(datetime(1970, 1, 1, 0, 0, 1, 5, tzinfo=UTC), "t") == 1_000_005
    for bad in ("yesterday", 5, 1.5, None):
        with pytest.raises(InvalidUsage, match="t must be"):
            require_time(bad, "t")


def test_times_compare_exactly_at_sub_millisecond_precision() -> None:
    clock = Clock()
    shard = new_shard(clock)
    append_at(shard, clock, BASE_MS)
    append_at(shard, clock, BASE_MS + 1)
    state = shard.state()
    assert resolve_as_of_time(state, us(BASE_MS + 1) - 1) == 0  # 1 us before ts 1
    assert resolve_as_of_time(state, us(BASE_MS + 1)) == 1
    assert resolve_since_time(state, us(BASE_MS) + 1) == 1  # 1 us after ts 0
    assert resolve_since_time(state, us(BASE_MS + 1) + 1) == 2  # after all: the upper


# --- property: resolution equals an oracle ---------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    clocks=st.lists(st.integers(0, 50), min_size=1, max_size=12),
    retain=st.none() | st.integers(1, 12),
    queries=st.lists(st.integers(-5, 60), min_size=1, max_size=8),
)
def test_resolution_equals_an_oracle(
    clocks: list[int], retain: int | None, queries: list[int]
) -> None:
    """For any sequence of clock readings (going back and forth) and any retention, each
    time resolves to what a list of (ts, commit time) says."""
    clock = Clock()
    shard = new_shard(clock, "oracle")
    recorded: list[int] = []  # the oracle: ts -> commit time (ms after BASE_MS)
    for offset in clocks:
        append_at(shard, clock, BASE_MS + offset)
        recorded.append(max([offset, *recorded]))
    if retain is not None:
        shard.gc(retain=retain, leak_grace_ms=0)
    state = shard.state()
    since, upper = state.since, state.upper
    readable = {ts: recorded[ts] for ts in range(since, upper)}
    assert times(state)[max(k for k in times(state) if k <= since)] == BASE_MS + recorded[since]
    for q in queries:
        t = us(BASE_MS + q)
        if q < readable[since]:
            for resolve in (resolve_as_of_time, resolve_since_time, resolve_until_time):
                with pytest.raises(NotReadable, match="readable commit times"):
                    resolve(state, t)
            continue
        assert resolve_as_of_time(state, t) == max(ts for ts, c in readable.items() if c <= q)
        after = [ts for ts, c in readable.items() if c >= q]
        expected = min(after) if after else upper
        assert resolve_since_time(state, t) == expected
        assert resolve_until_time(state, t) == expected


def test_times_are_kept_to_the_microsecond() -> None:
    # Review: a 7th fraction digit was dropped silently, moving a since-time 100 ns
    # after a commit back onto it (its row was returned).
    from upsert_core.read_times import parse_time_text

    assert parse_time_text("2026-01-01T00:00:00.123456000Z") == datetime(
        2026, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)
    assert parse_time_text("2026-01-01T00:00:00.0000001Z") is None
    with pytest.raises(InvalidUsage, match="kept to the microsecond"):
        require_time("2026-01-01T00:00:00.0000001Z", "since_time")


def test_a_since_time_on_a_shard_with_no_commits_reads_nothing() -> None:
    # Review: an initialised shard without commits refused --since-time; upper (0) is
    # the answer, an empty read, as for --since 0.
    shard = new_shard(Clock())
    assert resolve_since_time(shard.state(), us(BASE_MS)) == 0
    assert resolve_until_time(shard.state(), us(BASE_MS)) == 0
