"""The Spark engine's split path: one file read once, by several read tasks, its rows
exchanged by bucket through a Spark shuffle, each bucket drained in a task of its own.

One job of two stages, on the DataFrame API only (so classic and Spark Connect sessions
run the same plan):

1. ``spark.range(K).mapInArrow(read)``: read task ``i`` runs
   :func:`~upsert_core.ingest.split_steps.read_split_step` for split ``i`` of the file
   (``landing.splits``: Parquet row groups, JSON Lines byte ranges) and emits ``N + 1``
   rows ``(bucket, split, meta, payload)``: for every bucket ``b`` of ``N`` the split's
   rows of ``b`` as an Arrow IPC stream (empty when it has none), and for bucket ``-1``
   its error rows. Every row carries the split's meta (line count, schema, counts); the
   row of bucket ``-1`` also the digests of the file's blocks the split read, of which
   ``gather_read`` makes the file's content digest for the ledger (no second read).
2. ``.repartition(N + 1, "slot").groupBy("slot", "bucket").applyInArrow(drain)``: the
   group of bucket ``-1`` runs :func:`~upsert_core.ingest.split_steps.gather_read` (the file's
   read: counts, error rows renumbered and written once, the buckets that must run); the
   group of bucket ``b`` runs
   :func:`~upsert_core.ingest.split_steps.bucket_rows` then the one bucket step of every
   engine, :func:`~upsert_core.ingest.tasks.run_bucket`. ``repartition`` with ``N + 1``
   partitions makes the exchange explicit (adaptive execution does not coalesce it), and
   its key is a *slot* per bucket (:func:`slot_keys`) chosen so that Spark's hash puts
   bucket ``b`` in partition ``b + 1``: every bucket drains in a task of its own
   (hashing the bucket numbers 0..7 into 9 partitions put 8 buckets in 4 tasks). The
   grouping by ``(slot, bucket)`` needs no second exchange.

Every group sees every split's meta (one row per split), so the row numbers, the schema
check and the completeness check need nothing but the shuffle. The result lines are
those of the one-stage path (``resources.spark_ingest``), so the driver builds the
outcome the same way, plus ``fallback:<reason>`` when the splits cannot stand for the
file (``split_steps.Fallback``): the driver then runs the file on the one-stage path.
``task:<json>`` lines say which Spark task (attempt id, stage, partition) read each split
and drained each bucket, and its Python worker's memory (``resources.task_memory``), for
tests and the run's metrics.

Invariants: as ``resources.spark_ingest``'s (tasks get plain data and open their own
Blob, catch every error into a result line, ship the driver's ``AWS_*`` and writer
token); every split reads the version of the file the driver listed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql import SparkSession

from resources.spark_lines import (
    BUCKET,
    CHANGED,
    ERROR,
    EXPECT,
    FALLBACK,
    LANDING,
    READ,
    TASK,
    lines_of,
)
from resources.task_env import apply_env
from resources.task_memory import TaskMemory
from upsert_core.ingest.split_steps import (
    Fallback,
    SplitMeta,
    bucket_rows,
    gather_read,
    read_split_step,
)
from upsert_core.ingest.statecache import StateCache
from upsert_core.ingest.tasks import FileTask, run_bucket
from upsert_core.landing.splits import Split
from upsert_core.landing.validate import ERRORS_ARROW_SCHEMA
from upsert_core.persist.location import Blob

READ_DDL = "slot int, bucket int, split int, meta string, payload binary"
META_BUCKET = -1
_MASK = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark's ``hash`` of an int column (``Murmur3Hash``, ``Murmur3_x86_32.hashInt``,
    seed 42): what ``repartition(n, column)`` places a row by, as ``pmod(hash, n)``."""
    k = (value & _MASK) * 0xCC9E2D51 & _MASK
    k = _rotl(k, 15) * 0x1B873593 & _MASK
    h = _rotl(seed ^ k, 13)
    h = (h * 5 + 0xE6546B64) & _MASK
    h ^= 4
    h ^= h >> 16
    h = h * 0x85EBCA6B & _MASK
    h ^= h >> 13
    h = h * 0xC2B2AE35 & _MASK
    h ^= h >> 16
    return h - (1 << 32) if h & 0x80000000 else h


