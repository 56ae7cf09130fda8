"""Real processes racing to append to one shard, on PostgreSQL and on SQLite.

Each writer process appends its own named batches at whatever upper it last read; lost
races are retried. Afterwards every batch is committed exactly once, the uppers are
contiguous, the data is all there, and the losers deleted their parts: no part blob is
left that no live state references (checked before any GC runs).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.read.read import read_all
from upsert_core.persist.shard import Shard

from .helpers_proc import data_blob_keys, live_referenced

WRITERS = 3
BATCHES = 5
SHARD = "racing"
ROOT = Path(__file__).resolve().parents[2]


def spawn(command: str, args: dict[str, object]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.persist.helpers_proc", command, json.dumps(args)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def race(consensus_url: str, blob_url: str, tmp_path: Path) -> None:
    # Create the shard first so the processes race on appends, not on initialisation.
    Shard.open(open_consensus(consensus_url), open_blob(blob_url), SHARD)
    go = tmp_path / "go"
    procs = [
        spawn("append", {"consensus": consensus_url, "blob": blob_url, "shard": SHARD,
                         "writer": f"w{i}", "count": BATCHES, "go_file": str(go)})
        for i in range(WRITERS)
    ]
    go.touch()
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        outputs.append(json.loads(out.strip().splitlines()[-1]))

    shard = Shard.open(open_consensus(consensus_url), open_blob(blob_url), SHARD, create=False)
    state = shard.state()
    total = WRITERS * BATCHES
    assert state.upper == total
    assert [(b.lower, b.upper) for b in state.batches] == [(t, t + 1) for t in range(total)]
    committed: dict[str, int] = {}
    for out in outputs:
        assert not set(out["committed"]) & set(committed)
        committed.update(out["committed"])
    assert dict(state.ingested_files) == committed  # each batch exactly once, where it says
    assert sorted(committed.values()) == list(range(total))
    rows = read_all(shard.changes(0, total)).to_pylist()
    assert sorted(r["row"].decode() for r in rows) == sorted(committed)
    assert all(r["diff"] == 1 and r["ts"] == committed[r["row"].decode()] for r in rows)
    # Losers deleted their parts: every part blob is referenced by a live state.
    assert data_blob_keys(shard.blob, SHARD) == live_referenced(shard)
    assert len(live_referenced(shard)) >= total
    report = shard.check()
    assert report.ok, report.problems


@pytest.mark.slow
def test_processes_race_on_sqlite(tmp_path: Path) -> None:
    race(f"sqlite:///{tmp_path}/consensus.db", f"file://{tmp_path}/blob", tmp_path)


@pytest.mark.slow
@pytest.mark.postgres
def test_processes_race_on_postgres(fresh_postgres_url: str, tmp_path: Path) -> None:
    race(fresh_postgres_url, f"file://{tmp_path}/blob", tmp_path)
