"""One file's buckets drain on both executors of the loopback cluster, as Spark records it.

``deploy/cluster.sh`` starts two workers by default, and its Spark Connect server holds one
executor on each. A JSON Lines file of several buckets is ingested through that server
with the Spark engine on both paths: the one-stage path (two slices, each reading the
file and draining half the buckets) and the split path (read tasks, a shuffle, a task per
bucket). Which executor drained each bucket is not assumed from the plan: the engine's
``task:`` lines name the task attempt of each bucket, and the Connect server's UI REST
API (``/api/v1/.../stages``) names the executor Spark ran that attempt on. The shards
equal the in-process engine's (``upsertctl ingest --engine local``) snapshot, and the run's
report carries the tasks' memory (``resources.task_memory``) and the largest bucket.

Measured before two workers (``--workers 1``: one executor of two cores): every bucket
task of both paths ran on executor 0, so the assertion below fails there.
"""

from __future__ import annotations

import json
import os
import random
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.cluster.spark_tasks import bucket_executors, executors, read_executors, spark_ingest
from tests.clusterctl import ClusterHandle, running
from tests.e2e.helpers import Cli, jsonl_bytes

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.spark, pytest.mark.postgres,
              pytest.mark.s3]

BUCKETS = 8
ROWS = 200_000  # 100k keys, ~12.5k per bucket (11.6 MB)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    """A cluster as ``deploy/cluster.sh start`` makes it by default."""
    with running(tmp_path_factory.mktemp("cluster")) as handle:
        yield handle


def _rows(n: int) -> list[dict[str, Any]]:
    """``n`` rows over ``n // 2`` keys: updates in and out of order, some deletes."""
    rng = random.Random(24)
    rows: list[dict[str, Any]] = []
    for i in range(n):
        key = rng.randrange(n // 2)
        if rng.random() < 0.05:
            rows.append({"key": key, "offset": i, "__deleted": True})
        else:
            rows.append({"key": key, "offset": rng.randrange(n), "v": f"{rng.getrandbits(64):x}"})
    return rows


def _by_key(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: r["key"])


def test_the_connect_server_has_an_executor_on_each_of_two_workers(
    cluster: ClusterHandle,
) -> None:
    with urllib.request.urlopen(f"{cluster.exports['UPSERT_CLUSTER_MASTER_UI']}/json",
                                timeout=10) as resp:
        master = json.load(resp)
    alive = [w for w in master["workers"] if w["state"] == "ALIVE"]
    assert len(alive) == 2 and len({w["id"] for w in alive}) == 2
    found = executors(cluster.exports["UPSERT_CLUSTER_SPARK_UI"])
    assert len(found) == 2 and {e["totalCores"] for e in found} == {1}
    assert len({e["hostPort"] for e in found}) == 2


def test_one_files_buckets_drain_on_both_executors(
    cluster: ClusterHandle, tmp_path: Path
) -> None:
    exports = cluster.exports
    ui = exports["UPSERT_CLUSTER_SPARK_UI"]
    s3 = boto3.client(
        "s3", endpoint_url=exports["AWS_ENDPOINT_URL"],
        aws_access_key_id=exports["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=exports["AWS_SECRET_ACCESS_KEY"],
        region_name=exports["AWS_DEFAULT_REGION"],
    )
    body = jsonl_bytes(_rows(ROWS))
    s3.put_object(Bucket=cluster.bucket, Key="spread/00.jsonl", Body=body)
    landing = f"s3://{cluster.bucket}/spread"

    cli = Cli(tmp_path / "home", env=dict(exports), engine="spark")
    local = cli.ingest(landing, "--buckets", str(BUCKETS), "--json", shard="local",
                       engine="local").json()
    expected = cli.snapshot(shard="local")
    assert len(expected) > ROWS // 4

    env = {**os.environ, **exports}
    executor_ids = {e["id"] for e in executors(ui)}
    assert len(executor_ids) == 2, executor_ids
    runs = {
        "one-stage": spark_ingest({**env, "UPSERT_SPARK_SPLIT": "off"}, "one-stage", landing,
                                  BUCKETS),
        "split": spark_ingest({**env, "UPSERT_SPARK_SPLIT": "on",
                               "UPSERT_SPARK_SPLIT_BYTES": str(len(body) // 4 + 1)},
                              "split", landing, BUCKETS),
    }
    for path, run in runs.items():
        assert run["split"] is (path == "split") and not run["fallback"], path
        drained = bucket_executors(ui, run)
        assert sorted(drained) == list(range(BUCKETS)), path
        assert {t.executor for t in drained.values()} == executor_ids, (
            f"{path}: buckets drained on {sorted({t.executor for t in drained.values()})}")
        read = read_executors(ui, run)
        assert len(read) == (4 if path == "split" else 2), path
        assert _by_key(cli.snapshot(shard=path)) == _by_key(expected), path

        (entry,) = run["report"]["files"]
        (reference,) = local["files"]
        assert entry["largest_bucket_keys"] == reference["largest_bucket_keys"] > 0
        assert reference["task_peak_memory"] == reference["drain_memory_added"] == 0
        assert entry["task_peak_memory"] > max(30 << 20, entry["drain_memory_added"]), entry
