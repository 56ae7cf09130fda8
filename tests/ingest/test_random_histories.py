"""The model-based random driver (``random_histories``) on the in-process engine.

Every history runs on fresh in-memory stores, and a few on SQLite and a local blob
directory (the embedded defaults); the PostgreSQL + S3 variant is marked. The Spark
engine runs the same driver in ``tests/spark/test_random_histories_spark.py``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from upsert_core.landing.chunks import CHUNK_ROWS_ENV, STREAM_BYTES_ENV
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard

from .helpers import memory_shard
from .random_histories import History, histories, run_history


@settings(max_examples=40)
@given(history=histories())
def test_random_histories_match_the_model(history: History) -> None:
    run_history(history, memory_shard)


@settings(max_examples=60)
@given(history=histories(scopes=("global",), lose_one_in=2, buckets=(1, 2)))
def test_rebuilt_global_scope_buckets_remember_tombstones(history: History) -> None:
    # Deletes, late rows of deleted keys and rebuilds of every bucket, often: a rebuild
    # that forgot a tombstone would apply a late row the model skips.
    run_history(history, memory_shard)


@settings(max_examples=25)
@given(history=histories())
def test_streamed_parquet_files_match_the_model(history: History) -> None:
    # Every Parquet file read in chunks of 2 rows and spilled to disk by bucket (the path
    # of files of UPSERT_STREAM_BYTES or more): the same answers as the whole-file read.
    with _env({STREAM_BYTES_ENV: "0", CHUNK_ROWS_ENV: "2", "UPSERT_INGEST_MEMORY_MB": "0"}):
        run_history(history, memory_shard)


@settings(max_examples=8)
@given(history=histories(max_steps=4))
def test_random_histories_on_the_embedded_stores(history: History) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run_history(history, _file_shard(Path(tmp)), check_every_step=False)


@pytest.mark.postgres
@pytest.mark.s3
@pytest.mark.slow
@settings(max_examples=4, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=histories(max_steps=3, buckets=(1, 4)))
def test_random_histories_on_postgres_and_s3(
    history: History, fresh_postgres_url: str, s3_bucket: str, s3_env: str
) -> None:
    # The stores are shared by the examples: each history gets a shard of its own.
    name = f"h-{uuid.uuid4().hex[:12]}"
    run_history(history, lambda: Shard.open(open_consensus(fresh_postgres_url),
                                            open_blob(f"s3://{s3_bucket}/{name}"), name),
                check_every_step=False)


def _file_shard(root: Path) -> Callable[[], Shard]:
    return lambda: Shard.open(open_consensus(f"sqlite:///{root}/c.db"),
                              open_blob(f"file://{root}/blob"), "h")


@contextlib.contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