def slot_keys(buckets: int) -> dict[int, int]:
    """For each bucket ``b`` (and ``-1``, the file's read) an int whose Spark hash puts
    it in partition ``b + 1`` of ``buckets + 1``: shuffled by these, every bucket has a
    task of its own (hashing the bucket numbers themselves lets some share one)."""
    partitions = buckets + 1
    found: dict[int, int] = {}
    key = 0
    while len(found) < partitions:
        found.setdefault(spark_hash_int(key) % partitions, key)
        key += 1
    return {part - 1: k for part, k in found.items()}


@dataclass(frozen=True)
class WorkerHooks:
    """What a task of this path takes from the one-stage path's worker side
    (``resources.spark_ingest``): run a step with the collector off and the heap frozen
    after it, open the task's Blob, and this worker's bucket-state cache."""

    frozen: Callable[[], AbstractContextManager[None]]
    blob: Callable[[str, dict[str, str]], Blob]
    cache: Callable[[], StateCache]


def to_ipc(table: pa.Table) -> bytes:
    """``table`` as an Arrow IPC stream (b"" for no rows)."""
    if table.num_rows == 0:
        return b""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def from_ipc(payload: bytes | None, empty: pa.Schema) -> pa.Table:
    """The table of :func:`to_ipc` (``empty``'s empty table for b"")."""
    if not payload:
        return empty.empty_table()
    return pa.ipc.open_stream(pa.py_buffer(payload)).read_all()


def task_info(kind: str, what: int, memory: TaskMemory | None = None) -> str:
    """A ``task:`` line: which Spark task (attempt id, stage, partition) and Python
    worker (pid) did ``kind`` (``read``: split or slice ``what``; ``bucket``: drained
    bucket ``what``), and with ``memory`` the worker's resident set at the task's start
    and its peak since (``resources.task_memory``)."""
    from pyspark import TaskContext  # heavy: only inside a Spark task

    ctx = TaskContext.get()
    info: dict[str, object] = {"kind": kind, "of": what, "pid": os.getpid()}
    if ctx is not None:
        info.update(attempt=ctx.taskAttemptId(), stage=ctx.stageId(),
                    partition=ctx.partitionId())
    if memory is not None:
        info.update(memory.figures())
    return f"{TASK}:{json.dumps(info)}"


