"""Engines: how the per-file and per-bucket steps of :mod:`~upsert_core.ingest.tasks` run.

An :class:`Engine` turns one :class:`FileTask` into a :class:`FileOutcome`; a
:class:`GroupEngine` can also run several files' tasks as one job
(:mod:`~upsert_core.ingest.group`). The driver (:mod:`~upsert_core.ingest.pipeline`)
owns everything else: planning, the one compare-and-append per file, retries and
cleanup.

Invariants every engine keeps:

- It runs :func:`run_bucket` exactly once per bucket that has rows or is forced
  (:func:`bucket_groups`), with the rows of that bucket in file order, and records the
  file's error part exactly once (:func:`read_file` with ``write_errors`` in one task;
  other tasks may read the same file without it), so all engines produce the same
  updates, checkpoints, error rows and counts.
- It never raises for a bad file or a failed bucket: those are in the outcome, with the
  blobs already written listed for cleanup.
- Every read of the file it does reads the version the driver listed
  (``LandingFile.read_bytes``); if any of them finds the file changed, the outcome
  says so (``FileRead.changed``) and the driver commits nothing of it.

:class:`InProcessEngine` runs the steps sequentially in this process (tests, small
landings, and the fallback when Spark is unavailable); the Spark engine lives in
``resources/spark_ingest.py`` because ``upsert_core`` never imports pyspark.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Literal, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa

from upsert_core.errors import ConfigError
from upsert_core.ingest.buckets import IntArray, bucket_indices, split_rows, take_rows
from upsert_core.ingest.outcome import BucketResult, FileOutcome
from upsert_core.ingest.shard_api import IngestShard
from upsert_core.ingest.spill import BucketSpill
from upsert_core.ingest.statecache import StateCache
from upsert_core.ingest.tasks import (
    FileRead,
    FileTask,
    RowsNotDeferred,
    read_file,
    read_file_streamed,
    run_bucket,
)
from upsert_core.landing import LandingFile, read_counter
from upsert_core.landing.chunks import chunk_rows, stream_threshold, streams
from upsert_core.landing.stream_types import StreamNotExact
from upsert_core.landing.text_chunks import block_bytes
from upsert_core.persist.location import Blob


class Engine(Protocol):
    """Runs the steps of one file; see the module docstring."""

    def run_file(self, task: FileTask, shard: IngestShard) -> FileOutcome: ...


@runtime_checkable
class GroupEngine(Engine, Protocol):
    """An engine that can also run several files as one job (``ingest.group``).

    :meth:`group_size` says how many of a run's pending files, from the first on, it
    runs as one group (below 2: the first runs on its own with :meth:`run_file`); it is
    where an engine chooses, and it decides from the listing alone (no job, no read).
    :meth:`run_group` takes the tasks of ``ingest.group.group_tasks`` and returns the
    outcomes of a prefix of them, in order: every file the group can stand for
    (``group.Verdict.APPLY``, no failed bucket) up to and including the first it stops
    at for an error, a change or a failed bucket, and none for a file it stops before
    (``Verdict.AGAIN``) or never reached. It deleted what it wrote for the files it
    returns no outcome for; it never raises for a bad file or a failed job (a job that
    failed as a whole returns no outcome: the driver runs the group's files on their
    own, one by one)."""

    def group_size(self, files: Sequence[LandingFile], envelope: str) -> int: ...

    def run_group(self, tasks: list[FileTask], shard: IngestShard) -> list[FileOutcome]: ...


def _bucket_column(rows: pa.Table) -> IntArray:
    return np.asarray(rows.column("bucket").to_numpy(), dtype=np.int64)


def bucket_groups(task: FileTask, rows: pa.Table) -> dict[int, pa.Table]:
    """The rows of each bucket that must run for ``task`` (``read_file``'s output split by
    bucket, file order kept), with an empty table for every forced bucket without rows."""
    groups = split_rows(rows, _bucket_column(rows))
    for bucket in task.forced_buckets():
        groups.setdefault(bucket, task.rows_schema.empty_table())
    return groups


THREADS_ENV = "UPSERT_INGEST_THREADS"
MEMORY_ENV = "UPSERT_INGEST_MEMORY_MB"
DEFAULT_MEMORY_MB = 4096
DRAIN_FACTOR = 5
"""A drain holds about this many times its bucket's validated rows (the rows, their
sorted winners, the state, the output updates, their values and encoded part)."""
SPILL_SHARE = 2
"""A streamed file's validated rows stay in memory up to this share of the budget (half:
a 10M-row first file of the wide workload, ~1.4 GB of rows, is then held, not spilled:
41 s instead of 57 s on a busy machine; a 30M-row file spills beyond it and peaked at
4.0 GB, within its 6 GB target)."""


def default_threads() -> int:
    """``UPSERT_INGEST_THREADS``, else the number of CPUs (at least 1)."""
    text = os.environ.get(THREADS_ENV, "").strip()
    if text.isdigit() and int(text) >= 1:
        return int(text)
    return max(1, os.cpu_count() or 1)


def memory_budget() -> int:
    """``UPSERT_INGEST_MEMORY_MB`` (default 4096) in bytes: what a streamed file's
    validated rows held in memory (half of it) and the buckets it drains at once
    may take. One bucket always runs, whatever its size; 0 spills every row to disk and
    drains one bucket at a time."""
    text = os.environ.get(MEMORY_ENV, "").strip()
    if not text:
        return DEFAULT_MEMORY_MB << 20
    if not (text.isascii() and text.isdigit()):
        raise ConfigError(f"{MEMORY_ENV} must be a whole number of MiB (>= 0), got {text!r}")
    return int(text) << 20


def check_streaming_settings() -> None:
    """Raise :class:`ConfigError` for a malformed streaming setting
    (``UPSERT_INGEST_MEMORY_MB``, ``UPSERT_STREAM_BYTES``, ``UPSERT_STREAM_CHUNK_ROWS``,
    ``UPSERT_STREAM_BLOCK_BYTES``),
    so the ingest refuses before it commits anything rather than at its first large
    file."""
    memory_budget()
    stream_threshold()
    chunk_rows()
    block_bytes()


class InProcessEngine:
    """Runs every step in this process: the file's read, then its buckets on up to
    ``threads`` threads (default :func:`default_threads`; the columnar steps spend
    their time in numpy, Arrow and I/O, which release the GIL).

    Each engine keeps its own :class:`StateCache` (pass ``cache=None`` to disable it), so
    consecutive files of one run (or of runs sharing the engine) reuse bucket states.
    With one thread, buckets run in order and the first failure stops the rest; with
    several, every bucket runs and the outcome lists them all (and every blob they
    wrote) in bucket order.
    """

    def __init__(
        self, cache: StateCache | None | Literal["new"] = "new", threads: int | None = None
    ) -> None:
        self.cache = StateCache() if isinstance(cache, str) else cache
        self.threads = default_threads() if threads is None else max(1, threads)

    def run_file(self, task: FileTask, shard: IngestShard) -> FileOutcome:
        if not streams(task.file, task.envelope):
            return self._run_whole(task, shard.blob)
        before = read_counter.bytes_read(task.file.url)
        try:
            return self._run_streamed(task, shard.blob)
        except StreamNotExact:
            # Chunks of a JSON Lines or CSV file typed a column otherwise than the whole
            # file does, or met a file-level problem: read it whole, exactly as a
            # smaller file (nothing was written; the spill is gone).
            refused = read_counter.bytes_read(task.file.url) - before
        outcome = self._run_whole(task, shard.blob)
        outcome.read.landing_bytes += refused  # the report counts every read
        return outcome

    def _run_whole(self, task: FileTask, blob: Blob) -> FileOutcome:
        read, rows = read_file(task, blob)
        outcome = FileOutcome(read=read)
        if read.file_error is not None or read.changed is not None:
            return outcome
        # Each bucket takes its own rows in its worker (the takes run in parallel).
        indices = bucket_indices(_bucket_column(rows))
        order = sorted({*indices, *task.forced_buckets()})

        def load(bucket: int) -> pa.Table:
            if bucket not in indices:
                return task.rows_schema.empty_table()
            return take_rows(rows, indices[bucket])

        self._guarded(task, read, order, load, self.threads, blob, outcome)
        return outcome

    def _run_streamed(self, task: FileTask, blob: Blob) -> FileOutcome:
        """A large file read in chunks, its rows spilled by bucket (``ingest.spill``) and
        each bucket's read back when its drain starts: memory follows a chunk while
        reading and the buckets in flight while draining, whose number the memory
        budget bounds (:func:`memory_budget`)."""
        before = read_counter.bytes_read(task.file.url)
        try:
            return self._run_spilled(task, blob)
        except RowsNotDeferred:
            # A chunk of the shard's first file needed its rows encoded, or changed the
            # columns: read it again with every chunk encoded, so all are of one kind
            # (nothing was written).
            discarded = read_counter.bytes_read(task.file.url) - before
        outcome = self._run_spilled(replace(task, may_defer_rows=False), blob)
        outcome.read.landing_bytes += discarded  # the report counts every read
        return outcome

    def _run_spilled(self, task: FileTask, blob: Blob) -> FileOutcome:
        with BucketSpill(task.rows_schema, memory_limit=memory_budget() // SPILL_SHARE) as spill:
            read = read_file_streamed(task, blob, spill.add)
            outcome = FileOutcome(read=read)
            if read.file_error is not None or read.changed is not None:
                return outcome
            order = sorted({*spill.buckets(), *task.forced_buckets()})
            largest = max(spill.bytes.values(), default=0)
            workers = max(1, min(self.threads, memory_budget() // max(1, DRAIN_FACTOR * largest)))
            # Deferred rows (a first file) stay in their chunks: the bucket step takes
            # them into key order or combines them itself (tasks.run_bucket).
            load = functools.partial(spill.table, combine=not task.defers_rows)
            self._guarded(task, read, order, load, workers, blob, outcome)
            return outcome

    def _guarded(
        self, task: FileTask, read: FileRead, order: list[int],
        load: Callable[[int], pa.Table], threads: int, blob: Blob, outcome: FileOutcome,
    ) -> None:
        try:
            self._run_buckets(task, read, order, load, threads, blob, outcome)
        except BaseException:
            # SUBTLE: an unexpected error (not a platform error, which run_bucket
            # reports as a failure) escapes: the driver never sees this outcome, so
            # the blobs of the buckets that finished are removed here.
            for key in outcome.new_blobs:
                with contextlib.suppress(Exception):  # best effort; GC's leak sweep remains
                    blob.delete(key)
            raise

    def _run_buckets(
        self, task: FileTask, read: FileRead, order: list[int],
        load: Callable[[int], pa.Table], threads: int, blob: Blob, outcome: FileOutcome,
    ) -> None:
        def run(bucket: int) -> BucketResult:
            return run_bucket(task, bucket, load(bucket), blob, self.cache, read.schema_json)

        workers = min(threads, len(order))
        if workers > 1:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bucket") as pool:
                futures = [pool.submit(run, b) for b in order]
                error: BaseException | None = None
                for future in futures:  # every bucket's result, even after an error
                    try:
                        outcome.buckets.append(future.result())
                    except BaseException as exc:  # noqa: BLE001 - re-raised below
                        error = error or exc
            if error is not None:
                raise error
            return
        for bucket in order:
            result = run(bucket)
            outcome.buckets.append(result)
            if result.failure is not None:
                break
