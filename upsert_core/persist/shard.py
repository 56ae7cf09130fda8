"""The :class:`Shard` handle: the one API the CLI, the ingest pipeline and Spark use.

A handle wraps the shard's :class:`StateVersions` and :class:`Machine` over a Consensus
and a Blob, and delegates to the modules that do the work: ``parts`` and ``append``
(writes), ``read`` (snapshot, changes), ``compact``, ``gc``, ``leases`` and ``check``.
Handles are cheap; several handles (in one process or many) on the same stores are
safe together, because every change is a compare-and-set on the shard's state.

Invariants:

- Every read starts from a state that was current when the read began, and raises
  :class:`NotReadable` at the call (not later) when the requested times are outside
  ``[since, upper)``.
- Unleased reads survive a concurrent GC without a lease. Reads stream (parts are
  opened lazily and read row group by row group), so GC may delete a part under a read
  at any point, before or after batches were yielded. A missing part raises
  :class:`CorruptData` inside the read; if the state it reads is no longer current,
  GC removed it and the read RESUMES on the fresh state after the last key it yielded
  (see :meth:`Shard._resumable`); a part missing from the CURRENT state is real
  corruption and is raised. Long-lived readers that re-read a state over time take a
  lease (:meth:`Shard.register_reader`), which GC honours.
- ``append`` deletes its parts when its compare-and-append did not commit, so a lost
  race leaves no blobs behind.
- A handle that writes is a registered writer (``persist.write.writers``): its first write
  registers a fresh writer id before any blob is written, every blob it writes names
  that id, and its commits are refused (:class:`WriterFenced`) once the registration
  is gone; the next write then registers a new id. :meth:`release_writer` ends it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from itertools import chain

import pyarrow as pa

from upsert_core.errors import CorruptData, InvalidUsage, NotReadable, WriterFenced
from upsert_core.persist.keys import new_writer_id, shard_prefix, writing_as
from upsert_core.persist.location import Blob, Consensus
from upsert_core.persist.maintenance.check import CheckReport, check_shard
from upsert_core.persist.maintenance.compact import CompactionResult, PartTyper
from upsert_core.persist.maintenance.compact import compact as _compact
from upsert_core.persist.maintenance.gc import DEFAULT_LEAK_GRACE_MS, GcReport, check_retain
from upsert_core.persist.maintenance.gc import gc as _gc
from upsert_core.persist.maintenance.retention import (
    retention_keep,
    stored_keep_for,
    stored_retention,
    with_retention,
    with_retention_for,
)
from upsert_core.persist.read.read import changes as _changes
from upsert_core.persist.read.read import read_all
from upsert_core.persist.read.read import snapshot as _snapshot
from upsert_core.persist.state import leases
from upsert_core.persist.state.commit_times import format_time_ms, last_commit_ms, since_commit_ms
from upsert_core.persist.state.machine import DEFAULT_ROLLUP_EVERY, Machine
from upsert_core.persist.state.state import ErrorBatch, HollowBatch, ShardState
from upsert_core.persist.state.state_versions import StateVersions
from upsert_core.persist.write.append import AppendRequest, AppendResult, delete_uncommitted
from upsert_core.persist.write.append import compare_and_append as _compare_and_append
from upsert_core.persist.write.parts import (
    DEFAULT_BATCH_ROWS,
    DEFAULT_INLINE_THRESHOLD,
    read_error_part,
    write_batch,
    write_error_batch,
)
from upsert_core.persist.write.writers import WriterLease
from upsert_core.read_times import format_duration, require_ts

READ_ATTEMPTS = 5
"""How often an unleased read starts again after GC removed parts under it."""

Reader = Callable[[ShardState], Iterator[pa.RecordBatch]]
SameResult = Callable[[ShardState, ShardState], bool]
"""Whether a read started on the first state answers the same on the second."""


def _after_key(batches: Iterator[pa.RecordBatch], last_key: bytes) -> Iterator[pa.RecordBatch]:
    """``batches`` (sorted by key) without the rows whose key is <= ``last_key``."""
    for batch in batches:
        keys = batch.column("key")
        n = batch.num_rows
        if n == 0 or keys[n - 1].as_py() <= last_key:
            continue
        lo, hi = 0, n
        while lo < hi:  # the first row with a key > last_key
            mid = (lo + hi) // 2
            if keys[mid].as_py() <= last_key:
                lo = mid + 1
            else:
                hi = mid
        yield batch.slice(lo) if lo else batch
        yield from batches
        return


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)


class Shard:
    """A handle on one shard (see the module docstring)."""

    def __init__(
        self,
        versions: StateVersions,
        *,
        rollup_every: int = DEFAULT_ROLLUP_EVERY,
        inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
        clock_ms: Callable[[], int] = _wall_clock_ms,
    ) -> None:
        self.versions = versions
        self.machine = Machine(versions, rollup_every=rollup_every, clock_ms=clock_ms)
        self.inline_threshold = inline_threshold
        self._clock_ms = clock_ms
        self._writer_id: str | None = None

    @classmethod
    def open(
        cls,
        consensus: Consensus,
        blob: Blob,
        shard_id: str,
        *,
        create: bool = True,
        config: Mapping[str, str] | None = None,
        rollup_every: int = DEFAULT_ROLLUP_EVERY,
        inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
        clock_ms: Callable[[], int] = _wall_clock_ms,
    ) -> Shard:
        """Open ``shard_id``; create it (with ``config``) if missing and ``create``.

        Raises :class:`ShardNotFound` for a missing shard when ``create`` is False.
        """
        versions = StateVersions(consensus, blob, shard_id)
        shard = cls(
            versions, rollup_every=rollup_every, inline_threshold=inline_threshold,
            clock_ms=clock_ms,
        )
        if create:
            versions.maybe_init_shard(config)
        else:
            shard.machine.state()  # raises ShardNotFound
        return shard

    # --- state ------------------------------------------------------------------------

    @property
    def shard_id(self) -> str:
        return self.versions.shard_id

    @property
    def blob(self) -> Blob:
        return self.versions.blob

    @property
    def consensus(self) -> Consensus:
        return self.versions.consensus

    def state(self) -> ShardState:
        """The current state, freshly fetched."""
        return self.machine.state()

    @property
    def upper(self) -> int:
        return self.state().upper

    @property
    def since(self) -> int:
        return self.state().since

    @property
    def seqno(self) -> int:
        return self.state().seqno

    # --- writes -----------------------------------------------------------------------

    def writer_id(self) -> str:
        """This handle's registered writer id, registering a fresh one if it has none."""
        if self._writer_id is None:
            writer_id = new_writer_id()
            self.register_writer(writer_id)
            self._writer_id = writer_id
        return self._writer_id

    def release_writer(self) -> None:
        """End this handle's writer registration (its uncommitted blobs become garbage)."""
        writer_id, self._writer_id = self._writer_id, None
        if writer_id is not None:
            self.machine.apply(lambda s: leases.expire_writer(s, writer_id))

    def writer_lease(
        self, lease_duration_ms: int = leases.DEFAULT_LEASE_DURATION_MS
    ) -> WriterLease:
        """A heartbeated writer registration for a long-running writer (an ingest)."""
        return WriterLease(self.versions, lease_duration_ms=lease_duration_ms,
                           clock_ms=self._clock_ms)

    def write_batch(self, data: pa.Table | pa.RecordBatch, lower: int, upper: int) -> HollowBatch:
        """Write updates with ``lower <= ts < upper`` as a batch (not yet appended)."""
        lower, upper = require_ts(lower, "lower"), require_ts(upper, "upper")
        with writing_as(self.writer_id()):
            return write_batch(
                self.blob, self.shard_id, data, lower, upper,
                inline_threshold=self.inline_threshold,
            )

    def write_errors(self, ts: int, data: pa.Table | pa.RecordBatch) -> ErrorBatch:
        """Write error rows ``(file, row, reason)`` to be committed at ``ts``."""
        with writing_as(self.writer_id()):
            return write_error_batch(
                self.blob, self.shard_id, ts, data, inline_threshold=self.inline_threshold
            )

    def compare_and_append(
        self,
        request: AppendRequest,
        *,
        writer_id: str | None = None,
    ) -> AppendResult:
        """Commit ``request``'s written batch iff the upper is its ``expected_upper`` (see
        ``append.py``), as ``writer_id`` (default: this handle's registration).

        On ``committed=False`` the caller owns the batch's parts (delete them). Raises
        :class:`WriterFenced` (nothing committed) when the writer is not registered.
        """
        writer = writer_id if writer_id is not None else self.writer_id()
        try:
            return _compare_and_append(
                self.machine, request, writer_id=writer, now_ms=self._clock_ms(),
            )
        except WriterFenced:
            if writer == self._writer_id:
                self._writer_id = None  # the next write registers a fresh id
            raise

    def append(
        self,
        data: pa.Table | pa.RecordBatch,
        expected_upper: int,
        new_upper: int | None = None,
        *,
        ingested_files: Mapping[str, int] | None = None,
        errors: pa.Table | None = None,
        config_updates: Mapping[str, str] | None = None,
    ) -> AppendResult:
        """Write ``data`` as the batch ``[expected_upper, new_upper)`` and append it.

        ``new_upper`` defaults to ``expected_upper + 1``; ``errors`` (file, row, reason)
        are committed at ``expected_upper``. When the append does not commit, the
        written parts are deleted before returning. A handle whose registration expired
        (:class:`WriterFenced`) writes the batch again as a new writer, once.
        """
        expected_upper = require_ts(expected_upper, "expected_upper")
        upper = expected_upper + 1 if new_upper is None else require_ts(new_upper, "new_upper")
        for attempt in (1, 2):
            batch = self.write_batch(data, expected_upper, upper)
            error_batches = (
                [] if errors is None else [self.write_errors(expected_upper, errors)]
            )
            # SUBTLE: if this raises, the outcome is unknown (the commit may have happened),
            # so the parts are left to GC's leaked-blob sweep, which spares referenced blobs.
            try:
                result = self.compare_and_append(AppendRequest(
                    batch, expected_upper, ingested_files=ingested_files or {},
                    errors=error_batches, config_updates=config_updates or {},
                ))
            except WriterFenced:
                # Definitely not committed, and GC may have deleted some of these blobs:
                # drop them and write everything again under a fresh registration.
                delete_uncommitted(self.blob, batch, error_batches)
                if attempt == 2:
                    raise
                continue
            if not result.committed:
                delete_uncommitted(self.blob, batch, error_batches)
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    def register_writer(
        self, writer_id: str, lease_duration_ms: int = leases.DEFAULT_LEASE_DURATION_MS
    ) -> ShardState:
        """Register (or refresh) a writer lease; shown by :meth:`inspect`."""
        return self.machine.apply(
            lambda s: leases.register_writer(s, writer_id, self._clock_ms(), lease_duration_ms)
        )

    # --- reads ------------------------------------------------------------------------

    def _read(
        self, start: Reader, same_result: SameResult = lambda old, new: True
    ) -> Iterator[pa.RecordBatch]:
        """Start a read eagerly (errors, including :class:`NotReadable`, at the call) and
        let it resume on a fresh state when GC removed parts under it."""
        state = self.state()
        batches = start(state)  # NotReadable here, at the call
        stream = self._resumable(start, state, batches, same_result)
        first = next(stream, None)
        return iter(()) if first is None else chain([first], stream)

    def _resumable(
        self, start: Reader, state: ShardState, batches: Iterator[pa.RecordBatch],
        same_result: SameResult,
    ) -> Iterator[pa.RecordBatch]:
        """Yield ``batches``; when a part is missing and the state is stale, go on with
        ``start(fresh state)`` from after the last key yielded."""
        last_key: bytes | None = None
        restarts = 0
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except CorruptData:
                # SUBTLE: a streaming read opens and reads parts while it yields, so GC
                # (which deletes parts no live state references once this state is
                # older than its truncation point) can remove a part under it at ANY
                # point. A missing part of a state that is no longer current means
                # exactly that. Resuming is correct because (1) a read's answer is a
                # function of the shard's contents at the read's times, which every
                # later state holding those times agrees on (compaction and GC never
                # change what a readable time shows; ``same_result`` rejects the one
                # case where a moved since changes a ``changes`` answer); (2) output
                # is sorted by key and a key never straddles two batches (read.py), so
                # dropping keys <= the last key yielded neither repeats nor skips
                # rows; (3) parts are immutable and never rewritten, so a part is
                # either read whole or reported missing, never silently different.
                restarts += 1
                if restarts >= READ_ATTEMPTS or self.versions.head_seqno() == state.seqno:
                    raise
                fresh = self.state()
                if last_key is not None and not same_result(state, fresh):
                    raise NotReadable(
                        f"shard {self.shard_id}: since moved from {state.since} to"
                        f" {fresh.since} while the read streamed; read again"
                    ) from None
                state = fresh
                batches = start(state)  # NotReadable if since passed the read's times
                if last_key is not None:
                    batches = _after_key(batches, last_key)
                continue
            if batch.num_rows:
                last_key = batch.column("key")[batch.num_rows - 1].as_py()
                yield batch

    def snapshot(
        self,
        as_of: int | None = None,
        *,
        positive_only: bool = True,
        batch_rows: int = DEFAULT_BATCH_ROWS,
    ) -> Iterator[pa.RecordBatch]:
        """The consolidated contents as of ``as_of`` (default: the newest readable ts)."""
        pinned: list[int] = []

        def start(state: ShardState) -> Iterator[pa.RecordBatch]:
            if not pinned:  # a resumed read keeps the time it started with
                pinned.append(state.upper - 1 if as_of is None else as_of)
            return _snapshot(
                self.blob, state, pinned[0], positive_only=positive_only,
                batch_rows=batch_rows,
            )

        return self._read(start)

    def snapshot_table(self, as_of: int | None = None) -> pa.Table:
        """:meth:`snapshot` collected into one table (for small shards and tests)."""
        return read_all(self.snapshot(as_of))

    def changes(
        self, lower: int, upper: int | None = None, *, batch_rows: int = DEFAULT_BATCH_ROWS
    ) -> Iterator[pa.RecordBatch]:
        """Consolidated updates with ``lower <= ts < upper`` (default: the shard's upper)."""
        pinned: list[int] = []

        def start(state: ShardState) -> Iterator[pa.RecordBatch]:
            if not pinned:  # a resumed read keeps the range it started with
                pinned.append(state.upper if upper is None else upper)
            return _changes(self.blob, state, lower, pinned[0], batch_rows=batch_rows)

        def same_result(old: ShardState, new: ShardState) -> bool:
            # Updates before since are reported AT since, so they join the answer
            # exactly when since reaches lower (since never passes lower here).
            return (old.since == lower) == (new.since == lower)

        return self._read(start, same_result)

    def errors(self) -> Iterator[dict[str, object]]:
        """Every committed error row as ``{"file", "row", "reason"}``, in commit order."""
        state = self.state()
        for err in state.errors:
            table = read_error_part(self.blob, err.part, shard=self.shard_id)
            yield from table.to_pylist()

    # --- maintenance ----------------------------------------------------------------------

    def compact(self, **options: object) -> CompactionResult:
        """Size-tiered compaction (options as ``compact.compact``) as this handle's writer;
        if that registration is gone, once more as a freshly registered one."""
        for attempt in (1, 2):
            writer = self.writer_id()
            try:
                return _compact(
                    self.machine, self.blob, writer_id=writer, **options  # type: ignore[arg-type]
                )
            except WriterFenced:
                if writer == self._writer_id:
                    self._writer_id = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def gc(
        self,
        retain: int | None = None,
        *,
        leak_grace_ms: int = DEFAULT_LEAK_GRACE_MS,
        run_compaction: bool = True,
        typer: PartTyper | None = None,
    ) -> GcReport:
        """Garbage-collect the shard (see ``gc.py``); ``retain`` must be None or >= 1.
        With ``typer`` its compaction writes typed parts (``compact.PartTyper``)."""
        if retain is not None:
            check_retain(retain)  # InvalidUsage before anything changes
        return _gc(
            self.machine, self.blob, retain=retain, leak_grace_ms=leak_grace_ms,
            run_compaction=run_compaction, clock_ms=self._clock_ms, typer=typer,
        )

    def clock_ms(self) -> int:
        """This handle's clock (UTC milliseconds): what commit times and retention use."""
        return self._clock_ms()

    def retention(self) -> int | None:
        """How many newest times the stored retention keeps readable now (None: all):
        the stored count, or the stored duration resolved from commit times."""
        return retention_keep(self.state(), self._clock_ms())

    def retention_for(self) -> int | None:
        """The stored retention duration in seconds (None: none, or a count)."""
        return stored_keep_for(self.state())

    def set_retention(self, keep: int | None) -> int | None:
        """Store ``keep`` (None: keep all history) by compare-and-set; returns it. It
        moves nothing by itself: GC and ingest maintenance apply it (``retention``)."""
        self.machine.apply(with_retention(keep))
        return stored_retention(self.state())

    def set_retention_for(self, seconds: int) -> int:
        """Store a retention of ``seconds`` of commit history (replacing a count) by
        compare-and-set; returns it. Applied like :meth:`set_retention`'s."""
        self.machine.apply(with_retention_for(seconds))
        return seconds

    def check(self) -> CheckReport:
        """Verify storage and consolidation invariants (see ``check.py``)."""
        return check_shard(self)

    def inspect(self) -> dict[str, object]:
        """A JSON-ready summary of the shard's state and storage."""
        state = self.state()
        entries = self.versions.live_diffs()
        blob_bytes = blob_count = 0
        for meta in self.blob.list_keys(shard_prefix(self.shard_id)):
            blob_bytes += meta.size_in_bytes
            blob_count += 1
        return {
            "shard": self.shard_id,
            "seqno": state.seqno,
            "since": state.since,
            "upper": state.upper,
            "retention": retention_keep(state, self._clock_ms()),
            "retention_keep_for": (
                None if (seconds := stored_keep_for(state)) is None else format_duration(seconds)
            ),
            "batches": len(state.batches),
            "parts": sum(len(b.parts) for b in state.batches),
            "updates": state.num_updates(),
            "rollups": len(state.rollups),
            "live_diffs": len(entries),
            "earliest_seqno": entries[0].seqno if entries else None,
            "blob_bytes": blob_bytes,
            "blob_count": blob_count,
            "error_rows": state.num_errors(),
            "writers": len(state.writers),
            "leased_readers": len(state.leased_readers),
            "ingested_files": dict(sorted(state.ingested_files.items())),
            "walltime_ms": state.walltime_ms,
            "since_time": format_time_ms(since_commit_ms(state)),
            "last_commit_time": format_time_ms(last_commit_ms(state)),
        }

    @contextmanager
    def register_reader(
        self,
        reader_id: str | None = None,
        *,
        lease_duration_ms: int = leases.DEFAULT_LEASE_DURATION_MS,
    ) -> Iterator[LeasedReader]:
        """Lease a reader for the ``with`` block; released on exit."""
        rid = reader_id or f"reader-{uuid.uuid4().hex[:12]}"
        state = self.machine.apply(
            lambda s: leases.register_reader(s, rid, self._clock_ms(), lease_duration_ms)
        )
        reader = LeasedReader(self, rid, state)
        try:
            yield reader
        finally:
            self.machine.apply(lambda s: leases.release_reader(s, rid))


