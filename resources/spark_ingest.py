"""The Spark engine: the per-file and per-bucket ingest steps as Spark tasks.

For one file (see ``upsert_core.ingest.tasks``), one Spark job:

1. a one-row DataFrame -> ``mapInArrow``: ONE read task reads the file itself (local or
   ``s3://`` through the landing module; Spark has no s3a here), validates it, writes
   its error part to Blob and emits the good rows tagged with their bucket, a "touch"
   row for every forced bucket, and one metadata row (bucket -1) with the
   :class:`FileRead` as JSON;
2. ``groupBy("bucket").applyInArrow``: one task per bucket loads that bucket's state
   (checkpoint or rehydration), drains, writes parts and the checkpoint straight to
   Blob and returns ONE row: its :class:`BucketResult` as JSON (the metadata group just
   passes its row through);
3. the driver collects those few JSON rows (metadata only, never data rows) into a
   :class:`FileOutcome`; the ingest driver commits it like any engine's.

Invariants:

- Tasks get strings and bytes only (the file task with the shard state encoded, the
  blob URL); each opens its own Blob with ``urls.open_blob`` (cached per worker).
- Every error inside a task is caught and returned as metadata, so a bad file ends in
  a one-line :class:`IngestError` on the driver, never a Java stack trace; a failed
  job (a dead worker) becomes one too.
- Each Python worker keeps a :class:`StateCache` of the bucket states its tasks
  produced; a task that lands on a worker holding its bucket's state (as of a
  committed upper) skips the checkpoint load. Which worker runs which bucket is up to
  Spark, so a miss is normal and only costs the load.
- Rows reach the bucket step in no particular order; that is fine because the drain
  orders by (order value, row number), never by arrival.
- ``AWS_*`` variables of the driver's environment are applied in the workers when
  they are missing there (local mode starts its workers before tests set them); on a
  cluster, configure the executors' environment instead.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from upsert_core.errors import ConfigError, IngestError
from upsert_core.ingest.engine import ShardHandle
from upsert_core.ingest.outcome import BucketResult, FileOutcome, FileRead
from upsert_core.ingest.statecache import StateCache
from upsert_core.ingest.tasks import ROWS_SCHEMA, FileTask, read_file, run_bucket
from upsert_core.persist.blob_local import LocalBlob
from upsert_core.persist.blob_s3 import S3Blob
from upsert_core.persist.codec_state import encode_state
from upsert_core.persist.location import Blob
from upsert_core.persist.urls import open_blob

META_BUCKET = -1
SHIPPED_ENV = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
)

EXCHANGE_SCHEMA = pa.schema([*ROWS_SCHEMA, pa.field("meta", pa.string())])
EXCHANGE_DDL = (
    "bucket int, key binary, row binary, deleted boolean, order bigint, position bigint,"
    " meta string"
)
RESULT_DDL = "result string"

_blobs: dict[str, Blob] = {}
_cache: StateCache | None = None


def _worker_cache() -> StateCache:
    """This Python worker's bucket-state cache (workers are reused across jobs)."""
    global _cache
    if _cache is None:
        _cache = StateCache()
    return _cache


def blob_url_of(blob: Blob) -> str:
    """A URL a Spark task can open to reach ``blob`` (local directory or S3)."""
    if isinstance(blob, LocalBlob):
        return f"file://{blob.root}"
    if isinstance(blob, S3Blob):
        prefix = blob.prefix.strip("/")
        endpoint = blob._client.meta.endpoint_url  # noqa: SLF001 - the one way to learn it
        return f"s3://{blob.bucket}/{prefix}?endpoint_url={endpoint}"
    raise ConfigError(
        f"the Spark engine needs a blob store its tasks can open by URL (file:// or s3://),"
        f" not {type(blob).__name__}; pass blob_url= or use the in-process engine"
    )


def _task_blob(url: str, env: dict[str, str]) -> Blob:
    for name, value in env.items():
        os.environ.setdefault(name, value)
    blob = _blobs.get(url)
    if blob is None:
        blob = _blobs[url] = open_blob(url)
    return blob


