"""Crash safety: processes killed with SIGKILL between writing parts and the
compare-and-set, and in the middle of GC, leave the shard readable at its last upper;
a later GC (leak grace 0 here) removes what they leaked."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from upsert_core.persist.keys import rollup_prefix
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.read.read import read_all
from upsert_core.persist.shard import Shard

from .helpers_proc import (
    Update,
    blob_keys,
    data_blob_keys,
    live_referenced,
    live_rollup_keys,
    rows_of,
    updates_table,
    upsert_updates,
)

SHARD = "crashy"
ROOT = Path(__file__).resolve().parents[2]


def urls(tmp_path: Path) -> dict[str, str]:
    return {"consensus": f"sqlite:///{tmp_path}/consensus.db",
            "blob": f"file://{tmp_path}/blob", "shard": SHARD}


def open_shard(args: dict[str, str], **kwargs: int) -> Shard:
    return Shard.open(open_consensus(args["consensus"]), open_blob(args["blob"]), SHARD,
                      **kwargs)  # type: ignore[arg-type]


def fill(shard: Shard, n: int) -> dict[int, list[Update]]:
    model: dict[bytes, bytes] = {}
    snapshots: dict[int, list[Update]] = {}
    for ts in range(n):
        ops = [(ts % 4, b"v%d" % ts), ((ts + 2) % 5, None if ts % 3 == 0 else b"w%d" % ts)]
        assert shard.append(updates_table(upsert_updates(model, ts, ops)), ts).committed
        snapshots[ts] = sorted((k, v, ts, 1) for k, v in model.items())
    # Done writing: a registered writer's blobs that end up unreferenced (parts replaced
    # by compaction) wait for its registration to end before GC may delete them.
    shard.release_writer()
    return snapshots


def assert_readable(shard: Shard, snapshots: dict[int, list[Update]], upper: int) -> None:
    state = shard.state()
    assert state.upper == upper
    for ts in range(state.since, upper):
        assert rows_of(read_all(shard.snapshot(ts))) == snapshots[ts], ts


def assert_clean(shard: Shard) -> None:
    """Exactly the referenced blobs remain, and every invariant holds."""
    assert data_blob_keys(shard.blob, SHARD) == live_referenced(shard)
    assert {m.key for m in shard.blob.list_keys(rollup_prefix(SHARD))} == live_rollup_keys(shard)
    report = shard.check()
    assert report.ok, report.problems


def run(command: str, args: dict[str, object]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.persist.helpers_proc", command, json.dumps(args)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


@pytest.mark.slow
def test_writer_killed_between_parts_and_commit(tmp_path: Path) -> None:
    args = urls(tmp_path)
    shard = open_shard(args, inline_threshold=0)
    snapshots = fill(shard, 5)
    proc = run("write_then_hang", args)
    assert proc.stdout is not None
    leaked = json.loads(proc.stdout.readline())["leaked"]
    assert proc.stdout.readline().strip() == "READY"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    proc.stderr.close()  # type: ignore[union-attr]
    assert proc.returncode == -signal.SIGKILL
    assert len(leaked) == 2 and set(leaked) <= blob_keys(shard.blob, SHARD)

    assert_readable(shard, snapshots, 5)
    killed = {w for w in shard.state().writers if f".{proc.pid}." in w}
    assert len(killed) == 1  # the killed writer's registration
    # Default grace, yet deleted at once: the writer's process is gone on this host, so
    # GC removes its registration by compare-and-set (fencing it) and then its blobs.
    report = shard.gc()
    assert set(leaked) <= set(report.deleted_keys) and report.leaked_blobs_deleted == 2
    assert report.leases_expired == 1 and not killed & set(shard.state().writers)
    assert_readable(shard, snapshots, 5)
    assert_clean(shard)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["delete:1", "delete:3", "truncate", "after_truncate"])
def test_gc_killed_midway(tmp_path: Path, point: str) -> None:
    args = urls(tmp_path)
    shard = open_shard(args, inline_threshold=0, rollup_every=4)
    snapshots = fill(shard, 10)
    proc = run("gc_then_die", {**args, "point": point})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, (out, err[-2000:])

    after_crash = Shard.open(open_consensus(args["consensus"]), open_blob(args["blob"]), SHARD,
                             create=False)
    assert_readable(after_crash, snapshots, 10)
    after_crash.gc(leak_grace_ms=0)
    assert_readable(after_crash, snapshots, 10)
    assert_clean(after_crash)
    # Still writable after recovery.
    assert after_crash.append(updates_table([]), 10).committed
