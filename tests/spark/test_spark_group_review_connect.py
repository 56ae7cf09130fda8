"""Review of issue 24: the group path through a Spark Connect server (``local[2]``).

A run of several small files on Connect goes through ``SparkEngine.run_group``, which
falls back to the per-file path without a word when the group's job fails as a whole
(``return []``). A run that silently took the fallback would still produce the right
shard (the existing Connect test cannot tell), at two jobs per file: so this checks that
the group itself produced the outcomes, in a client process (no JVM of its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults.helpers import REQUEST, assert_recovered, make_landing, reference_shard
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]

CLIENT = """
import json, sys
from pyspark.sql import SparkSession
from resources.spark_ingest import SparkEngine
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard

spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
root = sys.argv[2]
shard = Shard.open(open_consensus(f"sqlite:///{root}/c.db"), open_blob(f"file://{root}/blob"), "s")
groups = []

class Counted(SparkEngine):
    def run_group(self, tasks, shard):
        outcomes = super().run_group(tasks, shard)
        groups.append([len(tasks), len(outcomes)])
        return outcomes

report = ingest(shard, sys.argv[3], IngestRequest(key=("key",), order="offset", buckets=2,
                                                  inline_threshold=256),
                engine=Counted(spark))
print(json.dumps({"groups": groups, "files": [f.name for f in report.files]}))
"""


def test_a_group_runs_as_one_job_on_spark_connect(connect_url: str, tmp_path: Path) -> None:
    landing = make_landing(tmp_path / "landing", files=6, rows=20, keys=12, seed=2)
    root = tmp_path / "shard"
    root.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_MASTER")}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-c", CLIENT, connect_url, str(root), str(landing)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["groups"] == [[6, 6]], out
    shard = Shard.open(open_consensus(f"sqlite:///{root}/c.db"),
                       open_blob(f"file://{root}/blob"), "s")
    assert_recovered(shard, reference_shard(landing, REQUEST))
