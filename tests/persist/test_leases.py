"""Leases: writer and reader registration, heartbeats, holds, expiry, and what GC
honours for a leased reader."""

from __future__ import annotations

import pytest

from upsert_core.errors import InvalidUsage, LeaseExpired, NotReadable
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.maintenance.gc import advance_since, retained_since
from upsert_core.persist.read.read import read_all
from upsert_core.persist.shard import Shard
from upsert_core.persist.state import leases
from upsert_core.persist.state.state import ShardState

from .helpers_proc import data_blob_keys, key, rows_of, updates_table


def state(seqno: int = 5, since: int = 2, upper: int = 10) -> ShardState:
    return ShardState(shard_id="s", seqno=seqno, since=since, upper=upper)


def test_reader_registers_at_since_holding_current_seqno() -> None:
    s = leases.register_reader(state(), "r", now_ms=100, lease_duration_ms=50)
    reader = s.leased_readers["r"]
    assert (reader.since, reader.seqno, reader.last_heartbeat_ms) == (2, 5, 100)
    with pytest.raises(InvalidUsage, match="already leased"):
        leases.register_reader(s, "r", now_ms=100)
    with pytest.raises(InvalidUsage, match="duration"):
        leases.register_reader(state(), "x", now_ms=0, lease_duration_ms=0)


def test_reader_hold_and_since_only_move_forward() -> None:
    s = leases.register_reader(state(seqno=5), "r", now_ms=0, lease_duration_ms=50)
    s = s.evolve(seqno=9)
    s = leases.heartbeat_reader(s, "r", now_ms=10, hold_seqno=7)
    assert s.leased_readers["r"].seqno == 7
    s = leases.heartbeat_reader(s, "r", now_ms=5, hold_seqno=3)  # backwards: ignored
    assert s.leased_readers["r"].seqno == 7 and s.leased_readers["r"].last_heartbeat_ms == 10
    s = leases.heartbeat_reader(s, "r", now_ms=11, hold_seqno=99)  # capped at current
    assert s.leased_readers["r"].seqno == 9
    s2 = leases.downgrade_reader_since(s, "r", 6)
    assert s2 is not None and s2.leased_readers["r"].since == 6
    assert leases.downgrade_reader_since(s2, "r", 4) is None
    with pytest.raises(InvalidUsage, match="beyond the upper"):
        leases.downgrade_reader_since(s2, "r", 11)


def test_expiry_removes_only_stale_leases_and_heartbeats_then_fail() -> None:
    s = leases.register_reader(state(), "old", now_ms=0, lease_duration_ms=10)
    s = leases.register_reader(s, "new", now_ms=5, lease_duration_ms=10)
    s = leases.register_writer(s, "w", now_ms=0, lease_duration_ms=100)
    assert leases.expire_leases(s, now_ms=10) is None  # exactly at the limit: alive
    expired = leases.expire_leases(s, now_ms=11)
    assert expired is not None
    assert set(expired.leased_readers) == {"new"} and set(expired.writers) == {"w"}
    with pytest.raises(LeaseExpired, match="old"):
        leases.heartbeat_reader(expired, "old", now_ms=12)
    gone = leases.expire_leases(expired, now_ms=1000)
    assert gone is not None and not gone.writers and not gone.leased_readers
    with pytest.raises(LeaseExpired):
        leases.heartbeat_writer(gone, "w", now_ms=1000)


def test_writer_heartbeat_and_release() -> None:
    s = leases.register_writer(state(), "w", now_ms=0, lease_duration_ms=10)
    s = leases.heartbeat_writer(s, "w", now_ms=9)
    assert leases.expire_leases(s, now_ms=15) is None
    removed = leases.expire_writer(s, "w")
    assert removed is not None and not removed.writers
    assert leases.expire_writer(removed, "w") is None
    assert leases.release_reader(removed, "nobody") is None


def test_retain_never_passes_a_readers_since_nor_goes_backwards() -> None:
    s = leases.register_reader(state(since=2, upper=10), "r", now_ms=0)
    assert retained_since(s, 3) == 2  # the reader's since holds it
    s = leases.downgrade_reader_since(s, "r", 5)
    assert s is not None and retained_since(s, 3) == 5
    assert retained_since(state(since=8, upper=10), 5) == 8  # never backwards
    assert retained_since(state(since=2, upper=10), 1) == 9  # the latest time stays
    for retain in (0, -1):  # since == upper would leave nothing readable
        with pytest.raises(InvalidUsage, match=">= 1"):
            retained_since(state(since=2, upper=10), retain)
        with pytest.raises(InvalidUsage, match=">= 1"):
            advance_since(retain)
    assert leases.min_held_seqno(s) == 5 and leases.min_reader_since(s) == 5
    assert leases.min_reader_since(state()) is None


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def build_shard(clock: Clock) -> Shard:
    shard = Shard.open(MemoryConsensus(), MemoryBlob(), "leased", inline_threshold=0,
                       rollup_every=4, clock_ms=clock)
    for ts in range(6):
        assert shard.append(updates_table([(key(ts % 2), b"v%d" % ts, ts, 1)]), ts).committed
    return shard


def test_gc_keeps_what_a_leased_reader_reads_until_it_is_released() -> None:
    clock = Clock()
    shard = build_shard(clock)
    with shard.register_reader("r", lease_duration_ms=60_000) as reader:
        held_parts = set(reader.state.referenced_blob_keys())
        expected = rows_of(read_all(reader.snapshot(3)))
        report = shard.gc(leak_grace_ms=0)
        assert report.compaction_merges > 0
        assert shard.state().leased_readers["r"].seqno <= reader.state.seqno
        assert held_parts <= data_blob_keys(shard.blob, shard.shard_id)
        assert not held_parts & set(report.deleted_keys)
        assert rows_of(read_all(reader.snapshot(3))) == expected
        reader.heartbeat()
        refreshed = reader.refresh()
        assert shard.state().leased_readers["r"].seqno == refreshed.seqno - 1
    assert "r" not in shard.state().leased_readers
    report = shard.gc(leak_grace_ms=0)
    remaining = data_blob_keys(shard.blob, shard.shard_id)
    assert held_parts - set(shard.state().referenced_blob_keys()) <= set(report.deleted_keys)
    assert remaining == set(shard.state().referenced_blob_keys())


def test_gc_expires_a_silent_reader_and_its_heartbeat_then_fails() -> None:
    clock = Clock()
    shard = build_shard(clock)
    with shard.register_reader("r", lease_duration_ms=1_000) as reader:
        reader.downgrade_since(2)
        shard.gc(retain=1, leak_grace_ms=0)
        assert shard.since == 2  # held back by the reader's since
        clock.now += 1_001
        report = shard.gc(retain=1, leak_grace_ms=0)
        assert report.leases_expired == 1 and report.since_after == 5
        with pytest.raises(LeaseExpired):
            reader.heartbeat()
        with pytest.raises(NotReadable, match="readable times are"):
            shard.snapshot(3)