class LeasedReader:
    """A reader whose lease keeps GC from removing what its state references.

    ``state`` is the state it reads; it stays readable while the lease lives (call
    :meth:`heartbeat` within the lease duration). :meth:`refresh` moves to the current
    state and advances the hold with it.
    """

    def __init__(self, shard: Shard, reader_id: str, state: ShardState) -> None:
        self.shard = shard
        self.reader_id = reader_id
        self.state = state

    def _apply(self, fn: Callable[[ShardState], ShardState | None]) -> ShardState:
        return self.shard.machine.apply(fn)

    def heartbeat(self) -> None:
        """Keep the lease alive (:class:`LeaseExpired` if it is already gone)."""
        now = self.shard._clock_ms()
        self._apply(lambda s: leases.heartbeat_reader(s, self.reader_id, now))

    def refresh(self) -> ShardState:
        """Read the current state from now on, moving the hold up to it."""
        now = self.shard._clock_ms()
        self.state = self._apply(
            lambda s: leases.heartbeat_reader(s, self.reader_id, now, hold_seqno=s.seqno)
        )
        return self.state

    def downgrade_since(self, since: int) -> None:
        """Promise never to read before ``since`` again (lets compaction advance)."""
        since = require_ts(since, "since")  # 1.5 or True would be stored, then unreadable
        if since < self.held_since():
            raise InvalidUsage(
                f"reader {self.reader_id!r}: since {since} is before its since"
                f" {self.held_since()}"
            )
        self._apply(lambda s: leases.downgrade_reader_since(s, self.reader_id, since))

    def held_since(self) -> int:
        reader = self.shard.state().leased_readers.get(self.reader_id)
        return self.state.since if reader is None else reader.since

    def snapshot(self, as_of: int | None = None) -> Iterator[pa.RecordBatch]:
        """Snapshot of the reader's state as of ``as_of`` (default: its newest ts)."""
        ts = self.state.upper - 1 if as_of is None else as_of
        return _snapshot(self.shard.blob, self.state, ts)

    def changes(self, lower: int, upper: int | None = None) -> Iterator[pa.RecordBatch]:
        """Changes in ``[lower, upper)`` of the reader's state."""
        until = self.state.upper if upper is None else upper
        return _changes(self.shard.blob, self.state, lower, until)
