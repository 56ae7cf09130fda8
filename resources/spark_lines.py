"""The result lines Spark tasks of the ingest return to the driver, each
``<tag>:<payload>`` (metadata only, never data rows), shared by the one-stage path
(``resources.spark_ingest``), the split path (``resources.spark_split``) and the group
path (``resources.spark_group``, which prefixes each line with its file's index), and
the one reading of a file's lines into its outcome (:func:`outcome_of`)."""

from __future__ import annotations

import json

from upsert_core.errors import IngestError
from upsert_core.ingest.outcome import BucketResult, FileOutcome, FileRead
from upsert_core.ingest.tasks import FileTask

READ = "read"  # a FileRead as JSON (once per file)
EXPECT = "expect"  # the buckets that must run, as a JSON list (once per file)
BUCKET = "bucket"  # a BucketResult as JSON (once per bucket run)
ERROR = "error"  # an unexpected failure inside a task: "<file>: <problem>"
CHANGED = "changed"  # the file changed while being read: "<file>: <how>"
LANDING = "landing"  # bytes of the landing file one task read (one-stage path)
FALLBACK = "fallback"  # the split path cannot stand for the file: why
TASK = "task"  # which Spark task read a split or drained a bucket (JSON)


def lines_of(results: list[str], tag: str) -> list[str]:
    """The payloads of the result lines tagged ``tag``, in order."""
    prefix = f"{tag}:"
    return [r[len(prefix):] for r in results if r.startswith(prefix)]


def task_memory(results: list[str]) -> tuple[int, int, int]:
    """From the ``task:`` lines: the largest peak resident set of a Python worker over
    the tasks that read or drained the file, and the most one grew (its peak minus its
    resident set at the task's start) by the end of a read, and by the end of a bucket's
    drain (0s without any figures). Growth comes only from exact figures with a known
    start (``resources.task_memory``): a peak that could not be reset for the task is
    the worker's lifetime peak, an upper bound that still counts as a peak, but minus
    the task's start it is no growth of the task."""
    peak, grew = 0, {"read": 0, "bucket": 0}
    for line in lines_of(results, TASK):
        info = json.loads(line)
        if "peak_rss" in info and info.get("kind") in grew:
            peak = max(peak, int(info["peak_rss"]))
            start = int(info["rss_start"])
            if info.get("exact") is True and start > 0:
                grew[info["kind"]] = max(grew[info["kind"]], int(info["peak_rss"]) - start)
    return peak, grew["read"], grew["bucket"]


def outcome_of(task: FileTask, results: list[str]) -> FileOutcome:
    """The :class:`FileOutcome` of one file from its slices' result lines.

    An ``error`` line (an unexpected failure inside a task) becomes the file's error, so
    the driver deletes everything the slices wrote and reports one line. Otherwise every
    bucket listed by slice 0 must have exactly one result."""
    name = task.file.name
    reads = [FileRead.from_json(r) for r in lines_of(results, READ)]
    landing = lines_of(results, LANDING)
    if landing and reads:  # every slice read the file: the read costs them all
        reads[0].landing_bytes = sum(int(n) for n in landing)
    buckets = sorted(
        (BucketResult.from_json(r) for r in lines_of(results, BUCKET)), key=lambda b: b.bucket
    )
    changed = lines_of(results, CHANGED)
    if changed:
        read = reads[0] if reads else FileRead()
        read.changed = read.changed or changed[0]
        return FileOutcome(read=read, buckets=buckets)
    errors = lines_of(results, ERROR)
    if errors:
        read = reads[0] if reads else FileRead()
        read.file_error = read.file_error or errors[0]
        return FileOutcome(read=read, buckets=buckets)
    if len(reads) != 1:
        raise IngestError(f"{name}: the Spark job returned {len(reads)} read results")
    outcome = FileOutcome(read=reads[0], buckets=buckets)
    read = outcome.read
    read.task_peak_memory, read.read_memory_added, read.drain_memory_added = task_memory(results)
    if outcome.read.file_error is not None or outcome.failure is not None:
        return outcome
    expected = [int(b) for e in lines_of(results, EXPECT) for b in json.loads(e)]
    ran = [b.bucket for b in buckets]
    if ran != sorted(expected):
        outcome.read.file_error = (
            f"{name}: the Spark job ran buckets {ran}, expected {sorted(expected)}"
        )
    return outcome
