"""A retention by time must keep its window's start readable when an ingest commits
while maintenance or ``gc`` applies it (a review found the duration resolved to a count
from one read and applied to a later state, so each commit in between moved ``since``
one ts too far and an ``--as-of-time`` read at now - D failed with NotReadable).

The interleaving is deterministic: the other process's ingest runs from inside the
first resolution of the retention, i.e. between the read the transition works on and
its compare-and-set, which then loses and is retried against the new state.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.model import UpsertModel
from upsert_core.ingest import IngestRequest, ingest, maintenance
from upsert_core.ingest.maintenance import maintain
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.state import ShardState
from upsert_core.shard_table import ShardTable

from .helpers import write_jsonl

HOUR_MS = 3_600_000
WINDOW_S = 150 * 60  # 2.5 h


def _file(root: Path, model: UpsertModel, i: int) -> None:
    rows = [{"key": k, "offset": i, "v": f"{i}-{k}"} for k in range(i % 5, 40, 3)]
    write_jsonl(root, f"{i:04d}.jsonl", rows)
    model.apply(rows)


def _setup(tmp_path: Path):  # type: ignore[no-untyped-def]
    now = [1_700_000_000_000]
    consensus, blob = MemoryConsensus(), MemoryBlob()
    shard = Shard.open(consensus, blob, "s", clock_ms=lambda: now[0])
    other = Shard.open(consensus, blob, "s", clock_ms=lambda: now[0])  # another process
    model = UpsertModel("global")  # global scope: no checkpoint base holds since back
    request = IngestRequest(order_scope="global", buckets=2, maintain=False)
    for i in range(6):  # ts i committed at hour i
        _file(tmp_path, model, i)
        ingest(shard, str(tmp_path), request)
        now[0] += HOUR_MS
    # now = hour 6; window = hours 3.5 .. 6; an as-of-time read at hour 3.5 needs ts 3.
    shard.set_retention_for(WINDOW_S)
    assert shard.retention() == 3
    return now, shard, other, model, request


def _racing_retention(shard: Shard, other: Shard, tmp_path: Path, model: UpsertModel,
                      request: IngestRequest, now: list[int],
                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Let another writer commit one file (at the same instant: the clock does not even
    move) right after the retention is first resolved, before it is applied."""
    resolve = maintenance.retention_keep
    fired = []

    def racing(state: ShardState, now_ms: int) -> int | None:
        keep = resolve(state, now_ms)
        if not fired:
            fired.append(True)
            _file(tmp_path, model, 6)
            ingest(other, str(tmp_path), request)  # ts 6, committed at hour 6
        return keep

    monkeypatch.setattr(maintenance, "retention_keep", racing)


def _as_of_window_start(shard: Shard, now_ms: int) -> int:
    cutoff = datetime.fromtimestamp((now_ms - WINDOW_S * 1000) / 1000, UTC)
    return ShardTable(shard).snapshot(as_of_time=cutoff).num_rows


def test_maintenance_racing_an_ingest_keeps_the_start_of_the_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now, shard, other, model, request = _setup(tmp_path)
    _racing_retention(shard, other, tmp_path, model, request, now, monkeypatch)
    maintain(shard)
    state = shard.state()
    assert state.upper == 7
    # ts 3 answers an as-of-time read at hour 3.5, the window's start.
    assert state.since <= 3, f"since {state.since}: the window's first instant is gone"
    assert _as_of_window_start(shard, now[0]) == sum(model.rows(3).values())


def test_cli_gc_racing_an_ingest_keeps_the_start_of_the_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestration.cli import commands

    now, shard, other, model, request = _setup(tmp_path)
    _racing_retention(shard, other, tmp_path, model, request, now, monkeypatch)
    monkeypatch.setattr(commands, "open_shard", lambda args, **kw: shard)
    commands.cmd_gc(argparse.Namespace(retain=None, leak_grace=None))
    state = shard.state()
    assert state.upper == 7
    assert state.since <= 3, f"since {state.since}: the window's first instant is gone"
    assert _as_of_window_start(shard, now[0]) == sum(model.rows(3).values())