def _meta_batch(text: str) -> pa.RecordBatch:
    columns: list[pa.Array] = [pa.array([META_BUCKET], pa.int32())]
    columns += [pa.nulls(1, f.type) for f in list(ROWS_SCHEMA)[1:]]
    columns.append(pa.array([text], pa.string()))
    return pa.RecordBatch.from_arrays(columns, schema=EXCHANGE_SCHEMA)


def _read_step(task: FileTask, url: str, env: dict[str, str]) -> Any:
    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:  # one input row: the file
            try:
                read_meta, rows = read_file(task, _task_blob(url, env))
            except Exception as exc:  # noqa: BLE001 - reported as one line on the driver
                read_meta, rows = FileRead(file_error=f"{task.file.name}: {exc}"), None
            yield _meta_batch(read_meta.to_json())
            if rows is None or read_meta.file_error is not None:
                continue
            for batch in rows.to_batches(max_chunksize=64 * 1024):
                meta = pa.nulls(batch.num_rows, pa.string())
                yield pa.RecordBatch.from_arrays([*batch.columns, meta], schema=EXCHANGE_SCHEMA)
            forced = task.forced_buckets()
            if forced:
                n = len(forced)
                touch = [pa.array(forced, pa.int32())]
                touch += [pa.nulls(n, f.type) for f in list(ROWS_SCHEMA)[1:]]
                touch.append(pa.nulls(n, pa.string()))
                yield pa.RecordBatch.from_arrays(touch, schema=EXCHANGE_SCHEMA)

    return read


def _bucket_step(task: FileTask, url: str, env: dict[str, str]) -> Any:
    def step(table: pa.Table) -> pa.Table:
        bucket = int(table.column("bucket")[0].as_py())
        if bucket == META_BUCKET:
            texts = [f"read:{m}" for m in table.column("meta").to_pylist()]
            return pa.table({"result": pa.array(texts, pa.string())})
        try:
            rows = table.filter(pc.is_valid(table.column("key"))).select(ROWS_SCHEMA.names)
            result = run_bucket(
                task, bucket, rows.cast(ROWS_SCHEMA), _task_blob(url, env), _worker_cache()
            )
        except Exception as exc:  # noqa: BLE001 - reported as one line on the driver
            result = BucketResult(bucket=bucket, failure=f"bucket {bucket}: {exc}")
        return pa.table({"result": pa.array([f"bucket:{result.to_json()}"], pa.string())})

    return step


class SparkEngine:
    """Runs each file's steps as one Spark job (see the module docstring)."""

    def __init__(self, spark: SparkSession, *, blob_url: str | None = None) -> None:
        self.spark = spark
        self.blob_url = blob_url

    def run_file(self, task: FileTask, shard: ShardHandle) -> FileOutcome:
        url = self.blob_url or blob_url_of(shard.blob)
        env = {name: os.environ[name] for name in SHIPPED_ENV if name in os.environ}
        state = task.load_shard_state()
        shipped = dataclasses.replace(
            task, shard_state=None, shard_state_bytes=encode_state(state)
        )
        try:
            rows = (
                self.spark.range(1, numPartitions=1)
                .mapInArrow(_read_step(shipped, url, env), EXCHANGE_DDL)
                .groupBy("bucket")
                .applyInArrow(_bucket_step(shipped, url, env), RESULT_DDL)
                .collect()
            )
        except Exception as exc:  # noqa: BLE001 - a failed job is one line for the user
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise IngestError(f"{task.file.name}: the Spark job failed: {first}") from exc
        return _outcome(task, [r["result"] for r in rows])


def _outcome(task: FileTask, results: list[str]) -> FileOutcome:
    reads = [FileRead.from_json(r.removeprefix("read:")) for r in results if r.startswith("read:")]
    if len(reads) != 1:
        raise IngestError(f"{task.file.name}: the Spark job returned {len(reads)} read results")
    buckets = [
        BucketResult.from_json(r.removeprefix("bucket:"))
        for r in results
        if r.startswith("bucket:")
    ]
    return FileOutcome(read=reads[0], buckets=sorted(buckets, key=lambda b: b.bucket))
