"""The Spark engine: the per-file and per-bucket ingest steps as Spark tasks.

A file takes one of three paths, chosen in ``resources/spark_paths.py`` from the listing
(``split_plan``: ``UPSERT_SPARK_SPLIT`` auto|on|off, ``UPSERT_SPARK_SPLIT_BYTES``;
``group_size``): a Parquet or JSON Lines file larger than a split is read once, by read
tasks, and shuffled by bucket (``resources/spark_split.py``); several pending files that
are not split run as one job of this path's shape (``resources/spark_group.py``,
:meth:`SparkEngine.run_group`); any other file, and a split file whose splits cannot
stand for it (``split_steps.Fallback``), takes the one-stage path described here. All
return the same result lines (``resources/spark_lines.py``) to ``outcome_of``.

The one-stage path: for one file (see ``upsert_core.ingest.tasks``), ONE Spark stage of
``S`` tasks (the *slices*; ``S = min(buckets, default parallelism)`` unless given), and
no shuffle:

1. every task reads the landing file itself (local or ``s3://`` through the landing
   module; Spark has no s3a here), validates it and splits the good rows by bucket;
   only slice 0 writes the file's error part and reports its :class:`FileRead`, plus
   the list of buckets that must run;
2. slice ``i`` runs :func:`run_bucket` for the buckets ``b`` with ``b % S == i``: loads
   the bucket's state (worker cache, checkpoint, replay or rehydration), drains, writes
   parts and the checkpoint straight to Blob, and returns the :class:`BucketResult`;
3. the driver collects those few JSON lines (metadata only, never data rows), checks
   that every bucket that had to run ran exactly once, and builds a
   :class:`FileOutcome`; the ingest driver commits it like any engine's.

Why this shape for small files (measured on the bench workload, 2 cores): a shuffle of
the encoded rows through the JVM plus a second stage cost more than reading the file
once per slice (a read is a small part of a bucket step); for large files the reads add
up (a 1 GB file on 64 buckets would be read 64 times), hence the split path. The stage
is ``mapInArrow`` over ``spark.range(S, numPartitions=S)`` (one row, the slice number,
per partition) on every kind of session: a classic one (``local[*]``, a standalone
cluster) and a Spark Connect one alike, so there is one code path and it is the one a
long-lived Connect server runs. It used to be the RDD API
(``parallelize(...).mapPartitionsWithIndex``) on classic sessions, chosen because it
skips the SQL planner and the Arrow exchange; but Spark Connect has no RDD API. The
price, measured on 2 shared cores (issue 12): an empty two-task job costs about 50-70 ms
more through ``mapInArrow`` (building the Arrow UDF and planning take ~40 py4j round
trips; ``toArrow()`` instead of ``collect()`` saves nothing), against a bucket step of
0.2-0.3 s; whole bench batches (1M keys, 100k rows) ranged 0.28-0.99 s on the RDD path
and 0.44-1.34 s on this one as the machine's load varied, too noisy to separate. A
long-lived Connect server saves 9-13 s per command.

Invariants:

- Tasks get strings and bytes only (the file task with the shard state encoded, the
  blob URL); each opens its own Blob with ``urls.open_blob`` (cached per worker).
- Every slice reads the version of the file the driver listed: the shipped
  :class:`LandingFile` carries its size and version (the S3 ETag, pinned with
  ``IfMatch``; locally inode and mtime), so a slice reads exactly those bytes or
  reports ``changed``, and one ``changed`` from any slice leaves the whole file pending
  (the driver deletes what the other slices wrote). A batch never mixes two versions.
- Every error inside a task is caught and returned as metadata, so a bad file ends in
  a one-line :class:`IngestError` on the driver, never a Java stack trace; a failed
  job (a dead worker) becomes one too. Every slice validates the same bytes with the
  same schema, so they agree on a file-level error; slice 0 reports it.
- Slices claim buckets through a per-file directory of symlinks (``_Claims``) only when
  every task runs on this host: a classic session on a ``local`` master. A Spark
  Connect session (whatever the server's master: the server may be on another host) and
  a cluster master use the fixed assignment ``b % S == i``. The master is read with
  ``spark.conf.get("spark.master")``, which answers on both kinds of session.
- Each Python worker keeps a :class:`StateCache` of the bucket states its tasks
  produced; a task that lands on a worker holding its bucket's state (as of a
  committed upper) skips the checkpoint load, and one holding an older committed state
  catches up by replay (batch scope). Which worker runs which slice is up to Spark, so
  a miss is normal and only costs the load.
- Python workers run each task with the cyclic collector off and freeze their heap
  (``gc.freeze``) after it: the cached states are millions of long-lived objects, and
  without that every full collection re-scans them (over a second per batch at 1M
  keys). See ``_frozen_after``.
- ``AWS_*`` variables set in the driver's environment are shipped with every task and
  override the worker's (reused workers must not keep an earlier task's endpoint);
  variables the driver does not set are the executor's own, as its worker had them
  before any task (e.g. credentials configured on a cluster), never an earlier
  driver's (``resources/task_env.py``).
- The driver's writer token (``UPSERT_WRITER_TOKEN``, see ``upsert_core.persist.keys``)
  is shipped with every task too and always mirrored: set when the driver has one,
  removed when it has none. Executors of a cluster do not inherit the driver's
  environment, and a reused worker must never name a new blob after an earlier
  driver: GC deletes the uncommitted blobs of a writer it can prove dead.
- With ``UPSERT_SPARK_PROFILE_DIR`` set in the workers' environment, each task writes
  a cProfile dump and a timeline line there (see ``_Profiled``); off by default.
"""

