"""The review's data-loss reproductions, through fresh ``upsertctl`` processes.

Each test is the sequence a user ran when the defect was found; it fails on the code
before the fix (a203bdf) and passes after. They run on the embedded deployment only:
the mechanisms are in ``upsert_core`` and the cluster half is covered elsewhere.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from tests.e2e.helpers import Cli, write_jsonl
from tests.e2e.test_durability import POLL_S, WATCH_TIMEOUT_S, _unreferenced, _watch_shard
from upsert_core.persist.keys import shard_prefix

EMBEDDED = pytest.mark.parametrize("deployment", ["embedded"], indirect=True)


@EMBEDDED
@pytest.mark.parametrize("scope", ["batch", "global"])
def test_gc_retain_then_reinsert_keeps_the_row(cli: Cli, landing: Path, scope: str) -> None:
    """Insert, delete, ``gc --retain 1``, insert the same row again: the row is live."""
    row = {"key": 1, "offset": 1, "v": "V"}
    write_jsonl(landing, "f0.jsonl", [row])
    cli.ingest(landing, "--order-scope", scope)
    write_jsonl(landing, "f1.jsonl", [{"key": 1, "offset": 2, "__deleted": True}])
    cli.ingest(landing)
    cli.run("gc", "--shard", "s", "--retain", "1")
    write_jsonl(landing, "f2.jsonl", [{**row, "offset": 3}])
    cli.ingest(landing)
    assert cli.snapshot() == [{"key": 1, "offset": 3, "v": "V"}]
    assert cli.check().json()["ok"] is True
    write_jsonl(landing, "f3.jsonl", [{"key": 1, "offset": 4, "v": "W"}])
    cli.ingest(landing)
    assert cli.snapshot() == [{"key": 1, "offset": 4, "v": "W"}]
    assert cli.check().json()["ok"] is True


@EMBEDDED
def _sqlite_write_locked(consensus_url: str) -> bool:
    """Whether another process holds the write lock of a SQLite consensus (False for any
    other consensus)."""
    if not consensus_url.startswith("sqlite:///"):
        return False
    conn = sqlite3.connect(consensus_url[len("sqlite:///"):], timeout=0.2, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError:
        return True
    finally:
        conn.close()


def test_a_writer_stopped_past_its_lease_is_fenced_and_loses_nothing(
    cli: Cli, landing: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGSTOP an ingest after it wrote parts of a file, let its lease run out, run
    ``gc`` (which fences it and deletes those parts), SIGCONT it: its commit is refused,
    it redoes the file under a new registration and exits 0. No read ever meets a
    missing part, and nothing is left unreferenced after GC."""
    lease_s = 2.0
    stoppable = cli.derive(env={"UPSERT_WRITER_LEASE_S": str(lease_s)})
    # The first file goes in on its own: the Spark engine runs a run's small files as
    # one job (here the big file and the last one) and commits them right after it.
    write_jsonl(landing, "1-small.jsonl", [{"key": -1, "offset": 0, "v": "first"}])
    cli.ingest(landing)
    big = [{"key": i, "offset": i, "v": f"value-{i:06d}"} for i in range(60_000)]
    write_jsonl(landing, "2-big.jsonl", big)
    write_jsonl(landing, "3-small.jsonl", [{"key": -1, "offset": 1, "v": "last"}])
    proc = stoppable.popen(*stoppable.ingest_args(landing))
    stopped = False
    try:
        shard = _watch_shard(cli, monkeypatch)
        deadline = time.monotonic() + WATCH_TIMEOUT_S
        while True:  # stop it once the big file's blobs exist, before their commit
            assert proc.poll() is None, "the ingest finished before it could be stopped"
            assert time.monotonic() < deadline
            if shard.upper >= 1 and _unreferenced(shard):
                break
            time.sleep(POLL_S)
        os.killpg(proc.pid, signal.SIGSTOP)
        stopped = True
        for _ in range(50):
            # SUBTLE: a SQLite consensus is one file with one write lock; a process stopped
            # inside a write (its lease heartbeat, say) holds it for as long as it is
            # stopped, and every other process waits on it. That is SQLite's nature, not
            # what this test is about: stop the writer between writes.
            if not _sqlite_write_locked(cli.stores[0]):
                break
            os.killpg(proc.pid, signal.SIGCONT)
            time.sleep(0.02)
            os.killpg(proc.pid, signal.SIGSTOP)
        written = _unreferenced(shard)
        assert shard.upper == 1 and written
        (writer,) = shard.state().writers
        time.sleep(lease_s + 0.5)
        report = cli.run("gc", "--shard", "s").json()
        assert report["leases_expired"] == 1 and writer not in shard.state().writers
        assert report["leaked_blobs_deleted"] >= 1
        assert not written & {m.key for m in shard.blob.list_keys(shard_prefix("s"))}
        # Readers never meet a missing part while the stopped writer's blobs are gone.
        assert cli.snapshot() == [{"key": -1, "offset": 0, "v": "first"}]
        assert cli.check().json()["ok"] is True
        os.killpg(proc.pid, signal.SIGCONT)
        stopped = False
        out, err = proc.communicate(timeout=WATCH_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            if stopped:
                os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, err
    assert "fenced" in err and "redoing it as a new writer" in err
    info = cli.inspect()
    assert info["upper"] == 3 and info["ingested_files"] == {
        "1-small.jsonl": 0, "2-big.jsonl": 1, "3-small.jsonl": 2}
    snap = cli.snapshot()
    assert len(snap) == 60_001 and {"key": 59_999, "offset": 59_999, "v": "value-059999"} in snap
    assert {"key": -1, "offset": 1, "v": "last"} in snap
    assert cli.check().json()["ok"] is True
    cli.run("gc", "--shard", "s")
    assert not _unreferenced(shard)
    assert not shard.state().writers