def read_stage(
    task: FileTask, env: dict[str, str], splits: list[Split], hooks: WorkerHooks
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of stage 1: each input row is a split number."""

    slots = slot_keys(task.buckets)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                split = splits[int(index)]
                memory = TaskMemory()
                with hooks.frozen():
                    apply_env(env)
                    try:
                        meta, errors, groups = read_split_step(task, split)
                    except Exception as exc:  # noqa: BLE001 - the whole-file read reports it
                        meta = SplitMeta(split.index, split.count,
                                         file_error=f"{type(exc).__name__}: {exc}")
                        errors, groups = ERRORS_ARROW_SCHEMA.empty_table(), {}
                meta.where = task_info("read", split.index, memory)
                # Only the file's read (bucket -1) combines the block digests.
                text = meta.without_blocks().to_json()
                yield pa.RecordBatch.from_pydict(
                    {"slot": [slots[META_BUCKET]], "bucket": [META_BUCKET],
                     "split": [split.index], "meta": [meta.to_json()],
                     "payload": [to_ipc(errors)]},
                    schema=_READ_SCHEMA,
                )
                for bucket in range(task.buckets):
                    rows = groups.get(bucket)
                    yield pa.RecordBatch.from_pydict(
                        {"slot": [slots[bucket]], "bucket": [bucket],
                         "split": [split.index], "meta": [text],
                         "payload": [b"" if rows is None else to_ipc(rows)]},
                        schema=_READ_SCHEMA,
                    )

    return run


_READ_SCHEMA = pa.schema(
    [("slot", pa.int32()), ("bucket", pa.int32()), ("split", pa.int32()), ("meta", pa.string()),
     ("payload", pa.binary())]
)


def drain_stage(
    task: FileTask, url: str, env: dict[str, str], hooks: WorkerHooks
) -> Callable[[pa.Table], pa.Table]:
    """The ``applyInArrow`` function of stage 2: one group is one bucket (or the file's
    read, bucket -1); it returns that group's result lines."""

    def run(group: pa.Table) -> pa.Table:
        bucket = int(group.column("bucket")[0].as_py())
        memory = TaskMemory()
        lines: list[str] = []
        try:
            with hooks.frozen():
                blob = hooks.blob(url, env)
                metas = [SplitMeta.from_json(m) for m in group.column("meta").to_pylist()]
                payloads = group.column("payload").to_pylist()
                if bucket == META_BUCKET:
                    errors = [from_ipc(p, ERRORS_ARROW_SCHEMA) for p in payloads]
                    got = gather_read(task, metas, errors, blob)
                    lines += [m.where for m in metas if m.where]
                    if isinstance(got, Fallback):
                        lines.append(f"{FALLBACK}:{got.reason}")
                        lines.append(f"{LANDING}:{sum(m.landing_bytes for m in metas)}")
                    else:
                        read, expected = got
                        lines.append(f"{READ}:{read.to_json()}")
                        if read.changed is not None:
                            lines.append(f"{CHANGED}:{read.changed}")
                        lines.append(f"{EXPECT}:{json.dumps(expected)}")
                else:
                    pieces = [from_ipc(p, task.rows_schema) for p in payloads]
                    rows = bucket_rows(task, metas, pieces)
                    if isinstance(rows, tuple) and (
                        rows[0].num_rows or bucket in task.forced_buckets()
                    ):
                        result = run_bucket(task, bucket, rows[0], blob, hooks.cache(),
                                            rows[1])
                        lines += [f"{BUCKET}:{result.to_json()}",
                                  task_info("bucket", bucket, memory)]
        except Exception as exc:  # noqa: BLE001 - reported as one line on the driver
            lines.append(f"{ERROR}:{task.file.name}: {type(exc).__name__}: {exc}")
        return pa.table({"result": pa.array(lines, pa.string())})

    return run


@dataclass
class SplitRun:
    """Which Spark tasks ran the split path of the last file (from ``task:`` lines)."""

    read_tasks: dict[int, dict[str, int]] = field(default_factory=dict)
    bucket_tasks: dict[int, dict[str, int]] = field(default_factory=dict)
    fallback: list[str] = field(default_factory=list)
    """Why the file was read whole after all (``split_steps.Fallback``), if it was."""

    @classmethod
    def of(cls, results: list[str]) -> SplitRun:
        run = cls(fallback=lines_of(results, FALLBACK))
        for line in results:
            if line.startswith(f"{TASK}:"):
                info = json.loads(line[len(TASK) + 1:])
                target = run.read_tasks if info["kind"] == "read" else run.bucket_tasks
                target[int(info["of"])] = info
        return run


def run_split_job(
    spark: SparkSession, task: FileTask, url: str, env: dict[str, str], splits: list[Split],
    hooks: WorkerHooks,
) -> list[str]:
    """Run the two stages for one file (``task`` shipped: shard state as bytes) and
    return every result line."""
    frame = (
        spark.range(len(splits), numPartitions=len(splits))
        .mapInArrow(read_stage(task, env, splits, hooks), READ_DDL)
        .repartition(task.buckets + 1, "slot")
        .groupBy("slot", "bucket")
        .applyInArrow(drain_stage(task, url, env, hooks), "result string")
    )
    return [row["result"] for row in frame.collect()]
