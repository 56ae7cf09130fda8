"""Writer registrations fence commits, so GC can delete a stalled writer's blobs safely.

The defect these guard against: GC deleted an unreferenced part once it had been seen for
the leak grace, and ``compare_and_append`` never checked its parts still existed, so a
writer that stalled past the grace committed parts that were gone and every read failed.
Now a commit needs the writer's registration, GC removes a registration only by
compare-and-set, and deletes a writer's blobs only when a state read after listing them
no longer registers it.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.ingest.helpers import snapshot_rows, write_jsonl
from tests.model import UpsertModel
from upsert_core.errors import WriterFenced
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.persist.keys import is_writer_id, new_writer_id, writer_id_of
from upsert_core.persist.location import Blob, CasResult, VersionedData
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.location.unreliable import FaultRates, UnreliableConsensus
from upsert_core.persist.read.read import read_all
from upsert_core.persist.shard import Shard
from upsert_core.persist.state import leases
from upsert_core.persist.testing import unreferenced_blobs
from upsert_core.persist.write.append import AppendRequest
from upsert_core.persist.write.writers import WriterLease, expire_dead_local_writers

from .test_parts import key, rows_of, updates_table

LEASE_MS = 60_000


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def _shard(clock: Clock, blob: Blob | None = None, consensus: MemoryConsensus | None = None
           ) -> Shard:
    return Shard.open(consensus or MemoryConsensus(), blob or MemoryBlob(), "w",
                      inline_threshold=0, clock_ms=clock)


def test_writer_ids_are_fresh_and_name_the_blobs_written_under_them() -> None:
    a, b = new_writer_id(), new_writer_id()
    assert a != b and is_writer_id(a) and is_writer_id(b)
    clock = Clock()
    shard = _shard(clock)
    batch = shard.write_batch(updates_table([(key(1), b"v", 0, 1)]), 0, 1)
    (part,) = batch.parts
    assert writer_id_of(part.key) == shard.writer_id()  # type: ignore[union-attr]
    assert shard.writer_id() in shard.state().writers


def test_an_unregistered_writer_cannot_commit_and_changes_nothing() -> None:
    clock = Clock()
    shard = _shard(clock)
    batch = shard.write_batch(updates_table([(key(1), b"v", 0, 1)]), 0, 1)
    before = shard.state()
    with pytest.raises(WriterFenced, match="fenced"):
        shard.compare_and_append(
            AppendRequest(batch, 0, ingested_files={"f": 0}), writer_id=new_writer_id()
        )
    after = shard.state()
    assert (after.seqno, after.upper, dict(after.ingested_files)) == (before.seqno, 0, {})


def test_a_commit_that_landed_stays_committed_after_the_registration_went() -> None:
    """Retrying an append that already committed reports it committed, fenced or not."""
    clock = Clock()
    shard = _shard(clock)
    batch = shard.write_batch(updates_table([(key(1), b"v", 0, 1)]), 0, 1)
    writer = shard.writer_id()
    assert shard.compare_and_append(AppendRequest(batch, 0, ingested_files={"f": 0})).committed
    shard.release_writer()
    again = shard.compare_and_append(
        AppendRequest(batch, 0, ingested_files={"f": 0}), writer_id=writer
    )
    assert again.committed and again.state.upper == 1


def test_gc_deletes_a_stalled_writers_parts_only_after_fencing_it() -> None:
    clock = Clock()
    blob = MemoryBlob()
    consensus = MemoryConsensus()
    gc_side = _shard(clock, blob, consensus)
    slow = _shard(clock, blob, consensus)
    batch = slow.write_batch(updates_table([(key(1), b"v", 0, 1)]), 0, 1)
    keys = {p.key for p in batch.parts}  # type: ignore[union-attr]
    # GC far in the future but the writer still registered (no expiry yet): kept.
    report = gc_side.gc(leak_grace_ms=0)
    assert not keys & set(report.deleted_keys) and keys <= {m.key for m in blob.list_keys("w/")}
    clock.now += leases.DEFAULT_LEASE_DURATION_MS + 1  # the writer stalls past its lease
    report = gc_side.gc()
    assert keys <= set(report.deleted_keys)
    with pytest.raises(WriterFenced):
        slow.compare_and_append(AppendRequest(batch, 0))
    assert gc_side.state().upper == 0
    # The handle registers a fresh id and its next append commits.
    assert slow.append(updates_table([(key(1), b"v", 0, 1)]), 0).committed
    assert rows_of(read_all(gc_side.snapshot(0))) == [(key(1), b"v", 0, 1)]


def test_dead_local_writers_are_removed_through_the_same_fence() -> None:
    clock = Clock()
    shard = _shard(clock)
    dead = new_writer_id().split(".")
    dead[1] = "999999999"  # a pid that is not running
    dead_id = ".".join(dead)
    shard.machine.apply(lambda s: leases.register_writer(s, dead_id, clock(), LEASE_MS))
    alive = shard.writer_id()
    assert set(shard.machine.apply(expire_dead_local_writers).writers) == {alive}
    batch = shard.write_batch(updates_table([(key(1), b"v", 0, 1)]), 0, 1)
    with pytest.raises(WriterFenced):
        shard.compare_and_append(AppendRequest(batch, 0), writer_id=dead_id)
    assert shard.compare_and_append(AppendRequest(batch, 0)).committed  # the live writer commits


def test_a_lease_heartbeats_survive_gc_and_a_lost_one_is_renewed_with_a_new_id() -> None:
    clock = Clock()
    shard = _shard(clock)
    lease = WriterLease(shard.versions, lease_duration_ms=LEASE_MS, clock_ms=clock)
    first = lease.register()
    for _ in range(5):
        clock.now += LEASE_MS // 2
        lease.heartbeat()
        shard.gc()
        assert first in shard.state().writers
    clock.now += LEASE_MS + 1
    shard.gc()
    with pytest.raises(WriterFenced):
        lease.heartbeat()
    assert lease.lost
    second = lease.renew()
    assert second != first and set(shard.state().writers) == {second}
    lease.close()
    assert not shard.state().writers


def test_compaction_by_a_fenced_writer_commits_nothing() -> None:
    clock = Clock()
    shard = _shard(clock)
    for ts in range(4):
        assert shard.append(updates_table([(key(ts), b"v", ts, 1)]), ts).committed
    batches = shard.state().batches
    with pytest.raises(WriterFenced):
        from upsert_core.persist.maintenance.compact import compact

        compact(shard.machine, shard.blob, merge_all=True, writer_id=new_writer_id())
    assert shard.state().batches == batches


class StallingBlob:
    """A blob whose first ``set`` of a checkpoint blocks until released, as a writer
    stalled between writing its parts and committing them (a paused VM, SIGSTOP)."""

    def __init__(self, inner: Blob) -> None:
        self.inner = inner
        self.stalled = threading.Event()
        self.release = threading.Event()
        self.armed = True

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def set(self, key: str, value: bytes) -> None:
        self.inner.set(key, value)
        if self.armed and "/checkpoint/" in key:
            self.armed = False
            self.stalled.set()
            assert self.release.wait(30)


def test_an_ingest_stalled_past_its_lease_is_fenced_redoes_its_file_and_loses_nothing(
    tmp_path: Path,
) -> None:
    """The ingest stalls after writing a file's parts; GC (clock past the lease) fences
    it and deletes those parts; the ingest's commit is refused, it registers again, redoes
    the file and completes. Every read in between sees complete data."""
    clock = Clock()
    consensus, inner = MemoryConsensus(), MemoryBlob()
    stalling = StallingBlob(inner)
    writer = Shard.open(consensus, stalling, "w", inline_threshold=0,  # type: ignore[arg-type]
                        clock_ms=clock)
    observer = Shard.open(consensus, inner, "w", inline_threshold=0, clock_ms=clock)
    model = UpsertModel("batch")
    rows = [[{"key": k, "offset": t, "v": f"{t}-{k}"} for k in range(20)] for t in range(2)]
    for t, batch in enumerate(rows):
        write_jsonl(tmp_path, f"{t}.jsonl", batch)
        model.apply(batch)
    request = IngestRequest(buckets=2, writer_lease_ms=LEASE_MS)
    reports: list[object] = []
    thread = threading.Thread(
        target=lambda: reports.append(ingest(writer, str(tmp_path), request)), daemon=True
    )
    thread.start()
    assert stalling.stalled.wait(30)
    written = {m.key for m in inner.list_keys("w/") if "/rollup/" not in m.key}
    (stalled_id,) = [w for w in observer.state().writers]
    assert all(writer_id_of(k) == stalled_id for k in written)
    clock.now += LEASE_MS + 1
    report = observer.gc()
    assert report.leases_expired == 1 and written <= set(report.deleted_keys)
    assert observer.state().upper == 0
    stalling.release.set()
    thread.join(60)
    assert not thread.is_alive() and reports, "the ingest did not complete"
    (done,) = reports
    assert any("fenced" in w for w in done.warnings)  # type: ignore[attr-defined]
    assert done.files[0].attempts == 2  # type: ignore[attr-defined]
    state = observer.state()
    assert state.upper == 2 and not state.writers
    for ts in range(2):
        assert snapshot_rows(observer, ts) == model.rows(ts)
    assert observer.check().ok
    observer.gc(leak_grace_ms=0)
    assert unreferenced_blobs(observer) == set()


def test_append_by_a_handle_whose_registration_expired_writes_again_as_a_new_writer() -> None:
    clock = Clock()
    blob = MemoryBlob()
    consensus = MemoryConsensus()
    handle = _shard(clock, blob, consensus)
    assert handle.append(updates_table([(key(1), b"a", 0, 1)]), 0).committed
    old = handle.writer_id()
    clock.now += leases.DEFAULT_LEASE_DURATION_MS + 1
    _shard(clock, blob, consensus).gc()  # expires the idle handle's registration
    assert old not in handle.state().writers
    result = handle.append(updates_table([(key(2), b"b", 1, 1)]), 1)
    assert result.committed and handle.writer_id() != old
    parts = {p.key for b in result.state.batches for p in b.parts}  # type: ignore[union-attr]
    assert parts <= {m.key for m in blob.list_keys("w/")}
    assert rows_of(read_all(handle.snapshot(1))) == [(key(1), b"a", 1, 1), (key(2), b"b", 1, 1)]


# --- found by review: the fence is on the blobs' writer, and GC decides on a proven head --


def test_a_batch_written_under_a_removed_id_is_never_committed_by_a_new_registration() -> None:
    """A handle fenced at commit registers a new id on retry; the batch it wrote under
    the old id (whose parts GC deleted) must still be refused, by anyone."""
    clock = Clock()
    blob, consensus = MemoryBlob(), MemoryConsensus()
    writer = _shard(clock, blob, consensus)
    batch = writer.write_batch(updates_table([(key(1), b"v", 0, 1)]), 0, 1)
    clock.now += leases.DEFAULT_LEASE_DURATION_MS + 1
    observer = _shard(clock, blob, consensus)
    assert {p.key for p in batch.parts} <= set(observer.gc().deleted_keys)  # type: ignore[union-attr]
    with pytest.raises(WriterFenced):
        writer.compare_and_append(AppendRequest(batch, 0, ingested_files={"f": 0}))
    with pytest.raises(WriterFenced, match="was written by writer"):
        writer.compare_and_append(AppendRequest(batch, 0, ingested_files={"f": 0}))  # as a new id
    assert observer.state().upper == 0
    assert writer.append(updates_table([(key(1), b"v", 0, 1)]), 0).committed
    assert rows_of(read_all(observer.snapshot(0))) == [(key(1), b"v", 0, 1)]


def test_a_fenced_handle_compacts_again_as_a_new_writer() -> None:
    clock = Clock()
    blob, consensus = MemoryBlob(), MemoryConsensus()
    handle = _shard(clock, blob, consensus)
    for ts in range(6):
        assert handle.append(updates_table([(key(ts), b"v", ts, 1)]), ts).committed
    old = handle.writer_id()
    clock.now += leases.DEFAULT_LEASE_DURATION_MS + 1
    _shard(clock, blob, consensus).gc(run_compaction=False)
    result = handle.compact(merge_all=True)
    assert result.merges == 1 and handle.writer_id() != old


class LateSeenRegistration(UnreliableConsensus):
    """The first compare-and-set commits but reports a timeout, and reads then miss it
    for a while (a commit seen late); compare-and-set always sees the true head."""

    armed = True

    def compare_and_set(self, key: str, expected: int | None, new: VersionedData) -> CasResult:
        if self.armed:
            self.armed = False
            self._faults.rates = FaultRates(0, 0, 1.0)
            try:
                return super().compare_and_set(key, expected, new)
            finally:
                self._faults.rates = FaultRates(0, 0, 0)
        return super().compare_and_set(key, expected, new)


def test_gc_does_not_trust_a_lagging_read_of_the_registrations() -> None:
    """A writer's registration committed but is not yet visible to reads. GC must not
    take the writer for unregistered and delete its part, which it then commits."""
    blob = MemoryBlob()
    inner = MemoryConsensus()
    Shard.open(inner, blob, "w")  # the shard exists before the faults start
    lagging = LateSeenRegistration(inner, seed=0, rates=FaultRates(0, 0, 0), stale_reads=50)
    writer = Shard.open(lagging, blob, "w", inline_threshold=0)
    batch = writer.write_batch(updates_table([(key(1), b"v", 0, 1)]), 0, 1)
    keys = {p.key for p in batch.parts}  # type: ignore[union-attr]
    report = Shard.open(lagging, blob, "w", create=False).gc(leak_grace_ms=0)
    assert not keys & set(report.deleted_keys)
    assert writer.compare_and_append(AppendRequest(batch, 0, ingested_files={"f": 0})).committed
    truth = Shard.open(inner, blob, "w", create=False)
    assert rows_of(read_all(truth.snapshot(0))) == [(key(1), b"v", 0, 1)]


# --- found by the SIGKILL fault suite: GC killed between deleting and truncating --------


@pytest.mark.parametrize("stop_at", ["truncate", "delete"])
def test_gc_killed_between_truncation_and_deletion_leaves_no_dangling_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop_at: str
) -> None:
    """GC truncates the diffs below its point before deleting the blobs only they
    referenced, so a crash at either step leaves every live state's blobs in place
    (``check`` passes), and the next GC removes what the crash left over."""
    from upsert_core.persist.maintenance import gc as gc_module

    shard = Shard.open(MemoryConsensus(), MemoryBlob(), "w", inline_threshold=0)
    for i in range(6):  # each file rewrites the bucket's checkpoint: older ones get replaced
        write_jsonl(tmp_path, f"{i}.jsonl",
                    [{"key": k, "offset": i, "v": f"{i}-{k}"} for k in range(30)])
        ingest(shard, str(tmp_path), IngestRequest(buckets=1))

    class Killed(BaseException):
        pass

    def killed(*_args: object, **_kwargs: object) -> None:
        raise Killed

    target = "_truncate" if stop_at == "truncate" else "_delete_replaced"
    monkeypatch.setattr(gc_module, target, killed)
    with pytest.raises(Killed):
        shard.gc(retain=2)
    monkeypatch.undo()
    assert shard.check().ok, shard.check().problems
    shard.gc(retain=2, leak_grace_ms=0)
    assert shard.check().ok and unreferenced_blobs(shard) == set()
