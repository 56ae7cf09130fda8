"""GC: what it deletes (exactly the unreferenced), retain, truncation, the leak grace
record, a blob committed while GC runs, idempotence, and GC racing readers."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from upsert_core.errors import CorruptData, InvalidUsage, NotReadable, WriterFenced
from upsert_core.persist import keys
from upsert_core.persist.keys import rollup_key, rollup_prefix, writer_id_of
from upsert_core.persist.location import Blob, Consensus
from upsert_core.persist.location.blob_local import LocalBlob
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.location.consensus_sql import SqlConsensus
from upsert_core.persist.maintenance.gc import gc as run_gc
from upsert_core.persist.maintenance.gc import leak_candidates_key, truncation_point
from upsert_core.persist.read.read import read_all
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.leases import DEFAULT_LEASE_DURATION_MS
from upsert_core.persist.state.state_versions import check_invariants
from upsert_core.persist.testing import DelegatingBlob
from upsert_core.persist.write.append import AppendRequest
from upsert_core.persist.write.parts import write_batch

from .helpers_proc import (
    RecordingBlob,
    blob_keys,
    data_blob_keys,
    key,
    live_referenced,
    live_rollup_keys,
    rows_of,
    updates_table,
    upsert_updates,
)

SHARD = "gcs"


@pytest.fixture(params=["memory", "sqlite+local"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Consensus, Blob]]:
    if request.param == "memory":
        yield MemoryConsensus(), MemoryBlob()
        return
    consensus = SqlConsensus(f"sqlite:///{tmp_path}/consensus.db")
    yield consensus, LocalBlob(tmp_path / "blob")
    consensus.close()


class Clock:
    def __init__(self) -> None:
        self.now = 10_000_000

    def __call__(self) -> int:
        return self.now


def filled(consensus: Consensus, blob: Blob, n: int = 12, clock: Clock | None = None
           ) -> tuple[Shard, RecordingBlob, dict[int, list[tuple[bytes, bytes, int, int]]]]:
    """A shard with ``n`` upsert batches; returns it, its recording blob and snapshots."""
    recording = RecordingBlob(blob)
    shard = Shard.open(consensus, recording, SHARD, inline_threshold=0, rollup_every=4,
                       clock_ms=clock or Clock())
    model: dict[bytes, bytes] = {}
    snapshots = {}
    for ts in range(n):
        ops = [(ts % 3, b"v%d" % ts), ((ts + 1) % 4, None if ts % 5 == 0 else b"w%d" % ts)]
        updates = upsert_updates(model, ts, ops)
        errors = pa.table({"file": [f"f{ts}"], "row": [1], "reason": ["bad"]}) if ts == 4 else None
        assert shard.append(updates_table(updates), ts, errors=errors).committed
        snapshots[ts] = sorted((k, v, ts, 1) for k, v in model.items())
    return shard, recording, snapshots


def assert_reads(shard: Shard, snapshots: dict[int, list[tuple[bytes, bytes, int, int]]]) -> None:
    state = shard.state()
    for ts in range(state.since, state.upper):
        assert rows_of(read_all(shard.snapshot(ts))) == snapshots[ts], ts


def test_gc_deletes_exactly_the_blobs_no_live_state_references(
    stores: tuple[Consensus, Blob],
) -> None:
    shard, recording, snapshots = filled(*stores)
    referenced_before = set(shard.state().referenced_blob_keys())
    report = shard.gc(leak_grace_ms=0)
    deleted = set(recording.deleted)
    assert deleted == set(report.deleted_keys)
    assert report.parts_deleted > 0 and report.diffs_truncated > 0
    after = blob_keys(recording, SHARD)
    assert not after & deleted
    # Nothing deleted is referenced by a live state or is a live rollup...
    assert not deleted & (live_referenced(shard) | live_rollup_keys(shard))
    # ...and everything left is: exactly the unreferenced blobs went.
    assert data_blob_keys(recording, SHARD) == live_referenced(shard)
    assert {m.key for m in recording.list_keys(rollup_prefix(SHARD))} == live_rollup_keys(shard)
    assert referenced_before - live_referenced(shard) <= deleted  # compacted-away parts
    assert report.bytes_freed > 0
    assert check_invariants(shard.versions) == []
    assert shard.check().ok
    assert_reads(shard, snapshots)
    assert shard.inspect()["live_diffs"] <= 4


def test_gc_on_an_idle_shard_changes_nothing_more(stores: tuple[Consensus, Blob]) -> None:
    shard, recording, _ = filled(*stores)
    shard.gc(leak_grace_ms=0)
    seqno, blobs = shard.seqno, blob_keys(recording, SHARD)
    report = shard.gc(leak_grace_ms=0)
    assert report.deleted_keys == [] and report.diffs_truncated == 0
    assert report.rollups_written == 0 and report.compaction_merges == 0
    assert shard.seqno == seqno and blob_keys(recording, SHARD) == blobs


def test_retain_advances_since_and_reads_before_it_fail(stores: tuple[Consensus, Blob]) -> None:
    shard, _, snapshots = filled(*stores)
    report = shard.gc(retain=4, leak_grace_ms=0)
    assert (report.since_before, report.since_after) == (0, 8)
    state = shard.state()
    assert state.since == 8 and len(state.batches) == 1
    assert_reads(shard, snapshots)
    with pytest.raises(NotReadable, match=r"readable times are \[8, 12\)"):
        shard.snapshot(7)
    assert shard.gc(retain=10, leak_grace_ms=0).since_after == 8  # never backwards
    assert shard.gc(retain=1, leak_grace_ms=0).since_after == 11  # the latest time stays
    with pytest.raises(NotReadable, match=r"readable times are \[11, 12\)"):
        shard.snapshot(10)
    assert_reads(shard, snapshots)
    assert shard.check().ok


@pytest.mark.parametrize("retain", [0, -1, True])
def test_retain_below_one_is_refused_and_changes_nothing(
    stores: tuple[Consensus, Blob], retain: int
) -> None:
    """``retain=0`` would set since to upper: nothing readable, no ingest could rehydrate."""
    shard, _, snapshots = filled(*stores)
    before = shard.state()
    with pytest.raises(InvalidUsage, match=">= 1"):
        shard.gc(retain=retain, leak_grace_ms=0)
    with pytest.raises(InvalidUsage, match=">= 1"):
        run_gc(shard.machine, shard.blob, retain=retain, leak_grace_ms=0)
    after = shard.state()
    assert (after.seqno, after.since, after.upper) == (before.seqno, before.since, before.upper)
    assert_reads(shard, snapshots)


def test_truncation_point_is_the_newest_rollup_at_or_below_every_hold() -> None:
    shard, _, _ = filled(MemoryConsensus(), MemoryBlob(), n=10)
    state = shard.state()
    assert truncation_point(state) == max(state.rollups)
    with shard.register_reader("r"):
        held = shard.state().leased_readers["r"].seqno
        point = truncation_point(shard.state())
        assert point is not None and point <= held
        assert point == max(s for s in shard.state().rollups if s <= held)


def test_legacy_leaked_blobs_wait_for_the_grace_period(stores: tuple[Consensus, Blob]) -> None:
    """Blobs that name no writer id (written before registrations existed) keep the old
    rule: deleted once seen unreferenced for the grace period."""
    clock = Clock()
    shard, recording, snapshots = filled(*stores, clock=clock)
    shard.gc(leak_grace_ms=0)
    leaked = write_batch(recording, SHARD, updates_table([(key(9), b"leak", 12, 1)]), 12, 13,
                         inline_threshold=0)
    leaked_keys = {p.key for p in leaked.parts}  # type: ignore[union-attr]
    assert all(writer_id_of(k) is None for k in leaked_keys)
    first = shard.gc(leak_grace_ms=1_000)
    assert first.leak_candidates_pending == 1 and not first.deleted_keys
    assert recording.get(leak_candidates_key(SHARD)) is not None
    clock.now += 999
    assert not shard.gc(leak_grace_ms=1_000).deleted_keys
    clock.now += 1
    third = shard.gc(leak_grace_ms=1_000)
    assert set(third.deleted_keys) == leaked_keys
    assert third.leaked_blobs_deleted == 1 and third.leak_candidates_pending == 0
    assert recording.get(leak_candidates_key(SHARD)) is None
    assert_reads(shard, snapshots)


def test_a_registered_writers_blobs_wait_for_its_registration_not_a_clock(
    stores: tuple[Consensus, Blob],
) -> None:
    """However long a registered writer takes (GC's clock far past any grace), its
    unreferenced blobs stay; once its registration is gone they go at the next GC, and
    the writer can no longer commit them. An unrecorded rollup newer than every recorded
    one waits until a newer rollup is recorded."""
    clock = Clock()
    shard, recording, snapshots = filled(*stores, clock=clock)
    shard.gc(leak_grace_ms=0)
    writer = Shard.open(stores[0], recording, SHARD, inline_threshold=0, clock_ms=clock)
    pending = writer.write_batch(updates_table([(key(9), b"slow", 12, 1)]), 12, 13)
    pending_keys = {p.key for p in pending.parts}  # type: ignore[union-attr]
    assert {writer_id_of(k) for k in pending_keys} == {writer.writer_id()}
    stray_rollup = rollup_key(SHARD, shard.seqno + 50)
    recording.set(stray_rollup, b"not really a rollup")
    for _ in range(3):
        report = shard.gc(leak_grace_ms=0)
        assert not (pending_keys | {stray_rollup}) & set(report.deleted_keys)
        assert report.leak_candidates_pending == 2
        # the writer heartbeats: GC's clock never expires it
        writer.register_writer(writer.writer_id())
        clock.now += 10 * DEFAULT_LEASE_DURATION_MS // 11
    clock.now += 2 * DEFAULT_LEASE_DURATION_MS  # the writer stalls past its lease
    report = shard.gc()  # expires the registration, then (same run) sweeps its blobs
    assert report.leases_expired == 1 and pending_keys <= set(report.deleted_keys)
    with pytest.raises(WriterFenced, match="fenced"):
        writer.compare_and_append(AppendRequest(pending, 12))
    assert shard.upper == 12
    for _ in range(60):  # move the seqno past the stray rollup; a newer one gets recorded
        shard.register_writer("x")
    report = shard.gc()
    assert stray_rollup in report.deleted_keys
    assert_reads(shard, snapshots)


def test_obsolete_rollups_below_earliest_go_at_once(stores: tuple[Consensus, Blob]) -> None:
    shard, recording, _ = filled(*stores)
    shard.gc(leak_grace_ms=0)
    earliest = shard.versions.earliest_live_seqno()
    assert earliest is not None and earliest > 2
    old = rollup_key(SHARD, earliest - 1)
    recording.set(old, b"left by a crashed GC")
    report = shard.gc()  # default one-hour grace
    assert old in report.deleted_keys and report.rollups_deleted >= 1


def test_a_part_committed_while_gc_lists_is_never_swept(stores: tuple[Consensus, Blob]) -> None:
    shard, recording, _ = filled(*stores)
    other = Shard.open(stores[0], recording, SHARD, inline_threshold=0)
    batch = other.write_batch(updates_table([(key(8), b"late", 12, 1)]), 12, 13)

    def commit() -> None:
        assert other.compare_and_append(AppendRequest(batch, 12)).committed

    # The writer commits right after GC listed the blobs (its part then looks leaked in
    # the listing); even with no grace GC must see it referenced and keep it.
    recording.after_list.append(commit)
    report = shard.gc(leak_grace_ms=0, run_compaction=False)
    part_keys = {p.key for p in batch.parts}  # type: ignore[union-attr]
    assert not part_keys & set(report.deleted_keys)
    assert part_keys <= data_blob_keys(recording, SHARD)
    assert (key(8), b"late", 12, 1) in rows_of(read_all(shard.snapshot(12)))


def test_gc_racing_readers_fetching_state(stores: tuple[Consensus, Blob]) -> None:
    consensus, blob = stores
    shard, _, snapshots = filled(consensus, blob, n=6)
    reader = Shard.open(consensus, blob, SHARD, create=False)
    stop = threading.Event()
    failures: list[BaseException] = []
    reads = [0]

    def read_loop() -> None:
        try:
            while not stop.is_set():
                state = reader.versions.fetch_current_state()
                assert state.upper >= 6
                assert rows_of(read_all(reader.snapshot(5))) == snapshots[5]
                reads[0] += 1
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=read_loop) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for ts in range(6, 16):
            assert shard.append(updates_table([(key(ts % 3), b"x%d" % ts, ts, 1)]), ts).committed
            shard.gc(leak_grace_ms=0)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not failures, failures[0]
    assert reads[0] > 0


class GcOnFirstPartGet(RecordingBlob):
    """Runs compaction and GC (through another handle) when a part is first fetched."""

    def __init__(self, inner: Blob) -> None:
        super().__init__(inner)
        self.other: Shard | None = None

    def get(self, key: str) -> bytes | None:
        if self.other is not None and "/part/" in key:
            other, self.other = self.other, None
            other.gc(leak_grace_ms=0)
        return super().get(key)


def test_an_unleased_read_restarts_when_gc_removed_its_parts() -> None:
    consensus, inner = MemoryConsensus(), MemoryBlob()
    shard, _, snapshots = filled(consensus, inner)
    blob = GcOnFirstPartGet(inner)
    reader = Shard.open(consensus, blob, SHARD, create=False)
    # Same clock as the writer's: GC on a clock far ahead would (rightly) expire the
    # writer's registration and fence its next append.
    blob.other = Shard.open(consensus, inner, SHARD, create=False, clock_ms=shard._clock_ms)
    seqno = reader.seqno
    assert rows_of(read_all(reader.snapshot(11))) == snapshots[11]
    assert blob.other is None and reader.seqno > seqno  # GC ran under the read
    # A part missing from the CURRENT state is corruption, not a race: it is raised.
    assert shard.append(updates_table([(key(7), b"new", 12, 1)]), 12).committed
    (part,) = shard.state().batches[-1].parts
    inner.delete(part.key)  # type: ignore[union-attr]
    with pytest.raises(CorruptData, match="missing"):
        reader.snapshot(12)


class LazyBlob(DelegatingBlob):
    """A blob whose readers fetch from ``inner`` at every read (as S3's do), so a part
    deleted while a read streams fails that read's next fetch; counts those failures."""

    def __init__(self, inner: Blob) -> None:
        super().__init__(inner)
        self.vanished = 0

    def open_reader(self, key: str) -> io.BytesIO | None:
        if self.inner.get(key) is None:
            return None
        lazy = self

        class Reader(io.BytesIO):
            def read(self, size: int | None = -1, /) -> bytes:
                data = lazy.inner.get(key)
                if data is None:
                    lazy.vanished += 1
                    raise FileNotFoundError(f"{key} was deleted while being read")
                self.getbuffer()[:] = data  # same bytes: parts are never rewritten
                return super().read(size)

        return Reader(self.inner.get(key) or b"")


@pytest.mark.parametrize("since_gc", [False, True])
def test_an_unleased_read_resumes_after_its_last_key_when_gc_deletes_parts_midstream(
    since_gc: bool,
) -> None:
    consensus, inner = MemoryConsensus(), MemoryBlob()
    blob = LazyBlob(inner)
    writer = Shard.open(consensus, inner, SHARD, inline_threshold=0, rollup_every=4)
    model: dict[bytes, bytes] = {}
    for ts in range(3):  # overlapping keys, retractions, many small row groups
        ops = [(k, b"v%d-%d" % (ts, k)) for k in range(ts, 40 + ts)]
        updates = upsert_updates(model, ts, ops)
        batch = write_batch(inner, SHARD, updates_table(updates), ts, ts + 1,
                            inline_threshold=0, row_group_rows=4)
        assert writer.compare_and_append(AppendRequest(batch, ts)).committed
    expected = sorted((k, v, 2, 1) for k, v in model.items())
    old_parts = set(writer.state().referenced_blob_keys())
    reader = Shard.open(consensus, blob, SHARD, create=False)
    stream = reader.snapshot(2, batch_rows=4) if since_gc else reader.changes(0, batch_rows=4)
    first = [next(stream), next(stream)]
    report = writer.gc(leak_grace_ms=0)  # compacts, then deletes the parts read above
    assert report.compaction_merges > 0 and old_parts <= set(report.deleted_keys)
    batches = first + list(stream)
    assert blob.vanished > 0  # the read did hit a deleted part and resumed
    keys_seen = [b.column("key").to_pylist() for b in batches]
    assert all(a[-1] < b[0] for a, b in zip(keys_seen, keys_seen[1:], strict=False))
    table = pa.Table.from_batches(batches)
    if since_gc:
        assert rows_of(table) == expected
    else:  # changes: every update consolidated per (key, row, ts), nothing twice
        assert rows_of(table) == rows_of(read_all(writer.changes(0)))
        assert len(rows_of(table)) == len(set(rows_of(table))) > len(expected)


# --- check and inspect ------------------------------------------------------------------


def test_check_reports_broken_consolidation_and_missing_blobs() -> None:
    shard = Shard.open(MemoryConsensus(), MemoryBlob(), "checked", inline_threshold=0)
    errors = pa.table({"file": ["f"], "row": [3], "reason": ["null key"]})
    assert shard.append(updates_table([(key(1), b"a", 0, 1)]), 0, errors=errors).committed
    clean = shard.check()
    assert clean.ok and clean.counts["error_rows"] == 1 and clean.counts["live_rows_at_upper"] == 1
    # ts 1: a second live row for key 1; ts 2: the first row retracted twice.
    assert shard.append(updates_table([(key(1), b"b", 1, 1)]), 1).committed
    assert shard.append(updates_table([(key(1), b"a", 2, -2)]), 2).committed
    problems = shard.check().problems
    assert any("2 live rows at ts 1" in p for p in problems), problems
    assert any("multiplicity -1 at ts 2" in p for p in problems), problems
    (part,) = shard.state().batches[0].parts
    shard.blob.delete(part.key)  # type: ignore[union-attr]
    assert any("missing" in p for p in shard.check().problems)


def test_inspect_reports_the_contract_fields() -> None:
    shard, _, _ = filled(MemoryConsensus(), MemoryBlob(), n=3)
    info = shard.inspect()
    for name in ("seqno", "since", "upper", "batches", "rollups", "live_diffs", "blob_bytes"):
        assert isinstance(info[name], int), name
    assert info["upper"] == 3 and info["batches"] == 3 and info["ingested_files"] == {}
    assert info["blob_bytes"] == sum(m.size_in_bytes for m in shard.blob.list_keys("gcs/"))
    assert list(shard.errors()) == []


def _write_leak_in_process(blob_root: str, claim: bool) -> str:
    """In a child process: claim (or not) a writer token, write one part, exit."""
    import subprocess
    import sys

    code = (
        "import sys, pyarrow as pa\n"
        "from upsert_core.persist import keys\n"
        "from upsert_core.persist.location.blob_local import LocalBlob\n"
        "from upsert_core.persist.write.parts import write_part\n"
        f"if {claim!r}: keys.claim_writer_token()\n"
        "else:\n"
        "    import os; os.environ.pop(keys.WRITER_TOKEN_ENV, None)\n"
        "t = pa.table({'key': [b'k' * 16], 'row': [b'r'], 'ts': [12], 'diff': [1]})\n"
        f"p = write_part(LocalBlob({blob_root!r}), {SHARD!r}, t, inline_threshold=0)\n"
        "print(p.key)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_a_dead_writers_leaked_part_goes_at_once_a_live_ones_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    consensus = SqlConsensus(f"sqlite:///{tmp_path}/consensus.db")
    blob = LocalBlob(tmp_path / "blob")
    shard, _, snapshots = filled(consensus, blob)
    shard.gc(leak_grace_ms=0)
    # A writer process that claimed a token and has exited (as after SIGKILL): its
    # part is provably abandoned, so the default one-hour grace does not apply.
    dead = _write_leak_in_process(str(tmp_path / "blob"), claim=True)
    # A writer without a token, and a live writer (this process, with a token): both
    # must wait for the grace period.
    anonymous = _write_leak_in_process(str(tmp_path / "blob"), claim=False)
    monkeypatch.setenv(keys.WRITER_TOKEN_ENV, f"{keys.host_id()}.{os.getpid()}")
    live = shard.write_batch(updates_table([(key(8), b"live", 12, 1)]), 12, 13)
    live_keys = {p.key for p in live.parts}  # type: ignore[union-attr]
    assert keys.writer_of(dead) is not None and keys.writer_of(anonymous) is None
    assert all(keys.writer_of(k) == (keys.host_id(), os.getpid()) for k in live_keys)
    report = shard.gc()  # default grace
    assert set(report.deleted_keys) == {dead}
    remaining = blob_keys(blob, SHARD)
    assert anonymous in remaining and live_keys <= remaining
    assert_reads(shard, snapshots)
    consensus.close()


def test_writers_in_another_pid_namespace_are_never_taken_for_dead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two containers with one hostname and kernel (host networking) but their own PID
    namespaces: a pid that is not running HERE may be running THERE, so a key written
    there must not name this host, and GC here must not call its writer dead."""
    here = keys.host_id()
    real_readlink = os.readlink

    def other_namespace(path: str) -> str:
        return "pid:[4000000001]" if path == "/proc/self/ns/pid" else real_readlink(path)

    monkeypatch.setattr(keys.os, "readlink", other_namespace)
    there = keys.host_id()
    monkeypatch.undo()
    assert there != here
    finished = subprocess.Popen([sys.executable, "-c", "pass"])  # a pid that has ended
    finished.wait()
    key = f"s/part/{there}.{finished.pid}-{'0' * 32}.parquet"
    assert keys.writer_of(key) == (there, finished.pid)
    assert not keys.writer_is_dead(key)
    assert keys.writer_is_dead(f"s/part/{here}.{finished.pid}-{'0' * 32}.parquet")
