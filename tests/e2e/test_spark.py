"""``upsertctl`` with the Spark engine (the default): few cases, each JVM costs ~10-20 s.

- ``upsertctl demo`` (what ``scripts/run-demo.sh`` runs) on the embedded defaults gives
  exactly the shard that the in-process engine gives on the same sample, and a second
  run ingests nothing.
- On PostgreSQL + S3 with an S3 landing, the Spark engine stops at a bad file with one
  error line (no Java trace), keeps the files before it, and a re-run after the fix
  completes; the result equals the in-process engine's on the same landing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.e2e.helpers import Cli, bag, jsonl_bytes, parquet_bytes


def _contents(cli: Cli, shard: str) -> tuple[Any, ...]:
    info = cli.inspect(shard)
    return (
        bag(cli.snapshot(shard)),
        bag(cli.changes(shard)),
        cli.errors(shard),
        info["upper"],
        info["ingested_files"],
    )


@pytest.mark.spark
def test_demo_on_spark_equals_the_local_engine_and_is_idempotent(tmp_path: Path) -> None:
    spark_cli = Cli(tmp_path / "spark-home", engine="spark")
    local_cli = Cli(tmp_path / "local-home")
    first = spark_cli.run("demo", "--rows", "300")
    assert "ingested 4 file(s) with the spark engine" in first.out
    assert "upsertctl" in first.out and "snapshot --shard demo" in first.out
    assert "check --shard demo" in first.out
    again = spark_cli.run("demo", "--rows", "300")
    assert "nothing new to ingest" in again.out and "upper 4 -> 4" in again.out
    local_cli.run("demo", "--rows", "300", "--engine", "local")
    spark_contents = _contents(spark_cli, "demo")
    assert spark_contents == _contents(local_cli, "demo")
    assert len(spark_contents[2]) == 1  # the one bad row
    assert spark_cli.check("demo").json()["ok"] is True


@pytest.mark.spark
@pytest.mark.postgres
@pytest.mark.s3
def test_spark_on_postgres_and_s3(
    tmp_path: Path, fresh_postgres_url: str, s3_bucket: str, s3_env: str, s3_client: Any
) -> None:
    cli = Cli(
        tmp_path / "home",
        env={"UPSERT_CONSENSUS_URL": fresh_postgres_url,
             "UPSERT_BLOB_URL": f"s3://{s3_bucket}/shards"},
        engine="spark",
    )
    landing = f"s3://{s3_bucket}/landing"

    def put(name: str, data: bytes) -> None:
        s3_client.put_object(Bucket=s3_bucket, Key=f"landing/{name}", Body=data)

    put("1.jsonl", jsonl_bytes([{"key": k, "offset": k, "v": f"v{k}"} for k in range(50)]
                               + [{"key": None, "offset": 1}, '{"broken": ']))
    put("2.parquet", parquet_bytes(pa.table({
        "key": list(range(0, 50, 2)), "offset": [100] * 25,
        "v": [None] * 25, "__deleted": [k % 4 == 0 for k in range(0, 50, 2)],
    })))
    put("3.jsonl", jsonl_bytes([{"key": 1, "v": "no order column"}]))
    r = cli.ingest(landing, "--order-scope", "global", rc=1)
    assert "3.jsonl" in r.error_line() and "offset" in r.error_line()
    assert "Traceback" not in r.err and "py4j" not in r.error_line().lower()
    assert cli.inspect()["upper"] == 2
    put("3.jsonl", jsonl_bytes([{"key": 1, "offset": 0, "v": "late, ignored (global)"},
                                {"key": 3, "offset": 200, "v": "newer"}]))
    cli.ingest(landing, engine="local")  # the re-run continues (any engine; saves a JVM)
    # The in-process engine on the same landing gives the same shard.
    cli.ingest(landing, "--order-scope", "global", shard="local", engine="local")
    spark_contents = _contents(cli, "s")
    assert spark_contents == _contents(cli, "local")
    assert spark_contents[3] == 3 and len(spark_contents[2]) == 2
    assert cli.check().json()["ok"] is True
