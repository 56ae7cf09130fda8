"""Retention by time, single-threaded: an as-of-time read at any instant of the window
(now - D .. now) that resolved before maintenance/gc still resolves to the same ts,
with the same rows, after them. Random commit clocks (steps forward, equal times,
clocks going backwards), random D, batch and global scope, an old shard whose first
ts have no recorded commit time, since already moved by a count.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.model import UpsertModel
from upsert_core.errors import NotReadable
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.maintenance import maintain, retained
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.commit_times import resolve_as_of_time
from upsert_core.persist.state.state import COMMIT_TIME_PREFIX
from upsert_core.shard_table import ShardTable

from .helpers import write_jsonl

MIN_MS = 60_000


def _file(root: Path, model: UpsertModel, i: int) -> None:
    rows = [{"key": k, "offset": i, "v": f"{i}-{k}"} for k in range(i % 5, 30, 3)]
    rows.append({"key": i % 7, "offset": i, "__deleted": True})
    write_jsonl(root, f"{i:04d}.jsonl", rows)
    model.apply(rows)


def _instants(state, now_ms: int, window_ms: int) -> list[int]:  # type: ignore[no-untyped-def]
    """Microsecond instants in [now - D, now]: the bounds and each commit time +-1 ms."""
    lo, hi = (now_ms - window_ms) * 1000, now_ms * 1000
    out = {lo, hi, lo + 1, hi - 1}
    for _, ms in state.commit_times():
        for d in (-1, 0, 1):
            us = (ms + d) * 1000
            if lo <= us <= hi:
                out.add(us)
    return sorted(out)


def _resolved(state, instants: list[int]) -> dict[int, int]:  # type: ignore[no-untyped-def]
    out = {}
    for us in instants:
        try:
            ts = resolve_as_of_time(state, us)
        except NotReadable:
            continue
        if ts >= state.since:
            out[us] = ts
    return out


@pytest.mark.parametrize("scope", ["batch", "global"])
@pytest.mark.parametrize("seed", range(8))
def test_every_instant_of_the_window_stays_readable(tmp_path: Path, scope: str,
                                                     seed: int) -> None:
    rnd = random.Random(seed * 7919 + (scope == "global"))
    now = [1_700_000_000_000]
    shard = Shard.open(MemoryConsensus(), MemoryBlob(), "s", clock_ms=lambda: now[0])
    model = UpsertModel(scope)
    request = IngestRequest(order_scope=scope, buckets=2, maintain=False)
    files = rnd.randint(4, 14)
    for i in range(files):
        _file(tmp_path, model, i)
        ingest(shard, str(tmp_path), request)
        now[0] += rnd.choice([0, 1, MIN_MS, 7 * MIN_MS, 60 * MIN_MS, -30 * MIN_MS])
    if rnd.random() < 0.4:  # an old shard: its first ts were committed before times
        drop = rnd.randint(1, files - 1)
        shard.machine.apply(lambda s: s.evolve(config={
            k: v for k, v in s.config.items()
            if not (k.startswith(COMMIT_TIME_PREFIX) and int(k[len(COMMIT_TIME_PREFIX):]) < drop)
        }))
    if rnd.random() < 0.3:  # since already moved by a count
        shard.gc(retain=rnd.randint(1, files), leak_grace_ms=0)
    window_ms = rnd.choice([1, MIN_MS, 30 * MIN_MS, 90 * MIN_MS, 400 * MIN_MS])
    assert window_ms % 1000 == 0 or window_ms == 1
    window_s = max(1, window_ms // 1000)
    window_ms = window_s * 1000
    shard.set_retention_for(window_s)
    # One more ingest, then the maintenance an ingest runs after its commits (applies the
    # duration), then gc as upsertctl does.
    _file(tmp_path, model, files)
    ingest(shard, str(tmp_path), request)
    before = shard.state()
    instants = _instants(before, now[0], window_ms)
    expected = _resolved(before, instants)
    maintain(shard)
    keep = shard.retention()
    shard.gc(None if keep is None else retained(shard.state(), keep), leak_grace_ms=0)

    after = shard.state()
    table = ShardTable(shard)
    for us, ts in expected.items():
        when = datetime.fromtimestamp(us // 1_000_000, UTC).replace(microsecond=us % 1_000_000)
        got = resolve_as_of_time(after, us)
        assert got == ts, (seed, us, ts, got, after.since)
        assert table.snapshot(as_of_time=when).num_rows == sum(model.rows(ts).values())
    assert shard.check().ok
