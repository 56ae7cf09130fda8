"""A rebucket killed (SIGKILL) at any point leaves the shard as it was or as it should
be, never half: before its commit, every retained time reads as before on the old
count, ``check`` and the upsert state hold, and a GC removes what it wrote (its process
is dead, so GC fences it at once); after its commit, the same on the new count. Either
way the next rebucket and ingests go on, against the model."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from upsert_core.ingest import InProcessEngine
from upsert_core.ingest.rebucket import rebucket
from upsert_core.ingest.shard_config import ShardIngestConfig
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard
from upsert_core.persist.testing import unreferenced_blobs

from .test_rebucket import Landing, assert_matches, labels

ROOT = Path(__file__).resolve().parents[2]


def _open(stores: Path) -> Shard:
    return Shard.open(open_consensus(f"sqlite:///{stores}/consensus.db"),
                      open_blob(f"file://{stores}/blob"), "s")


def _buckets(shard: Shard) -> int:
    options = ShardIngestConfig.read(shard.state().config).options
    assert options is not None
    return options.buckets


@pytest.mark.slow
@pytest.mark.parametrize(("point", "scope"), [
    ("part:1", "global"), ("part:9", "batch"), ("checkpoint:1", "batch"),
    ("checkpoint:3", "global"), ("before_commit", "global"), ("after_commit", "batch"),
    ("after_commit", "global"),
])
def test_a_killed_rebucket_leaves_the_shard_whole(tmp_path: Path, point: str, scope: str) -> None:
    stores, landing_dir = tmp_path / "stores", tmp_path / "landing"
    stores.mkdir()
    landing_dir.mkdir()
    landing = Landing(landing_dir, scope)
    shard = _open(stores)
    for _ in range(3):
        landing.add()
        landing.ingest(shard, buckets=4)

    proc = subprocess.run(
        [sys.executable, "-m", "tests.ingest.rebucket_proc", str(stores), "16", point],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]

    shard = _open(stores)
    committed = point == "after_commit"
    assert _buckets(shard) == (16 if committed else 4)
    assert labels(shard) == {16 if committed else 4}
    assert len(shard.state().writers) == 1  # the dead rebucket's, never released
    assert_matches(shard, landing)
    # The dead process's writer goes at once (it names this host's dead pid), and with
    # it every blob it wrote that no state references.
    report = shard.gc()
    assert report.leases_expired == 1
    assert unreferenced_blobs(shard) == set()
    assert_matches(shard, landing)

    assert rebucket(shard, 8).changed
    landing.add([{"key": k, "offset": 2, "v": "old"} for k in range(60)])
    landing.add()
    landing.ingest(shard, engine=InProcessEngine(cache="new"))
    assert _buckets(shard) == 8 and labels(shard) == {8}
    assert_matches(shard, landing)

