"""The Spark engine's group path: several pending files of a run as ONE Spark job
(``ingest.group``; which files: ``resources.spark_paths.group_size``).

One stage of ``S`` tasks (the slices; ``S = min(buckets, default parallelism)``) and no
shuffle, as the one-stage path (``resources.spark_ingest``) runs one file:
``mapInArrow`` over ``spark.range(S, numPartitions=S)``. Slice ``i`` goes through the
group's files in name order and, for each, reads and validates it itself (against the
group's first schema), stops where :class:`~upsert_core.ingest.group.SchemaChain` says
the group cannot stand for the file, and runs the file's buckets ``b % S == i`` at the
file's ``ts``: each bucket's steps run one after the other in this task, the state
carried in memory from one to the next (``tasks.Carry``) and each step's task carrying
the entries the steps before it produced (``group.GroupChain``). Only slice 0 writes a
file's error part and reports its read. Every result line is the one-stage path's,
prefixed with its file's index (``<k>|<tag>:<payload>``); :func:`group_outcomes` turns
them into one outcome per file the driver may commit.

Why a fixed bucket assignment and no claims (which the one-stage path uses on a local
master so a fast slice takes over a slow one's buckets): a bucket's steps must run in
one task, and a slice that claimed buckets while another was still reading the first
file would take them for the whole group.

Invariants: those of ``resources.spark_ingest`` (tasks get plain data and open their own
Blob, catch every error into a result line, ship the driver's ``AWS_*`` and writer
token; every read is of the version the driver listed); and the slices agree on where
the group stops, as each reads the same bytes with the same schema (a file that changed
under one slice stops the group there for the driver, whatever the others did).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pyarrow as pa
from pyspark.sql import SparkSession

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
from resources.spark_split import WorkerHooks, task_info
from resources.task_memory import TaskMemory
from upsert_core.ingest.engine import bucket_groups
from upsert_core.ingest.group import GroupChain, SchemaChain, Verdict
from upsert_core.ingest.outcome import BucketResult, FileOutcome, FileRead
from upsert_core.ingest.tasks import Carry, FileTask, read_file, run_bucket

SEP = "|"
"""Between a line's file index and the line."""


def run_group_slice(
    tasks: list[FileTask], url: str, env: dict[str, str], index: int, slices: int,
    hooks: WorkerHooks,
) -> list[str]:
    """Slice ``index`` of ``slices`` of a group (see the module docstring): its result
    lines. Never raises."""
    lines: list[str] = []
    chain = GroupChain(tasks)
    schemas = SchemaChain.of(tasks[0])
    carries: dict[int, Carry] = {}
    k = 0
    try:
        blob, cache = hooks.blob(url, env), hooks.cache()
        for k in range(len(tasks)):
            task, tag = chain.task(k), f"{k}{SEP}"
            memory = TaskMemory()  # this file's share of the task
            read, rows = read_file(task, blob, write_errors=index == 0)
            lines += [f"{tag}{LANDING}:{read.landing_bytes}",
                      f"{tag}{task_info('read', index, memory)}"]
            if index == 0:
                lines.append(f"{tag}{READ}:{read.to_json()}")
            if read.changed is not None:
                lines.append(f"{tag}{CHANGED}:{read.changed}")
                break
            if schemas.admit(read) is not Verdict.APPLY:
                break
            groups = bucket_groups(task, rows)
            if index == 0:
                lines.append(f"{tag}{EXPECT}:{json.dumps(sorted(groups))}")
            results: list[BucketResult] = []
            for bucket in sorted(b for b in groups if b % slices == index):
                carry = carries.setdefault(bucket, Carry(tasks[0]))
                result = run_bucket(task, bucket, groups[bucket], blob, cache,
                                    schemas.current_json, carry)
                lines += [f"{tag}{BUCKET}:{result.to_json()}",
                          f"{tag}{task_info('bucket', bucket, memory)}"]
                if result.failure is not None:
                    return lines  # the bucket's state is unknown from here on
                results.append(result)
            chain.advance(results)
    except Exception as exc:  # noqa: BLE001 - reported as one line on the driver
        lines.append(f"{k}{SEP}{ERROR}:{tasks[k].file.name}: {type(exc).__name__}: {exc}")
    return lines


def _arrow_group(
    tasks: list[FileTask], url: str, env: dict[str, str], slices: int, hooks: WorkerHooks
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: each input row is a slice number."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                with hooks.frozen():
                    lines = run_group_slice(tasks, url, env, int(index), slices, hooks)
                yield pa.RecordBatch.from_pydict({"result": pa.array(lines, pa.string())})

    return run


def run_group_job(
    spark: SparkSession, tasks: list[FileTask], url: str, env: dict[str, str], slices: int,
    hooks: WorkerHooks,
) -> list[str]:
    """The group's one job (``tasks`` shipped: the first one's shard state as bytes):
    every result line."""
    frame = spark.range(slices, numPartitions=slices).mapInArrow(
        _arrow_group(tasks, url, env, slices, hooks), "result string")
    return [row["result"] for row in frame.collect()]


def group_outcomes(
    tasks: list[FileTask], results: list[str]
) -> tuple[list[FileOutcome], list[str]]:
    """The outcomes the driver may commit (the ``GroupEngine.run_group`` prefix: every
    file the group stands for up to the first it stops at, which is included when it
    ends the run or needs its own run: an error, a change or a failed bucket) and the
    blobs the slices wrote for every other file, which the caller deletes."""
    per_file: dict[int, list[str]] = {}
    for line in results:
        head, _, rest = line.partition(SEP)
        per_file.setdefault(int(head), []).append(rest)
    schemas = SchemaChain.of(tasks[0])
    outcomes: list[FileOutcome] = []
    for k, task in enumerate(tasks):
        lines = per_file.get(k, [])
        if not any(lines_of(lines, tag) for tag in (READ, ERROR, CHANGED)):
            break  # no slice got to it
        outcome = outcome_of(task, lines)
        verdict = schemas.admit(outcome.read)
        if verdict is Verdict.AGAIN:
            break
        if verdict is Verdict.APPLY:
            outcome.read.schema_json = schemas.current_json  # what it is applied with
        outcomes.append(outcome)
        if verdict is not Verdict.APPLY or outcome.failure is not None:
            break
    kept = {key for outcome in outcomes for key in outcome.new_blobs}
    written = [
        key
        for lines in per_file.values()
        for key in [*(k for r in lines_of(lines, READ) for k in FileRead.from_json(r).new_blobs),
                    *(k for r in lines_of(lines, BUCKET)
                      for k in BucketResult.from_json(r).new_blobs)]
    ]
    return outcomes, [key for key in written if key not in kept]
