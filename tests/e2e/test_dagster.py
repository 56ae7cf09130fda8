"""CONTRACT.md "Dagster": the code location, configured by the same environment
variables as ``upsertctl``, on each deployment (the cluster: Spark standalone, the
stores in PostgreSQL + S3, Dagster's runs and events in PostgreSQL).

The flow is the production one, each step a process of its own: a sensor tick turns
landing files into partitions and run requests (``dagster_probe tick``), ``dagster job
execute`` runs the requested ingest job for a partition (its Spark step on the
deployment's master), and the instance's run storage then holds the runs with their
asset checks passed; ``upsertctl`` reads the shard the runs wrote.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from orchestration.jobs import ingest_job_name
from tests.e2e.deployment import Deployment
from tests.e2e.helpers import REPO, Cli, bag, write_jsonl
from tests.model import UpsertModel

# The cluster's Dagster instance is shared by every test on it: a source (and so its
# partitions and sensor cursor) of this test's own.
SOURCE = f"orders_{uuid.uuid4().hex[:8]}"
TIMEOUT_S = 300
BATCHES: dict[str, list[dict[str, Any]]] = {
    "b-01.jsonl": [{"key": "a", "offset": 1, "v": "a1"}, {"key": "b", "offset": 2, "v": "b1"},
                   {"key": "c", "offset": 3, "v": "c1"}, {"key": "a", "offset": 0, "v": "a0"}],
    "b-02.jsonl": [{"key": "b", "offset": 4, "v": "b2"}, {"key": "c", "offset": 5,
                                                          "__deleted": True},
                   {"key": None, "offset": 6, "v": "bad"}],
    "b-03.jsonl": [{"key": "a", "offset": 7, "v": "a2"}, {"key": "d", "offset": 8, "v": "d1"}],
}


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(args), env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"{args}: rc={proc.returncode}\n{proc.stderr[-4000:]}"
    return proc


def _probe(env: dict[str, str], *args: str) -> Any:
    return json.loads(_run(env, sys.executable, "-m", "tests.e2e.dagster_probe", *args).stdout)


def _execute(env: dict[str, str], partition: str) -> None:
    _run(env, str(Path(sys.executable).parent / "dagster"), "job", "execute",
         "-m", "orchestration.definitions", "-j", ingest_job_name(SOURCE),
         "--tags", json.dumps({"dagster/partition": partition}))


def test_sensor_partitions_runs_and_checks_through_dagster(
    cli: Cli, deployment: Deployment, tmp_path: Path, landing: Path
) -> None:
    for name, rows in BATCHES.items():
        write_jsonl(landing, name, rows)
    env = {**cli.env, "UPSERT_LANDING": cli.landing_url(landing), "UPSERT_SHARD": SOURCE,
           "UPSERT_KEY": "key", "UPSERT_ORDER": "offset", "UPSERT_ENGINE": cli.engine,
           "DAGSTER_HOME": str(deployment.dagster_home(tmp_path))}
    names = sorted(BATCHES)

    tick = _probe(env, "tick", SOURCE)
    assert tick["partitions"] == names
    assert tick["runs"] == [[n, n] for n in names]
    # The run for b-01 applies it alone; the run for b-03 applies every file pending up
    # to it (b-02 and b-03), as the runs of a backfill in name order would.
    _execute(env, names[0])
    assert cli.inspect(SOURCE)["upper"] == 1
    _execute(env, names[2])
    # A second tick finds nothing new: no partition or run is requested twice.
    assert _probe(env, "tick", SOURCE)["skip"]

    model = UpsertModel("batch")
    for name in names:
        model.apply(BATCHES[name])  # b-02's null-key row is an error row, not applied
    info = cli.inspect(SOURCE)
    assert info["upper"] == 3 and info["ingested_files"] == {n: i for i, n in enumerate(names)}
    assert bag(cli.snapshot(SOURCE)) == bag(model.records(2, ["key", "offset", "v"]))
    assert [(e["file"], e["row"]) for e in cli.errors(SOURCE)] == [("b-02.jsonl", 3)]
    assert cli.check(SOURCE).json()["ok"] is True

    recorded = _probe(env, "runs")
    expected_storage = "PostgresRunStorage" if deployment.name == "cluster" else "SqliteRunStorage"
    assert recorded["run_storage"] == expected_storage
    ours = [r for r in recorded["runs"] if r["job"] == ingest_job_name(SOURCE)]
    assert [(r["partition"], r["status"]) for r in ours[-2:]] == [
        (names[0], "SUCCESS"), (names[2], "SUCCESS")]
    for run in ours[-2:]:
        assert run["checks"], f"no asset check ran in {run}"
        # error_rows_did_not_grow warns (does not fail the run) when b-02's bad row lands.
        failed = {c["check"] for c in run["checks"] if not c["passed"]}
        assert failed <= {"error_rows_did_not_grow"}, run
