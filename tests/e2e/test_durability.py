"""CONTRACT.md "Durability and concurrency" and "History and GC" through ``upsertctl``.

The processes under test are real ``upsertctl`` processes; the test process opens the
stores with the library only to watch them (upper, blob listing) while they run.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.helpers import Cli, bag, write_jsonl
from tests.model import UpsertModel
from upsert_core.errors import ShardNotFound
from upsert_core.persist.keys import shard_prefix
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard
from upsert_core.persist.testing import unreferenced_blobs

POLL_S = 0.005
WATCH_TIMEOUT_S = 120


def _batches(n: int) -> list[list[dict[str, object]]]:
    """n batches over a few keys with updates, deletes and one bad row each."""
    out = []
    for i in range(n):
        rows: list[dict[str, object]] = [
            {"key": (i * 3 + j) % 7, "offset": i * 10 + j, "v": f"b{i}-{j}"} for j in range(4)
        ]
        rows.append({"key": (i * 5) % 7, "offset": i * 10 + 5, "__deleted": True})
        rows.append({"key": None, "offset": i})  # a row error per batch
        out.append(rows)
    return out


def test_two_concurrent_ingests_apply_every_file_exactly_once(cli: Cli, landing: Path) -> None:
    batches = _batches(10)
    for i, rows in enumerate(batches):
        write_jsonl(landing, f"{i:02d}.jsonl", rows)
    args = cli.ingest_args(landing)
    procs = [cli.popen(*args) for _ in range(2)]
    results = [(p.wait(timeout=WATCH_TIMEOUT_S), *p.communicate()) for p in procs]
    for rc, _out, err in results:
        assert rc == 0 or "concurrently modified" in err, err
        if rc != 0:
            assert len([x for x in err.splitlines() if x.startswith("upsertctl: error:")]) == 1
    cli.ingest(landing)  # completes whatever a loser left pending
    info = cli.inspect()
    assert info["upper"] == 10
    assert info["ingested_files"] == {f"{i:02d}.jsonl": i for i in range(10)}
    errors = cli.errors()
    assert sorted(e["file"] for e in errors) == [f"{i:02d}.jsonl" for i in range(10)]
    model = UpsertModel("batch")
    for rows in batches:
        model.apply(rows)  # each batch's null-key row is an error row, not applied
    assert bag(cli.snapshot()) == bag(model.records(9, ["key", "offset", "v"]))
    assert cli.check().json()["ok"] is True


def _unreferenced(shard: Shard) -> set[str]:
    """Part and checkpoint blobs no live state references (listing first)."""
    return unreferenced_blobs(shard, ("part", "checkpoint"))


def _watch_shard(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> Shard:
    """The shard ``cli`` ingests into, opened in this process (once it exists)."""
    for name, value in cli.service_env().items():
        monkeypatch.setenv(name, value)
    consensus, blob = cli.stores
    deadline = time.monotonic() + WATCH_TIMEOUT_S
    while True:
        try:
            return Shard.open(open_consensus(consensus), open_blob(blob), "s", create=False)
        except ShardNotFound:
            if time.monotonic() > deadline:
                raise
            time.sleep(POLL_S)


def test_sigkill_mid_ingest_then_rerun_completes_and_gc_removes_leaked_blobs(
    cli: Cli, landing: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first file goes in on its own: the Spark engine runs a run's small files as
    # one job and commits them right after it, so within one run there is no moment
    # between the first file's commit and the big file's blobs.
    write_jsonl(landing, "1-small.jsonl", [{"key": -1, "offset": 0, "v": "first"}])
    cli.ingest(landing)
    big = [{"key": i, "offset": i, "v": f"value-{i:06d}"} for i in range(60_000)]
    write_jsonl(landing, "2-big.jsonl", big)
    write_jsonl(landing, "3-small.jsonl", [{"key": -1, "offset": 1, "v": "last"}])
    proc = cli.popen(*cli.ingest_args(landing))
    try:
        shard = _watch_shard(cli, monkeypatch)
        deadline = time.monotonic() + WATCH_TIMEOUT_S
        # Kill after the first file committed, once the big file's blobs are being
        # written but before its compare-and-append: unreferenced blobs exist.
        while True:
            assert proc.poll() is None, "the ingest finished before it could be killed"
            assert time.monotonic() < deadline
            if shard.upper >= 1 and _unreferenced(shard):
                break
            time.sleep(POLL_S)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    leaked = _unreferenced(shard)
    assert leaked
    # Readable at the last committed upper, and consistent.
    assert cli.inspect()["upper"] == 1
    assert cli.snapshot() == [{"key": -1, "offset": 0, "v": "first"}]
    assert cli.check().json()["ok"] is True
    # Re-running completes the work.
    cli.ingest(landing)
    assert cli.inspect()["upper"] == 3
    snap = cli.snapshot()
    assert len(snap) == 60_001 and {"key": -1, "offset": 1, "v": "last"} in snap
    # A plain gc (default grace) removes them at once: their keys name the killed
    # ingest process as their writer, and it is provably dead.
    first = cli.run("gc", "--shard", "s").json()
    assert first["leaked_blobs_deleted"] >= len(leaked)
    remaining = {m.key for m in shard.blob.list_keys(shard_prefix("s"))}
    assert not leaked & remaining
    assert not _unreferenced(shard)
    assert cli.check().json()["ok"] is True
    assert len(cli.snapshot()) == 60_001