from __future__ import annotations

import cProfile
import dataclasses
import gc
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from resources.spark_group import group_outcomes, run_group_job
from resources.spark_lines import (
    BUCKET,
    CHANGED,
    ERROR,
    EXPECT,
    LANDING,
    READ,
    lines_of,
    outcome_of,
)
from resources.spark_paths import group_size, split_plan
from resources.spark_session import is_connect, master_of
from resources.spark_split import SplitRun, WorkerHooks, run_split_job, task_info
from resources.task_env import SHIPPED_ENV, apply_env, driver_env
from resources.task_memory import TaskMemory
from upsert_core.errors import ConfigError, IngestError
from upsert_core.ingest.engine import bucket_groups
from upsert_core.ingest.outcome import BucketResult, FileOutcome
from upsert_core.ingest.shard_api import IngestShard
from upsert_core.ingest.statecache import StateCache
from upsert_core.ingest.tasks import FileTask, cache_key, read_file, run_bucket
from upsert_core.landing import LandingFile
from upsert_core.persist.keys import WRITER_TOKEN_ENV
from upsert_core.persist.location import Blob
from upsert_core.persist.location.urls import blob_url, open_blob
from upsert_core.persist.state.codec_state import encode_state

PROFILE_ENV = "UPSERT_SPARK_PROFILE_DIR"
RESULT_DDL = "result string"

_blobs: dict[tuple[str, tuple[tuple[str, str], ...]], Blob] = {}
_cache: StateCache | None = None


def _worker_cache() -> StateCache:
    """This Python worker's bucket-state cache (workers are reused across jobs)."""
    global _cache
    if _cache is None:
        _cache = StateCache()
    return _cache


def blob_url_of(blob: Blob) -> str:
    """A URL a Spark task can open to reach ``blob`` (local directory or S3)."""
    url = blob_url(blob)
    if url is None:
        raise ConfigError(
            f"the Spark engine needs a blob store its tasks can open by URL (file:// or"
            f" s3://), not {type(blob).__name__}; pass blob_url= or use the in-process engine"
        )
    return url


