"""The result lines Spark tasks of the ingest return to the driver, each
``<tag>:<payload>`` (metadata only, never data rows), shared by the one-stage path
(``resources.spark_ingest``) and the split path (``resources.spark_split``)."""

from __future__ import annotations

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
