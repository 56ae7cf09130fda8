"""The Spark engine produces exactly what the in-process engine produces, on SQLite +
local files and on PostgreSQL + the moto S3 server, and reports bad files cleanly."""

from __future__ import annotations

import random
from pathlib import Path

import boto3
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from resources.spark_ingest import SparkEngine
from tests.ingest.helpers import contents, memory_shard, write_jsonl, write_parquet
from tests.services import AWS_TEST_CREDENTIALS
from upsert_core.errors import IngestError
from upsert_core.ingest import IngestReport, IngestRequest, ingest
from upsert_core.ingest.shard_config import checkpoint_ref_name
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard
from upsert_core.persist.testing import unreferenced_blobs

pytestmark = pytest.mark.spark


def _landing(root: Path, seed: int = 11) -> None:
    rng = random.Random(seed)
    for i in range(4):
        rows: list[object] = []
        for _ in range(30):
            row: dict[str, object] = {"key": rng.randrange(15), "offset": rng.randrange(10)}
            if rng.random() < 0.2:
                row["__deleted"] = True
            else:
                row["v"] = rng.choice(["a", "b", "c"])
            rows.append(row)
        rows.append({"key": None, "offset": 1})
        write_jsonl(root, f"{i:02d}.jsonl", rows)
    (root / "04.jsonl").touch()
    write_parquet(root, "05.parquet", pa.table({"key": [1, 2, 99], "offset": [50, 50, 1],
                                                "v": ["p", "q", "r"]}))


def _counts(report: IngestReport) -> list[tuple[str, int, int, int, int, int]]:
    return [(f.name, f.ts, f.rows_read, f.inserts, f.retractions, f.errors) for f in report.files]


def _checkpoint_keys(shard: Shard) -> list[str]:
    prefix = checkpoint_ref_name(0)[:-1]
    return [v for k, v in shard.state().config.items() if k.startswith(prefix) and v]


def test_spark_engine_equals_in_process_engine_on_sqlite_and_files(
    spark: SparkSession, tmp_path: Path
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    _landing(landing)
    shard = Shard.open(
        open_consensus(f"sqlite:///{tmp_path}/c.db"), open_blob(f"file://{tmp_path}/blob"), "s"
    )
    engine = SparkEngine(spark)
    request = IngestRequest(order_scope="global")
    spark_report = ingest(shard, str(landing), request, engine=engine)
    local = memory_shard("local")
    local_report = ingest(local, str(landing), request)
    assert _counts(spark_report) == _counts(local_report)
    assert contents(shard) == contents(local)
    assert list(shard.errors()) == list(local.errors())

    # Checkpoints lost: Spark tasks rehydrate and the results still agree.
    for key in _checkpoint_keys(shard):
        shard.blob.delete(key)
    write_jsonl(landing, "06.jsonl", [{"key": k, "offset": 100, "v": "late"} for k in range(8)])
    spark_report = ingest(shard, str(landing), IngestRequest(), engine=engine)
    ingest(local, str(landing), IngestRequest())
    # The rebuilt buckets take their tombstones from the shard's tombstone sets: nothing
    # is forgotten, so nothing is warned about.
    assert spark_report.rehydrations and not spark_report.warnings
    assert contents(shard) == contents(local)

    # A bad file: one clean line naming the file; earlier files stay, nothing leaks.
    write_jsonl(landing, "07.jsonl", [{"key": "not an int", "offset": 1}])
    with pytest.raises(IngestError) as info:
        ingest(shard, str(landing), IngestRequest(), engine=engine)
    assert str(info.value).startswith("07.jsonl: ") and "changed type" in str(info.value)
    assert "\n" not in str(info.value) and "Traceback" not in str(info.value)
    assert shard.state().upper == 7
    assert unreferenced_blobs(shard) == set()


@pytest.mark.postgres
@pytest.mark.s3
def test_spark_engine_on_postgres_and_s3(
    spark: SparkSession, fresh_postgres_url: str, s3_bucket: str, s3_env: str, tmp_path: Path
) -> None:
    local_landing = tmp_path / "landing"
    local_landing.mkdir()
    _landing(local_landing, seed=5)
    client = boto3.session.Session().client("s3", endpoint_url=s3_env, **AWS_TEST_CREDENTIALS)
    for path in sorted(local_landing.iterdir()):
        client.put_object(Bucket=s3_bucket, Key=f"landing/{path.name}", Body=path.read_bytes())
    shard = Shard.open(
        open_consensus(fresh_postgres_url), open_blob(f"s3://{s3_bucket}/blob"), "pg"
    )
    landing = f"s3://{s3_bucket}/landing"
    spark_report = ingest(shard, landing, IngestRequest(buckets=2), engine=SparkEngine(spark))
    local = memory_shard("local")
    local_report = ingest(local, str(local_landing), IngestRequest(buckets=2))
    assert _counts(spark_report) == _counts(local_report)
    assert contents(shard) == contents(local)
    assert list(shard.errors()) == list(local.errors())
    assert unreferenced_blobs(shard) == set()


def test_spark_engine_equals_in_process_engine_with_an_order_of_several_columns(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``--order file,pos`` (order keys) through Spark tasks: the same shard as the
    in-process engine, also after the checkpoints are lost (tasks rebuild order keys
    from rows and tombstones from their sets)."""
    landing = tmp_path / "landing"
    landing.mkdir()
    rng = random.Random(5)
    files = ["mysql-bin.000001", "mysql-bin.000002", "mysql-bin.000010"]
    for i in range(3):
        rows: list[object] = []
        for _ in range(40):
            row: dict[str, object] = {"key": rng.randrange(12), "file": rng.choice(files),
                                      "pos": rng.randrange(-2, 5)}
            if rng.random() < 0.2:
                row["__deleted"] = True
            else:
                row["v"] = rng.choice(["a", "b"])
            rows.append(row)
        rows.append({"key": 1, "file": None, "pos": 1, "v": "null file"})
        write_jsonl(landing, f"{i:02d}.jsonl", rows)
    shard = Shard.open(
        open_consensus(f"sqlite:///{tmp_path}/c.db"), open_blob(f"file://{tmp_path}/blob"), "s"
    )
    engine = SparkEngine(spark)
    request = IngestRequest(order_scope="global", order="file,pos")
    spark_report = ingest(shard, str(landing), request, engine=engine)
    local = memory_shard("local")
    local_report = ingest(local, str(landing), request)
    assert _counts(spark_report) == _counts(local_report)
    assert contents(shard) == contents(local)
    assert list(shard.errors()) == list(local.errors()) and len(list(local.errors())) == 3

    for key in _checkpoint_keys(shard):
        shard.blob.delete(key)
    write_jsonl(landing, "03.jsonl", [
        {"key": k, "file": "mysql-bin.000002", "pos": 3, "v": "late?"} for k in range(12)])
    spark_report = ingest(shard, str(landing), IngestRequest(), engine=engine)
    ingest(local, str(landing), IngestRequest())
    assert spark_report.rehydrations and not spark_report.warnings
    assert contents(shard) == contents(local)