def _task_blob(url: str, env: dict[str, str]) -> Blob:
    # SUBTLE: Python workers are reused across tasks and sessions' jobs, so the driver's
    # AWS_* shipped with THIS task must win over whatever an earlier task left in the
    # worker's environment (a stale endpoint would point at another S3 server); the
    # blob cache is keyed by the S3 settings. An empty shipped value means "unset":
    # that is how a driver without a writer token clears an earlier driver's.
    apply_env(env)
    cache_key = (url, tuple(sorted((k, v) for k, v in env.items() if k in SHIPPED_ENV)))
    blob = _blobs.get(cache_key)
    if blob is None:
        blob = _blobs[cache_key] = open_blob(url)
    return blob


# --- worker-side helpers ----------------------------------------------------------------


@contextmanager
def _frozen_after() -> Iterator[None]:
    """Run a task without cyclic garbage collection, then move every object alive in
    this worker into the collector's permanent generation (``gc.freeze``).

    SUBTLE: this is what keeps collections cheap in a worker holding big cached states:
    frozen objects are never scanned again, and reference counting still frees them
    when a state drops them. The cost is that a reference cycle that is garbage by the
    end of a task is never collected; the steps create none (an in-process ingest of the
    bench workload with the collector off leaves zero unreachable objects), so nothing
    accumulates. The collector's previous setting is restored.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


def _timeline(label: str, start: float, end: float) -> None:
    directory = os.environ.get(PROFILE_ENV)
    if directory:
        line = {"label": label, "pid": os.getpid(), "start": start, "end": end}
        with open(os.path.join(directory, "timeline.jsonl"), "a") as fh:
            fh.write(json.dumps(line) + "\n")


class _Profiled:
    """With ``UPSERT_SPARK_PROFILE_DIR`` set (in the workers' environment), a step
    writes a timeline line (wall clock start/end, pid, label) into that directory, and
    with ``profile=True`` its cProfile stats; otherwise this does nothing. Full garbage
    collections of the worker are logged to the timeline too (``_log_gc``)."""

    def __init__(self, label: str, *, profile: bool = False) -> None:
        self.dir = os.environ.get(PROFILE_ENV)
        self.label = label
        self.profile = profile
        self.prof: cProfile.Profile | None = None
        self.start = 0.0

    def __enter__(self) -> _Profiled:
        self.start = time.time()
        if self.dir and self.profile:
            if _log_gc not in gc.callbacks:
                gc.callbacks.append(_log_gc)
            self.prof = cProfile.Profile()
            self.prof.enable()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.dir:
            return
        if self.prof is not None:
            self.prof.disable()
            stem = f"{self.label}-{os.getpid()}-{int(self.start * 1e6)}"
            self.prof.dump_stats(os.path.join(self.dir, stem + ".prof"))
        _timeline(self.label, self.start, time.time())


_gc_started = [0.0]


def _log_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _gc_started[0] = time.time()
    elif info.get("generation") == 2 or time.time() - _gc_started[0] > 0.01:
        _timeline(f"gc{info.get('generation')}", _gc_started[0], time.time())


class _Claims:
    """Which slice runs which bucket.

    Without a claims directory (a cluster, Spark Connect): slice ``i`` runs the buckets
    ``b % slices == i``. With one (local mode: every task on this host): a bucket runs
    in the slice that first creates the symlink ``<dir>/<bucket> -> slice-<i>`` (atomic
    on a local filesystem), so each bucket runs in exactly one slice whatever the order
    (a retried attempt of that slice owns it again); see :func:`run_slice` for the
    order in which slices claim.
    """

    def __init__(self, directory: str | None, index: int, slices: int) -> None:
        self.dir = directory
        self.index = index
        self.slices = slices
        self.mine: set[int] = set()

    def claim(self, bucket: int) -> bool:
        if bucket in self.mine:
            return True
        if self.dir is None:
            won = bucket % self.slices == self.index
        else:
            path, me = os.path.join(self.dir, str(bucket)), f"slice-{self.index}"
            try:
                os.symlink(me, path)  # atomic: fails if any slice claimed it first
                won = True
            except FileExistsError:
                won = os.readlink(path) == me
        if won:
            self.mine.add(bucket)
        return won


def _claim_cached(task: FileTask, claims: _Claims, cache: StateCache) -> None:
    """Claim (at most a fair share of) the buckets whose current state this worker holds.

    SUBTLE: done before reading the file, so that every slice has claimed its cached
    buckets before any slice, done reading, starts taking the unclaimed ones; only the
    worker that ran a bucket last holds its state as of ``task.ts`` (``take`` removes
    the entry it uses), so these claims rarely collide.
    """
    if claims.dir is None:
        return
    share = -(-task.buckets // claims.slices)
    for bucket in range(task.buckets):
        if len(claims.mine) >= share:
            break
        if cache.holds(cache_key(task, bucket), task.ts, task.history):
            claims.claim(bucket)


def run_slice(
    task: FileTask,
    url: str,
    env: dict[str, str],
    index: int,
    slices: int,
    claims_dir: str | None = None,
) -> list[str]:
    """Slice ``index`` of ``slices`` of one file's ingest (see the module docstring):
    the result lines for the driver. Never raises.

    With ``claims_dir`` the slice first claims the buckets whose state its worker holds,
    then reads the file, runs its claimed buckets that have rows, and then claims and
    runs the remaining buckets one at a time (its own ``b % slices == index`` first),
    so a fast slice takes over work a slow one has not started."""
    name = task.file.name
    lines: list[str] = []
    claims = _Claims(claims_dir, index, slices)
    memory = TaskMemory()
    try:
        cache = _worker_cache()
        _claim_cached(task, claims, cache)
        blob = _task_blob(url, env)
        read, rows = read_file(task, blob, write_errors=index == 0)
        lines += [f"{LANDING}:{read.landing_bytes}", task_info("read", index, memory)]
        if index == 0:
            lines.append(f"{READ}:{read.to_json()}")
        if read.changed is not None:
            # SUBTLE: any slice may be the one that sees the file change (each reads
            # it itself); the whole file is then left pending, whatever the others read.
            lines.append(f"{CHANGED}:{read.changed}")
            return lines
        if read.file_error is not None:
            return lines
        groups = bucket_groups(task, rows)
        if index == 0:
            lines.append(f"{EXPECT}:{json.dumps(sorted(groups))}")
        ordered = sorted(groups, key=lambda b: (b not in claims.mine, b % slices != index, b))
        for bucket in ordered:
            if not claims.claim(bucket):
                continue
            with _Profiled(f"bucket{bucket}"):
                result = run_bucket(
                    task, bucket, groups[bucket], blob, cache, read.schema_json
                )
            lines += [f"{BUCKET}:{result.to_json()}", task_info("bucket", bucket, memory)]
            if result.failure is not None:
                break
    except Exception as exc:  # noqa: BLE001 - reported as one line on the driver
        lines.append(f"{ERROR}:{name}: {type(exc).__name__}: {exc}")
    return lines


def _arrow_slice(
    task: FileTask, url: str, env: dict[str, str], slices: int, claims_dir: str | None
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of one file: each input row is a slice number (one
    per partition of ``range(slices)``); it yields that slice's result lines."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                with _frozen_after(), _Profiled(f"slice{index}", profile=True):
                    lines = run_slice(task, url, env, int(index), slices, claims_dir)
                yield pa.RecordBatch.from_pydict({"result": pa.array(lines, pa.string())})

    return run


# --- driver ---------------------------------------------------------------------------------


class SparkEngine:
    """Runs each file's steps as one Spark stage (see the module docstring).

    ``slices``: tasks per file (default: ``min(buckets, default parallelism)``).
    """

    def __init__(
        self, spark: SparkSession, *, blob_url: str | None = None, slices: int | None = None
    ) -> None:
        if slices is not None and slices < 1:
            raise ConfigError(f"slices must be at least 1, got {slices}")
        self.spark = spark
        self.blob_url = blob_url
        self.slices = slices
        self.last_split: SplitRun | None = None
        """Which tasks read and drained the last file, when it took the split path."""
        self.last_tasks: SplitRun | None = None
        """Which tasks read and drained the last file, whichever path it took (the
        one-stage path's slices each read the whole file: ``read_tasks`` by slice)."""

    def _slices(self, task: FileTask, master: str) -> int:
        wanted = self.slices or default_parallelism(self.spark, master)
        return max(1, min(task.buckets, wanted))

    def run_file(self, task: FileTask, shard: IngestShard) -> FileOutcome:
        url = self.blob_url or blob_url_of(shard.blob)
        env = driver_env()
        env[WRITER_TOKEN_ENV] = os.environ.get(WRITER_TOKEN_ENV, "")
        state = task.load_shard_state()
        shipped = dataclasses.replace(
            task, shard_state=None, shard_state_bytes=encode_state(state)
        )
        try:
            master = master_of(self.spark)
            slices = self._slices(task, master)
        except Exception as exc:  # noqa: BLE001 - e.g. a Connect server that went away
            raise IngestError(f"{task.file.name}: Spark does not answer: {failure_line(exc)}"
                              ) from exc
        self.last_split = self.last_tasks = None
        splits = split_plan(task, slices)
        if splits is None:
            return self._one_stage(task, shipped, url, env, slices, master)
        results = self._job(task, lambda: run_split_job(self.spark, shipped, url, env, splits,
                                                         _HOOKS))
        self.last_split = self.last_tasks = SplitRun.of(results)
        if not self.last_split.fallback:
            outcome = outcome_of(task, results)
            outcome.read.read_tasks = len(self.last_split.read_tasks)
            outcome.read.drain_tasks = len(
                {t.get("attempt") for t in self.last_split.bucket_tasks.values()})
            return outcome
        # The splits cannot stand for the file (split_steps.Fallback): read it whole. The
        # split job ran no bucket then; whatever a task may have written goes.
        written = [k for r in _split(results, BUCKET) for k in BucketResult.from_json(r).new_blobs]
        for key in written:
            shard.blob.delete(key)
        outcome = self._one_stage(task, shipped, url, env, slices, master)
        outcome.read.landing_bytes += sum(int(n) for n in _split(results, LANDING))
        return outcome

    def group_size(self, files: Sequence[LandingFile], envelope: str) -> int:
        """How many of the run's pending ``files`` run as one job
        (``resources.spark_paths.group_size``)."""
        return group_size(files, envelope)

    def run_group(self, tasks: list[FileTask], shard: IngestShard) -> list[FileOutcome]:
        """Several files as one job (``resources/spark_group.py``): the outcomes of the
        files the driver may commit (``ingest.engine.GroupEngine``). A job that failed as
        a whole gives none (the driver runs the group's files on their own, one by one,
        and a file's own job reports why); what its tasks wrote is left to GC, as after
        a failed job of one file."""
        first = tasks[0]
        url = self.blob_url or blob_url_of(shard.blob)
        env = driver_env()
        env[WRITER_TOKEN_ENV] = os.environ.get(WRITER_TOKEN_ENV, "")
        shipped = [dataclasses.replace(first, shard_state=None,
                                       shard_state_bytes=encode_state(first.load_shard_state())),
                   *tasks[1:]]
        self.last_split = None
        try:
            slices = self._slices(first, master_of(self.spark))
            results = run_group_job(self.spark, shipped, url, env, slices, _HOOKS)
        except Exception:  # noqa: BLE001 - the driver's run of the first file reports it
            return []
        outcomes, unused = group_outcomes(tasks, results)
        for key in unused:
            shard.blob.delete(key)
        for outcome in outcomes:
            outcome.read.read_tasks = outcome.read.drain_tasks = slices
        return outcomes

    def _job(self, task: FileTask, run: Callable[[], list[str]]) -> list[str]:
        try:
            return run()
        except Exception as exc:  # noqa: BLE001 - a failed job is one line for the user
            raise IngestError(f"{task.file.name}: the Spark job failed: {failure_line(exc)}"
                              ) from exc

    def _one_stage(
        self, task: FileTask, shipped: FileTask, url: str, env: dict[str, str], slices: int,
        master: str,
    ) -> FileOutcome:
        # Claims need one filesystem shared by every task: tasks on this host only.
        claims = None
        if slices > 1 and claims_are_shared(self.spark, master):
            claims = tempfile.mkdtemp(prefix="upsert-claims-")
        try:
            results = self._job(task, lambda: [
                r["result"] for r in self.spark.range(slices, numPartitions=slices)
                .mapInArrow(_arrow_slice(shipped, url, env, slices, claims), RESULT_DDL)
                .collect()
            ])
        finally:
            if claims is not None:
                shutil.rmtree(claims, ignore_errors=True)
        self.last_tasks = SplitRun.of(results)
        outcome = outcome_of(task, results)
        outcome.read.read_tasks = outcome.read.drain_tasks = slices
        return outcome


_HOOKS = WorkerHooks(frozen=_frozen_after, blob=_task_blob, cache=_worker_cache)


TRACEBACK = "Traceback (most recent call last):"
WHERE_ONLY = ("An error occurred while calling", "An exception was thrown from the Python worker")
GRPC_CALL = "of RPC that terminated with:"
GRPC_FIELD = re.compile(r'^\s*(status|details)\s*=\s*(?:StatusCode\.)?"?(.*?)"?\s*$')


def failure_line(exc: BaseException) -> str:
    """What a failure says, in one line: its first line, followed by its cause when the
    first line only says where it happened (py4j's "An error occurred while calling
    o58.collectToPython.", pyspark's "An exception was thrown from the Python worker:").
    The cause is the Python traceback's last line (``ValueError: ...``), else the Java
    exception on the next line. A Spark Connect call that failed in gRPC (its text opens
    with ``<_InactiveRpcError of RPC that terminated with:``) says its status and details.
    SUBTLE: the JVM's own account of a failed job is in its log, not on stderr
    (``resources/spark_session.py``), so this line is all a user sees.
    """
    lines = [line.rstrip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    first = lines[0].strip()
    if first.endswith(GRPC_CALL):
        fields = {m[1]: m[2] for m in map(GRPC_FIELD.match, lines[1:]) if m}
        said = ": ".join(v for v in (fields.get("status"), fields.get("details")) if v)
        return f"the Spark Connect call failed: {said or first}"
    if not first.startswith(WHERE_ONLY) or len(lines) == 1:
        return first
    stripped = [line.strip() for line in lines]
    cause = stripped[1].lstrip(":").strip()
    starts = [i for i, line in enumerate(stripped) if line.endswith(TRACEBACK)]
    if starts:
        for line in lines[starts[0] + 1:]:
            if line[:1].isspace():
                if line.strip().startswith("at "):  # the JVM's frames after the traceback
                    break
                continue  # a frame of the traceback
            cause = line.strip()
    return f"{first} {cause}"


def claims_are_shared(spark: SparkSession, master: str) -> bool:
    """Whether every task of ``spark`` runs on this host, sharing its filesystem: a
    classic session on a ``local`` master. Not a Spark Connect session (the server may
    be elsewhere, whatever its master), not a cluster."""
    return not is_connect(spark) and master.startswith("local")


def default_parallelism(spark: SparkSession, master: str) -> int:
    """How many tasks run at once: ``spark.default.parallelism`` when set; a classic
    session's context knows; else the ``N`` of a ``local[N]`` master (``*``: this host's
    CPUs); else 2."""
    text = str(spark.conf.get("spark.default.parallelism", "") or "").strip()
    if text.isdigit() and int(text) > 0:
        return int(text)
    if not is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)
    match = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\s*\d+)?\])?", master)
    if match:
        n = match.group(1) or "1"
        return (os.cpu_count() or 1) if n == "*" else max(1, int(n))
    return 2


_split = lines_of
