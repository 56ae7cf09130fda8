"""Two ingesters racing on one shard (threads, each with its own handle on SQLite + local
files): every file is applied exactly once, error rows included, and the result equals a
single ingester's."""

from __future__ import annotations

import threading
from pathlib import Path

from upsert_core.errors import ConcurrentModification
from upsert_core.ingest import IngestReport, IngestRequest, ingest
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard
from upsert_core.persist.testing import unreferenced_blobs

from .helpers import contents, memory_shard, write_jsonl

FILES = 8


def _landing(root: Path) -> None:
    for i in range(FILES):
        rows: list[object] = [
            {"key": (i * 3 + j) % 5, "offset": i, "v": f"{i}-{j}"} for j in range(4)
        ]
        rows.append({"key": None, "offset": i})  # one row error per file
        write_jsonl(root, f"{i:02d}.jsonl", rows)


def _open(tmp: Path) -> Shard:
    return Shard.open(
        open_consensus(f"sqlite:///{tmp}/consensus.db"), open_blob(f"file://{tmp}/blob"), "race"
    )


def test_racing_ingesters_apply_every_file_exactly_once(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    _landing(landing)
    _open(tmp_path)  # create the shard once
    reports: list[IngestReport] = []
    raised: list[BaseException] = []
    start = threading.Barrier(2)

    def run() -> None:
        shard = _open(tmp_path)
        start.wait()
        try:
            reports.append(ingest(shard, str(landing), IngestRequest(max_attempts=20)))
        except ConcurrentModification as exc:  # an allowed outcome for a loser
            assert "concurrently modified" in str(exc)
            raised.append(exc)
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            raised.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(e, ConcurrentModification) for e in raised), raised
    shard = _open(tmp_path)
    ingest(shard, str(landing), IngestRequest())  # completes whatever a loser left
    state = shard.state()
    assert state.upper == FILES
    assert sorted(state.ingested_files.values()) == list(range(FILES))
    committed = [f.name for r in reports for f in r.files]
    assert len(committed) == len(set(committed))  # no file committed by both
    errors = list(shard.errors())
    assert sorted((e["file"], e["row"]) for e in errors) == [
        (f"{i:02d}.jsonl", 5) for i in range(FILES)
    ]
    assert unreferenced_blobs(shard) == set()
    single = memory_shard("single")
    ingest(single, str(landing), IngestRequest())
    assert contents(shard) == contents(single)
