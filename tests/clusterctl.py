"""Driving ``deploy/cluster.sh`` from tests: start, read its exports, stop, clean up.

Invariants:

- A test cluster lives in a directory of its own (``UPSERT_CLUSTER_DIR``) with a
  PostgreSQL database of its own (``UPSERT_CLUSTER_DB``, a fresh name); :func:`running`
  stops every process the script started and drops that database, even on failure.
- The script runs with this interpreter (``UPSERT_PYTHON``) and without the caller's
  ``UPSERT_*``, ``AWS_*``, ``SPARK_MASTER`` or ``SPARK_REMOTE`` settings, so the exports
  it prints are the whole configuration and nothing leaks in from the test process.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

from tests.services import PG_ADMIN_DSN

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "deploy" / "cluster.sh"
SCRIPT_TIMEOUT_S = 120
# ``start`` waits for each JVM in turn (its own limits add up to 270 s); with the suite's
# other groups running beside it on two cores it has taken 110 s, so let its own limits
# decide rather than cutting it off at SCRIPT_TIMEOUT_S.
START_TIMEOUT_S = 300


@dataclass(frozen=True)
class ClusterHandle:
    """A started cluster: the exports ``cluster.sh env`` prints, and its directory."""

    exports: dict[str, str]
    directory: Path
    database: str
    script_env: dict[str, str]

    @property
    def bucket(self) -> str:
        return self.exports["UPSERT_BLOB_URL"].removeprefix("s3://").split("/")[0]

    @property
    def pg_dsn(self) -> str:
        """A libpq DSN for the cluster's database (for psycopg)."""
        return self.exports["DAGSTER_PG_URL"]


def script_env(directory: Path, database: str, workers: int | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPSERT_", "AWS_"))}
    env.update(UPSERT_CLUSTER_DIR=str(directory), UPSERT_CLUSTER_DB=database,
               UPSERT_PYTHON=sys.executable)
    if workers is not None:
        env["UPSERT_CLUSTER_WORKERS"] = str(workers)
    env.pop("SPARK_MASTER", None)
    env.pop("SPARK_REMOTE", None)
    return env


def run_script(env: dict[str, str], *args: str, rc: int | None = 0) -> str:
    """Run ``cluster.sh ARGS``; assert its exit status is ``rc`` (None: any)."""
    proc = subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True,
        timeout=START_TIMEOUT_S if args[:1] == ("start",) else SCRIPT_TIMEOUT_S,
    )
    if rc is not None:
        assert proc.returncode == rc, f"cluster.sh {args}: rc={proc.returncode}\n{proc.stderr}"
    return proc.stdout


def parse_exports(text: str) -> dict[str, str]:
    """``export NAME=VALUE`` lines (as ``cluster.sh env`` prints them) to a dict."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        out[name] = shlex.split(value)[0] if value else ""
    return out


def drop_database(database: str) -> None:
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


@contextmanager
def running(directory: Path, workers: int | None = None) -> Iterator[ClusterHandle]:
    """Start a cluster in ``directory`` (with ``workers`` workers; None: the script's
    default); stop it and drop its database on exit."""
    database = f"upsert_cluster_test_{uuid.uuid4().hex[:10]}"
    env = script_env(directory, database, workers)
    try:
        run_script(env, "start")
        yield ClusterHandle(parse_exports(run_script(env, "env")), directory, database, env)
    finally:
        try:
            run_script(env, "stop", rc=None)
        finally:
            drop_database(database)
