"""The ingest driver: every pending landing file, in name order, one timestamp each.

For each pending file the driver plans a :class:`FileTask` against the shard's current
state (ts = upper, the shard's options and schema, the bucket checkpoints), lets the
engine run the read and bucket steps, and commits the result with ONE
compare-and-append of the batch ``[ts, ts + 1)``: all parts, the file name, its error
rows, its late rows (``ingest.late``), the evolved schema, the options and the new
checkpoint references together.

Invariants:

- A file is applied at most once: its name is committed in the same transition as its
  data, errors and checkpoints (``append`` rejects a name already recorded).
- A file-level problem raises :class:`IngestError` ``"<file>: <problem>"`` after
  deleting what its steps wrote; files committed before it stay committed, later files
  wait for the next run.
- On an upper mismatch the driver deletes the blobs it wrote for the attempt, re-reads
  the shard, skips the file if another writer committed it, and otherwise retries it
  at the new upper (re-planned, so schema, options and checkpoints are the winner's),
  at most ``IngestRequest.max_attempts`` times, then raises
  :class:`ConcurrentModification` ("concurrently modified").
- Groups (``ingest.group``): an engine that runs several files as one job
  (``engine.GroupEngine``; the Spark engine) gets the pending files from the next one
  on, as many as its ``group_size`` says (at least two), planned before any commits;
  the driver then commits its outcomes file after file as above, each only after
  checking that the shard is the one the group planned for it (same ts and commit
  history, same entries for the buckets it ran). A file-level problem or a changed file
  in a group ends the run as for a file on its own; anything else that stops a group (a
  failed bucket, a lost race, a fenced writer, a file the group could not stand for)
  commits the files before it and hands it back to the loop, which runs it again (a
  group that applied nothing: the file on its own, with the retries above). A group
  whose job failed as a whole (no outcome) is not tried again: its files go one by one,
  so a file that kills the job (its workers) costs one failed job, not one per file
  before it. The blobs of a group's files that are not committed are deleted, except
  those of an append whose outcome is not known.
- Buckets grow with the table: after each file it committed, between two files (no
  plan in flight), a run that named no bucket count doubles the shard's count as its own
  writer when the buckets outgrew the target state per bucket
  (``rebucket.grown_buckets``; ``UPSERT_AUTO_REBUCKET=0`` turns it off); the next file is
  planned on the new count. Every other writer is fenced by it; a rebucket that fails
  is a warning, and the run goes on with the count it has.
- Nothing pending: nothing is written and the upper does not move.
- ``through=NAME`` (one Dagster partition) stops before the first pending file whose
  name sorts after NAME: such files are never planned or read, and the progress total
  counts only the files it will apply.
- Options are checked against the stored ones before any file is read, and again on
  every attempt (a racing first ingest may have fixed them meanwhile).
- A file that changed between the listing and its reading (still being written) is
  not an error and is never committed half-read: nothing of it is applied, its blobs
  are deleted, and the run ends there with a warning naming it; it and every later
  pending file (``IngestReport.pending``) wait for the next run, which lists them
  afresh. Later files wait because files are applied in name order, and applying them
  first would give the changed file a later timestamp than files that sort after it.
- A file is recorded with its name: its ledger record (size, content digest, listed
  version; ``ingest.ledger``) is in the same compare-and-append. Every run first names
  each listed file rewritten under an ingested name in a warning (a progress event as
  well, so it shows even if the run then fails) and records them as the last run's
  ``rewritten_files``; such a file is never ingested again.
- Hidden files (``_temporary/``, ``.crc``, ...) are never listed, so never ingested;
  a file with a bad name is listed with its problem and stops the run at that file.
- The run is a registered writer (``persist.write.writers``): it registers a fresh writer id
  before the first file and heartbeats it while it works; every blob its steps write
  names that id. If the registration is gone at commit time (the run stalled past its
  lease and GC removed it, and may have deleted its blobs), the append is refused
  (``WriterFenced``), nothing of the attempt is committed, and the driver deletes what
  the attempt wrote, registers a new id and redoes the file: the user sees a retry.
  The registration is released when the run ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from upsert_core.errors import (
    ConcurrentModification,
    ConfigError,
    IngestError,
    LandingFileChanged,
    UpsertPlatformError,
    WriterFenced,
)
from upsert_core.ingest.base_cache import check_settings as check_base_cache_settings
from upsert_core.ingest.engine import (
    Engine,
    GroupEngine,
    InProcessEngine,
    check_streaming_settings,
)
from upsert_core.ingest.group import BucketEntries, GroupChain, group_tasks, tombstones_after
from upsert_core.ingest.late import late_entries
from upsert_core.ingest.ledger import find_rewritten, rewritten_transition, with_ledger
from upsert_core.ingest.maintenance import auto_maintenance_from_env, maintain_after_ingest
from upsert_core.ingest.options import IngestRequest, buckets_for_first_file, resolve_options
from upsert_core.ingest.outcome import FileOutcome
from upsert_core.ingest.plan import plan_file
from upsert_core.ingest.rebucket import auto_rebucket_from_env, grown_buckets, rebucket
from upsert_core.ingest.report import FileReport, IngestReport, ProgressEvent
from upsert_core.ingest.shard_api import IngestShard
from upsert_core.ingest.shard_config import ShardIngestConfig, ShardOptions, recent_history
from upsert_core.ingest.tasks import FileTask
from upsert_core.landing import LandingFile, SourceSchema, list_landing, pending, read_counter
from upsert_core.persist.location import Blob
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.state import HollowBatch, ShardState
from upsert_core.persist.write.append import AppendRequest, AppendResult
from upsert_core.persist.write.writers import WriterLease

Progress = Callable[[ProgressEvent], None]


def commit_history(config: Mapping[str, str]) -> dict[int, str]:
    """The recorded ``{upper: nonce}`` of recent ingest commits (empty if malformed)."""
    return dict(ShardIngestConfig.read(config).history)


def checkpoints_current(state: ShardState) -> bool:
    """Whether the checkpoint refs in ``state.config`` describe the state at its upper."""
    return ShardIngestConfig.read(state.config).checkpoints_current(state.upper)


def _delete_new_blobs(
    blob: Blob, outcome: FileOutcome, current: ShardState | None = None
) -> None:
    """Delete the blobs the attempt wrote, sparing any that ``current`` references."""
    keep = set() if current is None else set(current.referenced_blob_keys())
    for key in outcome.new_blobs:
        if key not in keep:
            blob.delete(key)


def _commit_request(task: FileTask, options: ShardOptions, outcome: FileOutcome) -> AppendRequest:
    parts = tuple(p for b in sorted(outcome.buckets, key=lambda r: r.bucket) for p in b.parts)
    batch = HollowBatch(lower=task.ts, upper=task.ts + 1, since=0, parts=parts)
    errors = [] if outcome.read.error_batch is None else [outcome.read.error_batch]
    evolved = outcome.read.schema_json
    # What this commit changes; the buckets it did not run keep their entries.
    committed = ShardIngestConfig(
        options=options if evolved is None
        else replace(options, schema=SourceSchema.from_json(evolved)),
        checkpoint_upper=task.ts + 1,
        checkpoint_refs={r.bucket: r.checkpoint or "" for r in outcome.buckets},
        checkpoint_bases={r.bucket: r.base for r in outcome.buckets if r.base is not None},
        tombstone_refs=tombstones_after(task, outcome.buckets),
        live_rows=_live_rows_after(task, outcome),
        live_rows_unknown=True,  # written only when the count is not known
        # SUBTLE: the nonce was minted when the task was planned, so the engine could
        # tag its cached states with it before the commit that makes them valid.
        commit_nonce=task.commit_nonce,
        history=recent_history(task.history, task.ts + 1, task.commit_nonce),
    )
    # The buckets' late parts commit with the batch (ingest.late).
    late = late_entries(task.ts, {r.bucket: r.late for r in outcome.buckets if r.late})
    return AppendRequest(
        batch, task.ts, ingested_files={task.file.name: task.ts}, errors=errors,
        config_updates={**committed.entries(), **late},
    )


def live_rows(config: Mapping[str, str]) -> int | None:
    """The number of live rows the ingest recorded for the shard at its upper, or None
    for a shard whose first files were ingested before the count was kept."""
    return ShardIngestConfig.read(config).live_rows


def _live_rows_after(task: FileTask, outcome: FileOutcome) -> int | None:
    """Live rows once this file commits: the count before it plus its insertions minus
    its retractions (each output update adds or removes one row of the collection)."""
    state = task.shard_state
    if state is None:
        return None
    # Only a count an ingest commit recorded for this very upper is the count before
    # this file: after a commit made outside the ingest it is an older upper's.
    before = ShardIngestConfig.read(state.config).live_rows_at(state.upper)
    if before is not None:
        return before + sum(b.inserts - b.retractions for b in outcome.buckets)
    # Unknown before, but when every bucket was rebuilt from the shard (checkpoints
    # stale: all run), their rebuilt states count the rows exactly.
    rebuilt = {b.bucket: b.live_after for b in outcome.buckets}
    if len(rebuilt) == task.buckets and all(n is not None for n in rebuilt.values()):
        return sum(n for n in rebuilt.values() if n is not None)
    return None


def _file_report(
    task: FileTask, outcome: FileOutcome, seconds: float, attempt: int,
    landing: tuple[int, int],
) -> FileReport:
    read = outcome.read
    return FileReport(
        name=task.file.name,
        ts=task.ts,
        rows_read=read.rows_read,
        inserts=sum(b.inserts for b in outcome.buckets),
        retractions=sum(b.retractions for b in outcome.buckets),
        errors=0 if read.error_batch is None else read.error_batch.num_errors,
        late_rows=sum(b.late_rows for b in outcome.buckets),
        bytes_written=read.bytes_written + sum(b.bytes_written for b in outcome.buckets),
        seconds=seconds,
        rehydrated_buckets=tuple(b.bucket for b in outcome.buckets if b.rehydrated),
        attempts=attempt,
        skipped=read.skipped,
        size=task.file.size,
        landing_bytes_read=landing[0] + landing[1],
        digest_bytes_read=landing[1],
        read_tasks=read.read_tasks,
        drain_tasks=read.drain_tasks,
        task_peak_memory=read.task_peak_memory,
        read_memory_added=read.read_memory_added,
        drain_memory_added=read.drain_memory_added,
        largest_bucket_keys=max((b.state_keys for b in outcome.buckets), default=0),
    )


def _sized(request: IngestRequest, state: ShardState, file: LandingFile) -> IngestRequest:
    """``request``, with the bucket count a new shard gets from the size of its first
    file when the request names none (``options.buckets_for_first_file``). Decided per
    attempt: a shard another writer created meanwhile keeps its own count."""
    if request.buckets is not None or ShardIngestConfig.read(state.config).options is not None:
        return request
    return replace(request, buckets=buckets_for_first_file(file.size, file.suffix))


def _ingest_one(
    shard: IngestShard,
    state: ShardState,
    file: LandingFile,
    request: IngestRequest,
    engine: Engine,
    report: IngestReport,
    lease: WriterLease,
) -> tuple[ShardState, FileReport | None]:
    """Commit ``file`` (or notice another writer did); returns the new state."""
    attempts = max(1, request.max_attempts)
    landing_bytes = digest_bytes = 0  # over every attempt
    for attempt in range(1, attempts + 1):
        if lease.lost:  # the heartbeat found the registration gone: a new id first
            report.warnings.append(
                f"{file.name}: writer {lease.writer_id} lost its registration (stalled past"
                " its lease?); registered again as a new writer before planning"
            )
            lease.renew()
        options = resolve_options(state.config, _sized(request, state, file))
        task = plan_file(state, options, file, request, lease.writer_id)
        started = time.monotonic()
        outcome = engine.run_file(task, shard)
        landing_bytes += outcome.read.landing_bytes
        if outcome.read.changed is not None:
            _delete_new_blobs(shard.blob, outcome)
            raise LandingFileChanged(outcome.read.changed)
        if outcome.read.file_error is None and outcome.failure is not None:
            # SUBTLE: a bucket step reads the shard as of the planned state (replaying
            # changes since a checkpoint base, or rehydrating). A concurrent GC may
            # delete parts that only states older than its truncation point reference,
            # so the step fails with a "missing part" although nothing is wrong. If the
            # shard moved meanwhile, plan again on the fresh state; a failure that
            # repeats on an unchanged state is reported.
            fresh = shard.state()
            if fresh.seqno != state.seqno and attempt < attempts:
                _delete_new_blobs(shard.blob, outcome, fresh)
                state = fresh
                if file.name in state.ingested_files:
                    return state, None
                continue
        if outcome.read.file_error is not None or outcome.failure is not None:
            _delete_new_blobs(shard.blob, outcome)
            message = outcome.read.file_error or f"{file.name}: {outcome.failure}"
            raise IngestError(message)
        try:
            result, read_again = _commit(shard, task, options, outcome)
        except WriterFenced as exc:
            # Determinate: nothing of this attempt was committed (and GC may have
            # deleted some of its blobs). Redo the file under a fresh registration.
            _delete_new_blobs(shard.blob, outcome)
            report.warnings.append(
                f"{file.name}: {exc}; redoing it as a new writer (attempt {attempt + 1})"
            )
            lease.renew()
            state = shard.state()
            if file.name in state.ingested_files:
                return state, None
            continue
        digest_bytes += read_again
        if _ours(result, task):
            file_report = _file_report(
                task, outcome, time.monotonic() - started, attempt,
                (landing_bytes, digest_bytes),
            )
            _note_buckets(report, file.name, outcome)
            return result.state, file_report
        _delete_new_blobs(shard.blob, outcome, result.state)
        state = result.state
        if file.name in state.ingested_files:
            return state, None
    raise ConcurrentModification(
        f"shard {shard.shard_id}: concurrently modified: {file.name} lost the race to "
        f"another writer {attempts} times; re-run the ingest"
    )


def _commit(
    shard: IngestShard, task: FileTask, options: ShardOptions, outcome: FileOutcome
) -> tuple[AppendResult, int]:
    """One compare-and-append of ``task``'s outcome, with the file's ledger record; the
    result and the landing bytes the ledger's digest read. Raises ``IngestError`` (the
    file changed since it was read, or cannot be read: its blobs deleted) and
    ``WriterFenced`` (nothing committed; its blobs are the caller's)."""
    file = task.file
    before = read_counter.bytes_read(file.url)
    try:  # the file's ledger record commits with its name (ingest.ledger)
        commit = with_ledger(_commit_request(task, options, outcome), file,
                             outcome.read.digest)
    except IngestError:  # changed since it was read (LandingFileChanged) or unreadable
        _delete_new_blobs(shard.blob, outcome)
        raise
    finally:  # the digest reads the file again unless the engine's read digested it
        read_again = read_counter.bytes_read(file.url) - before
    # SUBTLE: if the append fails indeterminately (an exception, e.g. a timeout), it
    # may have committed: the blobs are left alone (GC's leak sweep removes them if
    # not); they are deleted only on a definite "not committed".
    return shard.compare_and_append(commit, writer_id=task.writer_id), read_again


def _ours(result: AppendResult, task: FileTask) -> bool:
    """Whether ``result`` committed ``task``'s attempt.

    SUBTLE: two writers can build byte-identical batches (inline parts, same file at the
    same ts); ``append`` then reports the loser's request as "already applied". A
    per-attempt nonce in the config (``task.commit_nonce``, fresh per plan) tells our
    commit from theirs, so the loser deletes its checkpoints and does not report the
    file as its own."""
    return (result.committed
            and ShardIngestConfig.read(result.state.config).commit_nonce == task.commit_nonce)


def _note_buckets(report: IngestReport, name: str, outcome: FileOutcome) -> None:
    """Report the committed file's rebuilt buckets and its buckets' warnings."""
    for b in outcome.buckets:
        if b.rehydrated:
            report.rehydrations.append(
                f"{name}: bucket {b.bucket} rehydrated from the shard ({b.rehydrated})"
            )
        report.warnings.extend(b.warnings)


@dataclass
class _Run:
    """One run's driver loop: what it works with and which pending file is next."""

    shard: IngestShard
    request: IngestRequest
    engine: Engine
    report: IngestReport
    lease: WriterLease
    notify: Progress
    todo: list[LandingFile]
    next: int = 0  # the index in ``todo`` of the next file to settle
    alone_until: int = 0  # files before this index in ``todo`` run one by one
    growth_failed: bool = False  # a failed growth is not tried again in this run

    def notify_started(self, file: LandingFile) -> None:
        self.notify(ProgressEvent("file_started", self.next + 1, len(self.todo), file.name))

    def settled(self, done: FileReport | None) -> None:
        """The next file is in the shard: committed by this run (``done``) or not."""
        file, index, total = self.todo[self.next], self.next + 1, len(self.todo)
        if done is None:
            self.report.ingested_elsewhere.append(file.name)
            self.notify(ProgressEvent("file_skipped", index, total, file.name))
        else:
            self.report.files.append(done)
            self.notify(ProgressEvent("file_done", index, total, file.name, done))
        self.next += 1


def _ingest_group(run: _Run, state: ShardState) -> ShardState:
    """Run the pending files from ``run.next`` on as one group when the engine groups
    them (``ingest.group``), and commit them file after file; returns the shard's state.

    Settles the files it commits (``run.next`` moves past them) and stops at the first
    it cannot commit: a file-level problem raises ``IngestError`` and a changed file
    ``LandingFileChanged`` (as for a file on its own); a failed bucket, a lost race, a
    fenced writer, or a file the group could not stand for leave it (and the files
    after it) to the driver's loop, which runs it again."""
    engine, request, shard = run.engine, run.request, run.shard
    if not isinstance(engine, GroupEngine) or run.lease.lost or run.next < run.alone_until:
        return state  # (a lost registration: the loop's file on its own renews it)
    files: list[LandingFile] = []
    for file in run.todo[run.next:]:
        if file.name in state.ingested_files:
            break  # (the loop skips it)
        files.append(file)
    options = resolve_options(state.config, _sized(request, state, files[0]))
    size = engine.group_size(files, options.envelope.value)
    if size < 2:
        return state
    tasks = group_tasks(plan_file(state, options, files[0], request, run.lease.writer_id),
                        files[:size])
    run.notify_started(files[0])
    started = time.monotonic()
    outcomes = engine.run_group(tasks, shard)
    if not outcomes:
        # SUBTLE: the job failed as a whole. A group from the next file on would hold
        # the same files, and whatever failed it (say a file that kills the workers)
        # would fail it again, once per file before that one, each reading the rest of
        # the group again and leaving its blobs to GC: the group's files go one by one,
        # and the file-level failure, if any, is reported by the file's own job.
        run.alone_until = run.next + len(tasks)
    share = (time.monotonic() - started) / max(1, len(outcomes))
    chain = GroupChain(tasks)
    done = 0
    in_flight: int | None = None  # an append whose outcome is not known
    try:
        for k, outcome in enumerate(outcomes):
            if outcome.read.changed is not None:
                raise LandingFileChanged(outcome.read.changed)
            if outcome.read.file_error is not None:
                raise IngestError(outcome.read.file_error)
            if outcome.failure is not None:
                break  # the loop runs it on its own (and retries a concurrent GC's race)
            committing = time.monotonic()
            file = tasks[k].file
            options = resolve_options(state.config, _sized(request, state, file))
            plan = replace(plan_file(state, options, file, request, run.lease.writer_id),
                           commit_nonce=tasks[k].commit_nonce)
            if not _as_planned(chain.task(k), plan, outcome):
                break
            in_flight = k
            try:
                result, digest_bytes = _commit(shard, plan, options, outcome)
            except WriterFenced as exc:
                in_flight = None  # determinate: nothing was committed
                run.report.warnings.append(f"{file.name}: {exc}; redoing it as a new writer")
                run.lease.renew()
                state = shard.state()
                break
            in_flight = None
            state = result.state
            if not _ours(result, plan):
                break
            _note_buckets(run.report, file.name, outcome)
            run.settled(_file_report(plan, outcome, share + time.monotonic() - committing, 1,
                                     (outcome.read.landing_bytes, digest_bytes)))
            chain.advance(outcome.buckets)
            done += 1
            if k + 1 < len(outcomes):
                run.notify_started(tasks[k + 1].file)
    finally:
        # Nothing after the last commit is committed, and never will be: its blobs go
        # (sparing any the shard references, say a racing writer's identical inline
        # commit), except those of an append that may have committed (an indeterminate
        # failure: left to GC's leak sweep, as for a file on its own).
        for k in range(done, len(outcomes)):
            if k != in_flight:
                _delete_new_blobs(shard.blob, outcomes[k], state)
    return state


def _grown(run: _Run, state: ShardState) -> ShardState:
    """Between two of the run's files (nothing planned): when the shard's buckets
    outgrew the target state per bucket, double them as the run's own writer
    (``ingest.rebucket``); returns the shard's state. A rebucket that fails is a
    warning: the run goes on with the count it has, and does not try again (a rebucket
    may rewrite all the retained history, three times when it loses races)."""
    grown = grown_buckets(state)
    if grown is None or run.growth_failed or not isinstance(run.shard, Shard):
        return state
    try:
        done = rebucket(run.shard, grown, request=run.request, lease=run.lease)
    except UpsertPlatformError as exc:
        run.growth_failed = True
        run.report.warnings.append(
            f"shard {run.shard.shard_id}: its buckets outgrew the target state per bucket,"
            f" but growing them to {grown} failed ({exc}); the next ingest tries again, or"
            f" run `upsertctl rebucket --shard {run.shard.shard_id} --buckets {grown}`"
        )
        return run.shard.state()
    if done.changed:
        run.report.rebucketed.append({"after_ts": state.upper - 1, **done.to_dict()})
        run.report.warnings.extend(done.warnings)
    return run.shard.state()


def _as_planned(predicted: FileTask, plan: FileTask, outcome: FileOutcome) -> bool:
    """Whether the shard about to take ``outcome`` is the one its group predicted for it
    (``group.GroupChain``): same ts and commit history, and for every bucket it ran, the
    same checkpoint, base and tombstone entries. Always so unless someone else changed
    the shard between the group's commits, which the append then refuses anyway; checked
    so that a difference can never commit a bucket step made for another state."""
    return (
        predicted.ts == plan.ts
        and predicted.history == plan.history
        and plan.checkpoints_current == predicted.checkpoints_current
        and all(BucketEntries.of(predicted, b.bucket) == BucketEntries.of(plan, b.bucket)
                for b in outcome.buckets)
    )


def _note_rewritten(
    shard: IngestShard, files: list[LandingFile], state: ShardState, report: IngestReport,
    notify: Progress,
) -> None:
    """Warn of every listed file rewritten under an ingested name, and record their names
    as the last ingest's (``ingest.ledger``; a state change only when they change)."""
    found, unreadable = find_rewritten(files, state)
    report.rewritten = [r.name for r in found]
    for text in [*(r.warning() for r in found), *unreadable]:
        report.warnings.append(text)
        notify(ProgressEvent("warning", 0, 0, message=text))
    if isinstance(shard, Shard):
        shard.machine.apply(rewritten_transition(report.rewritten))


def ingest(
    shard: IngestShard,
    landing_url: str,
    options: IngestRequest,
    *,
    engine: Engine | None = None,
    progress: Progress | None = None,
    through: str | None = None,
) -> IngestReport:
    """Ingest every pending file of ``landing_url`` into ``shard`` (with ``through``: only
    those whose names sort at or before it); see the module docstring."""
    engine = engine if engine is not None else InProcessEngine()
    notify = progress if progress is not None else (lambda event: None)
    # Settings are checked before anything is ingested (a bad one must not fail the run
    # after its files are committed).
    maintain = auto_maintenance_from_env() if options.maintain is None else options.maintain
    # A count the request names is the deployment's choice: the run never grows it.
    grow = options.buckets is None and auto_rebucket_from_env()
    check_streaming_settings()
    check_base_cache_settings()
    state = shard.state()
    try:
        resolve_options(state.config, options)
    except ConfigError as exc:
        raise ConfigError(f"shard {shard.shard_id!r}: {exc}") from None
    files = list_landing(landing_url)
    todo = pending(files, state.ingested_files.keys())
    if through is not None:
        todo = [f for f in todo if f.name <= through]
    report = IngestReport(shard=shard.shard_id, start_upper=state.upper)
    total = len(todo)
    notify(ProgressEvent("start", 0, total))
    _note_rewritten(shard, files, state, report, notify)
    if not todo:
        report.upper, report.seqno = state.upper, state.seqno
        notify(ProgressEvent("done", total, total))
        return report
    with shard.writer_lease(options.writer_lease_ms) as lease:
        state = shard.state()
        run = _Run(shard, options, engine, report, lease, notify, todo)
        while run.next < len(todo):
            file = todo[run.next]
            try:
                if file.name in state.ingested_files:
                    run.settled(None)
                    continue
                state = _ingest_group(run, state)
                if run.next < len(todo) and todo[run.next] is file:
                    # No group, or one that applied nothing: this file on its own.
                    run.notify_started(file)
                    state, done = _ingest_one(shard, state, file, options, engine, report,
                                              lease)
                    run.settled(done)
                if grow and isinstance(shard, Shard):
                    state = _grown(run, state)
            except LandingFileChanged as exc:
                # Files are applied in name order: the ones after it wait with it.
                report.pending = [f.name for f in todo[run.next:]]
                later = len(report.pending) - 1
                report.warnings.append(
                    f"{exc}; left pending for the next run"
                    + (f", with the {later} file(s) after it" if later else "")
                )
                break
    if report.files and isinstance(shard, Shard) and maintain:
        done_maintenance, warning = maintain_after_ingest(shard)
        report.maintenance = None if done_maintenance is None else done_maintenance.to_dict()
        if warning is not None:
            report.warnings.append(warning)
    state = shard.state()  # after the release of the registration
    report.upper = state.upper
    report.seqno = state.seqno
    notify(ProgressEvent("done", total, total))
    return report


__all__ = ["checkpoints_current", "commit_history", "ingest", "plan_file"]
