"""``deploy/cluster.sh`` end to end: a Spark standalone cluster, moto S3 and PostgreSQL.

One test, because the cluster costs ~10 s to start: the script starts everything on
127.0.0.1 (in a temporary ``UPSERT_CLUSTER_DIR``, with a database of its own), ``env``
gives the exports, ``upsertctl ingest`` with the Spark engine runs on the standalone
master (an application appears in the worker's work dir) against PostgreSQL consensus
and an S3 blob store and landing, the result equals the dict model and ``check``
passes; ``stop`` ends every process group it started and ``status`` then says so.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import psycopg
import pytest

from tests.e2e.helpers import REPO, Cli, jsonl_bytes
from tests.services import PG_ADMIN_DSN

SCRIPT = REPO / "deploy" / "cluster.sh"


def _script(cluster_env: dict[str, str], *args: str, rc: int | None = 0) -> str:
    proc = subprocess.run(
        ["bash", str(SCRIPT), *args], env=cluster_env, capture_output=True, text=True,
        timeout=120,
    )
    if rc is not None:
        assert proc.returncode == rc, f"cluster.sh {args}: rc={proc.returncode}\n{proc.stderr}"
    return proc.stdout


def _exports(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        out[name] = shlex.split(value)[0] if value else ""
    return out


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    """A started cluster: (its exports, its directory); stopped and its database dropped."""
    directory = tmp_path / "cluster"
    db = f"upsert_cluster_test_{uuid.uuid4().hex[:10]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPSERT_", "AWS_"))}
    env.update(UPSERT_CLUSTER_DIR=str(directory), UPSERT_CLUSTER_DB=db,
               UPSERT_PYTHON=sys.executable)
    env.pop("SPARK_MASTER", None)
    try:
        _script(env, "start")
        yield _exports(_script(env, "env")), directory
    finally:
        _script(env, "stop", rc=None)
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    status = _script(env, "status", rc=3)
    assert status.count(": stopped") == 3, status
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

    cli = Cli(tmp_path / "home", env=exports, engine="spark")
    result = cli.ingest(f"s3://{bucket}/landing", "--key", "key", "--order", "offset")
    assert "ingested 2 file(s)" in result.err and "upper 0 -> 2" in result.err, result.err
    assert list((directory / "spark-work").glob("app-*")), "the ingest did not run on the cluster"

    model = {r["key"]: r["v"] for r in rows1}
    model.update({r["key"]: r["v"] for r in rows2 if not r.get("__deleted")})
    for k in (1, 2):
        model.pop(k)
    snapshot = cli.snapshot()
    assert sorted((r["key"], r["v"]) for r in snapshot) == sorted(model.items())
    assert cli.inspect()["upper"] == 2
    assert cli.check().json()["ok"] is True
