"""``deploy/cluster.sh`` end to end: a Spark standalone cluster with a long-lived Spark
Connect server on it, moto S3 and PostgreSQL.

One test, because the cluster costs ~20 s to start: the script starts everything on
127.0.0.1 (in a temporary ``UPSERT_CLUSTER_DIR``, with a database of its own), ``env``
gives the exports, ``upsertctl ingest`` with the Spark engine runs through the Connect
server (``SPARK_REMOTE``; the CLI process has no Java at all, so nothing ran locally)
against PostgreSQL consensus and an S3 blob store and landing, the result equals the
dict model and ``check`` passes. Then the same ingest with ``SPARK_REMOTE`` unset drives
the standalone master directly (an application of its own appears in the worker's work
dir, next to the Connect server's), so both cluster modes stay covered (``local[*]`` is
``tests/spark``). Both modes also read the shard back with ``spark.read.format("upsert")``
in executors that have no S3 settings of their own (the planning driver ships them). ``stop``
ends every process group it started and ``status`` then says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from tests.clusterctl import run_script, running
from tests.e2e.helpers import Cli, jsonl_bytes
from tests.model import UpsertModel

READ_SCRIPT = """
import json, sys
from resources.spark_session import get_spark
from resources.spark_source import read_shard
target, shard, consensus, blob = sys.argv[1:5]
spark = (get_spark(remote=target) if target.startswith("sc://")
         else get_spark(master=target, app_name="upsert data source read"))
df = read_shard(spark, shard, consensus=consensus, blob=blob, partitions=3)
print(json.dumps(sorted([r["key"], r["v"]] for r in df.collect())))
"""


def spark_read(target: str, shard: str, env: dict[str, str]) -> list[tuple[int, str]]:
    """The shard's rows read by ``spark.read.format("upsert")`` on ``target`` (a Connect
    URL or the master), from a process of its own with the cluster's exports."""
    done = subprocess.run(
        [sys.executable, "-c", READ_SCRIPT, target, shard, env["UPSERT_CONSENSUS_URL"],
         env["UPSERT_BLOB_URL"]],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [(k, v) for k, v in json.loads(done.stdout.strip().splitlines()[-1])]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    """A started cluster: (its exports, its directory); then stopped, and checked to be."""
    directory = tmp_path / "cluster"
    with running(directory) as handle:
        env = handle.script_env
        yield handle.exports, directory
    status = run_script(env, "status", rc=3)
    services = (directory / "services").read_text().split()
    assert services == ["spark-master", "spark-worker-1", "spark-worker-2", "spark-connect",
                        "moto"]
    assert status.count(": stopped") == len(services), status
    pids = [p.read_text() for p in directory.glob("*.pid")]
    assert pids == []


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.postgres
@pytest.mark.s3
def test_cluster_script_runs_a_spark_ingest_on_postgres_and_s3(
    tmp_path: Path, cluster: tuple[dict[str, str], Path]
) -> None:
    exports, directory = cluster
    assert exports["SPARK_MASTER"].startswith("spark://127.0.0.1:")
    assert exports["UPSERT_CONSENSUS_URL"].startswith("postgresql+psycopg://")
    assert exports["UPSERT_BLOB_URL"].startswith("s3://")
    assert (Path(exports["DAGSTER_HOME"]) / "dagster.yaml").is_file()
    bucket = exports["UPSERT_BLOB_URL"].removeprefix("s3://").split("/")[0]
    s3 = boto3.client(
        "s3", endpoint_url=exports["AWS_ENDPOINT_URL"],
        aws_access_key_id=exports["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=exports["AWS_SECRET_ACCESS_KEY"],
        region_name=exports["AWS_DEFAULT_REGION"],
    )
    rows1 = [{"key": k, "offset": k, "v": f"a{k}"} for k in range(40)]
    rows2 = [{"key": k, "offset": 100 + k, "v": f"b{k}"} for k in range(0, 40, 3)]
    rows2 += [{"key": k, "offset": 200, "__deleted": True} for k in (1, 2)]
    s3.put_object(Bucket=bucket, Key="landing/1.jsonl", Body=jsonl_bytes(rows1))
    s3.put_object(Bucket=bucket, Key="landing/2.jsonl", Body=jsonl_bytes(rows2))

    upsert = UpsertModel("batch")
    upsert.apply(rows1)
    upsert.apply(rows2)
    model = {k: dict(row)["v"] for (k,), row in upsert.snapshot().items()}
    assert len(model) == 38  # two deletes
    connect_apps = set((directory / "spark-work").glob("app-*"))
    assert len(connect_apps) == 1, "the Spark Connect server is not an application on the master"

    no_java = {"JAVA_HOME": str(tmp_path / "no-java")}
    cli = Cli(tmp_path / "home", env={**exports, **no_java}, engine="spark")
    result = cli.ingest(f"s3://{bucket}/landing", "--key", "key", "--order", "offset")
    assert "ingested 2 file(s)" in result.err and "upper 0 -> 2" in result.err, result.err
    snapshot = cli.snapshot()
    assert sorted((r["key"], r["v"]) for r in snapshot) == sorted(model.items())
    assert cli.inspect()["upper"] == 2
    assert cli.check().json()["ok"] is True
    # The data source through the Connect server: planned there, read by executors.
    read_env = {**os.environ, **exports}
    assert spark_read(exports["SPARK_REMOTE"], "s", read_env) == sorted(model.items())

    # The standalone master directly: a Spark application of this ingest's own.
    direct_env = {k: v for k, v in exports.items() if k != "SPARK_REMOTE"}
    direct = Cli(tmp_path / "home", env=direct_env, engine="spark")
    direct.env.pop("SPARK_REMOTE", None)  # not inherited from the test process either
    result = direct.ingest(f"s3://{bucket}/landing", "--key", "key", "--order", "offset",
                           shard="direct")
    assert "ingested 2 file(s)" in result.err, result.err
    apps = set((directory / "spark-work").glob("app-*"))
    assert len(apps - connect_apps) == 1, "the ingest did not run on the master directly"
    rows = direct.snapshot(shard="direct")
    assert sorted((r["key"], r["v"]) for r in rows) == sorted(model.items())
    # ...and on the master directly: this driver ships its S3 settings to the executors.
    direct_read_env = {k: v for k, v in read_env.items() if k != "SPARK_REMOTE"}
    assert spark_read(exports["SPARK_MASTER"], "direct", direct_read_env) == sorted(
        model.items())
