"""The ingest pipeline: landing files -> validated rows -> bucketed upsert drains ->
one compare-and-append per file.

- :mod:`~upsert_core.ingest.options`: ``IngestRequest`` and the options a shard is
  fixed to (``resolve_options``).
- :mod:`~upsert_core.ingest.shard_config`: ``ShardIngestConfig``, the shard's config
  entries the ingest keeps (options, checkpoint references, row count, commit history).
- :mod:`~upsert_core.ingest.buckets`: key -> bucket, rows split by bucket.
- :mod:`~upsert_core.ingest.checkpoint` / :mod:`~upsert_core.ingest.rehydrate`: where a
  bucket's upsert state comes from.
- :mod:`~upsert_core.ingest.tasks`: the per-file and per-bucket steps every engine runs.
- :mod:`~upsert_core.ingest.shard_api`: ``IngestShard``, what the ingest needs of a shard.
- :mod:`~upsert_core.ingest.engine`: the ``Engine`` protocol and the in-process engine.
- :mod:`~upsert_core.ingest.pipeline`: the driver, :func:`ingest`.
- :mod:`~upsert_core.ingest.report`: ``IngestReport``, ``FileReport``, ``ProgressEvent``.
"""

from upsert_core.ingest.engine import Engine, InProcessEngine
from upsert_core.ingest.options import IngestRequest, resolve_options
from upsert_core.ingest.outcome import BucketResult, FileOutcome, FileRead
from upsert_core.ingest.pipeline import (
    checkpoints_current,
    ingest,
    live_rows,
    plan_file,
)
from upsert_core.ingest.report import FileReport, IngestReport, ProgressEvent
from upsert_core.ingest.shard_api import IngestShard
from upsert_core.ingest.shard_config import ShardIngestConfig, ShardOptions
from upsert_core.ingest.tasks import ROWS_SCHEMA, FileTask, read_file, run_bucket

__all__ = [
    "ROWS_SCHEMA",
    "BucketResult",
    "Engine",
    "FileOutcome",
    "FileRead",
    "FileReport",
    "FileTask",
    "InProcessEngine",
    "IngestReport",
    "IngestRequest",
    "IngestShard",
    "ProgressEvent",
    "ShardIngestConfig",
    "ShardOptions",
    "checkpoints_current",
    "ingest",
    "live_rows",
    "plan_file",
    "read_file",
    "resolve_options",
    "run_bucket",
]
