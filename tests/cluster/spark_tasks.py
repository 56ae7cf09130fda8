"""Which executor ran which task of an ingest on the loopback cluster, from Spark itself.

The Spark engine's tasks say which task attempt read each split (or slice) and drained
each bucket (``task:`` lines, ``SparkEngine.last_tasks``); the Connect server's UI REST
API (``UPSERT_CLUSTER_SPARK_UI``, ``/api/v1``) says which executor ran each attempt and
its task metrics. Joining the two on the attempt id (Spark's ``taskId``) tells where every
bucket drained without assuming anything about the scheduler.

Invariants: nothing here starts Spark in the test process; :func:`spark_ingest` runs the
engine in a process of its own (a Spark Connect client, as ``upsertctl`` is) and
:func:`task_records` only reads the REST API, waiting for the listener to have seen every
attempt asked for (Spark records a task's end asynchronously).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

INGEST_SCRIPT = """
import json, sys
from resources.spark_ingest import SparkEngine
from resources.spark_session import get_spark
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard
remote, shard_name, landing, buckets = sys.argv[1:5]
import os
spark = get_spark(remote=remote)
shard = Shard.open(open_consensus(os.environ["UPSERT_CONSENSUS_URL"]),
                   open_blob(os.environ["UPSERT_BLOB_URL"]), shard_name)
engine = SparkEngine(spark)
report = ingest(shard, landing, IngestRequest(buckets=int(buckets)), engine=engine)
run = engine.last_tasks
print(json.dumps({"report": report.to_dict(), "split": engine.last_split is not None,
                  "read_tasks": {str(k): v for k, v in run.read_tasks.items()},
                  "bucket_tasks": {str(k): v for k, v in run.bucket_tasks.items()},
                  "fallback": run.fallback}))
"""


def spark_ingest(env: dict[str, str], shard: str, landing: str, buckets: int,
                 timeout: float = 600) -> dict[str, Any]:
    """Ingest ``landing`` into ``shard`` with the Spark engine through ``SPARK_REMOTE``,
    in a process of its own: its report (``--json``'s), whether the file took the split
    path, and the ``task:`` lines of the last file by split/slice and by bucket."""
    done = subprocess.run(
        [sys.executable, "-c", INGEST_SCRIPT, env["SPARK_REMOTE"], shard, landing,
         str(buckets)],
        env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


@dataclass(frozen=True)
class TaskRecord:
    """One task attempt as Spark's UI recorded it."""

    attempt: int
    stage: int
    partition: int
    executor: str
    host: str
    seconds: float
    peak_execution_memory: int


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


def task_records(ui: str, stages: set[int], attempts: set[int],
                 wait_s: float = 60.0) -> dict[int, TaskRecord]:
    """The UI's record of each attempt id in ``attempts`` (tasks of ``stages``) of the
    Connect server's one application; waits until every one is recorded as ended."""
    apps = _get(f"{ui}/api/v1/applications")
    assert len(apps) == 1, apps
    base = f"{ui}/api/v1/applications/{apps[0]['id']}"
    deadline = time.monotonic() + wait_s
    while True:
        found: dict[int, TaskRecord] = {}
        for stage in sorted(stages):
            try:
                attempts_of_stage = _get(f"{base}/stages/{stage}?details=true")
            except urllib.error.HTTPError as exc:
                if exc.code != 404:  # 404: the listener has not seen the stage yet
                    raise
                attempts_of_stage = []
            for attempt in attempts_of_stage:
                for task in attempt.get("tasks", {}).values():
                    if task.get("status") not in ("SUCCESS", "FAILED", "KILLED"):
                        continue
                    metrics = task.get("taskMetrics") or {}
                    found[int(task["taskId"])] = TaskRecord(
                        attempt=int(task["taskId"]), stage=stage,
                        partition=int(task.get("partitionId", task["index"])),
                        executor=str(task["executorId"]), host=str(task["host"]),
                        seconds=float(task.get("duration", 0)) / 1000,
                        peak_execution_memory=int(metrics.get("peakExecutionMemory", 0)),
                    )
        if attempts <= set(found) or time.monotonic() > deadline:
            missing = attempts - set(found)
            assert not missing, f"Spark's UI has no record of task attempts {sorted(missing)}"
            return {a: found[a] for a in attempts}
        time.sleep(0.5)


def executors(ui: str) -> list[dict[str, Any]]:
    """The Connect server application's live executors (the driver excluded)."""
    apps = _get(f"{ui}/api/v1/applications")
    rows = _get(f"{ui}/api/v1/applications/{apps[0]['id']}/executors")
    return [e for e in rows if e["id"] != "driver"]


def bucket_executors(ui: str, run: dict[str, Any]) -> dict[int, TaskRecord]:
    """For each bucket of ``run`` (:func:`spark_ingest`'s answer), the task that drained
    it as Spark recorded it."""
    infos = {int(b): info for b, info in run["bucket_tasks"].items()}
    records = task_records(ui, {int(i["stage"]) for i in infos.values()},
                           {int(i["attempt"]) for i in infos.values()})
    return {b: records[int(info["attempt"])] for b, info in infos.items()}


def read_executors(ui: str, run: dict[str, Any]) -> dict[int, TaskRecord]:
    """For each split (or slice) of ``run``, the task that read it as Spark recorded it."""
    infos = {int(s): info for s, info in run["read_tasks"].items()}
    records = task_records(ui, {int(i["stage"]) for i in infos.values()},
                           {int(i["attempt"]) for i in infos.values()})
    return {s: records[int(info["attempt"])] for s, info in infos.items()}
