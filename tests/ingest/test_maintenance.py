"""Maintenance after an ingest (``ingest.maintenance``) and the stored retention
(``persist.maintenance.retention``): the number of batches stays bounded and history beyond the
retention is folded, without anyone running ``gc``, and every read stays the model's."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.model import UpsertModel
from upsert_core.errors import CorruptData, InvalidUsage
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.maintenance import (
    AUTO_COMPACT_BATCHES,
    auto_maintenance_from_env,
    replay_floor,
)
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.maintenance.retention import RETENTION_KEEP, RETENTION_KEEP_FOR
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.state import COMMIT_TIME_PREFIX
from upsert_core.persist.testing import unreferenced_blobs
from upsert_core.shard_table import ShardTable

from .helpers import change_rows, memory_shard, snapshot_rows, write_jsonl


def _files(root: Path, model: UpsertModel, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        rows = [{"key": k, "offset": i, "v": f"{i}-{k}"} for k in range(i % 5, 40, 3)]
        rows.append({"key": i % 7, "offset": i, "__deleted": True})
        write_jsonl(root, f"{i:04d}.jsonl", rows)
        model.apply(rows)


def _matches(shard: object, model: UpsertModel) -> None:
    state = shard.state()  # type: ignore[attr-defined]
    assert state.upper == model.upper
    for ts in range(state.since, state.upper):
        assert snapshot_rows(shard, ts) == model.rows(ts), f"snapshot at {ts}"  # type: ignore[arg-type]
        if ts > state.since:
            assert change_rows(shard, ts) == model.row_changes(ts), f"changes at {ts}"  # type: ignore[arg-type]
    assert shard.check().ok  # type: ignore[attr-defined]


@pytest.mark.parametrize("scope", ["batch", "global"])
def test_ingests_keep_the_number_of_batches_bounded_without_gc(
    tmp_path: Path, scope: str
) -> None:
    shard = memory_shard()
    model = UpsertModel(scope)
    request = IngestRequest(order_scope=scope, buckets=2, inline_threshold=0)
    most = 0
    for i in range(40):  # one file per run, as a sensor or a cron job would
        _files(tmp_path, model, 1, start=i)
        report = ingest(shard, str(tmp_path), request)
        most = max(most, len(shard.state().batches))
        assert report.maintenance is not None
    assert most <= AUTO_COMPACT_BATCHES
    assert shard.state().since == 0  # no retention stored: all history stays readable
    _matches(shard, model)
    shard.gc(leak_grace_ms=0)
    assert unreferenced_blobs(shard) == set()


def test_without_maintenance_nothing_is_compacted(tmp_path: Path) -> None:
    shard = memory_shard()
    model = UpsertModel("batch")
    for i in range(AUTO_COMPACT_BATCHES + 3):
        _files(tmp_path, model, 1, start=i)
        report = ingest(shard, str(tmp_path), IngestRequest(maintain=False))
        assert report.maintenance is None
    assert len(shard.state().batches) == AUTO_COMPACT_BATCHES + 3


@pytest.mark.parametrize("scope", ["batch", "global"])
def test_a_stored_retention_is_applied_after_each_ingest(tmp_path: Path, scope: str) -> None:
    shard = memory_shard()
    model = UpsertModel(scope)
    request = IngestRequest(order_scope=scope, buckets=2)
    _files(tmp_path, model, 3)
    ingest(shard, str(tmp_path), request)
    assert shard.set_retention(2) == 2 and shard.retention() == 2
    for i in range(3, 20):
        _files(tmp_path, model, 1, start=i)
        ingest(shard, str(tmp_path), request)
        state = shard.state()
        # The retention is a floor; a checkpoint base behind the upper may hold since
        # back (batch scope), never further than the base needs.
        assert state.since <= state.upper - 2
        assert state.since == min(state.upper - 2, replay_floor(state)) or state.since == 0
    if scope == "global":  # bases are always current: nothing holds since back
        assert shard.state().since == shard.state().upper - 2
    assert shard.state().since > 0
    _matches(shard, model)
    assert shard.inspect()["retention"] == 2
    # The commit times of ts below since went with them (kept: since .. upper - 1).
    state = shard.state()
    kept = sorted(int(n[len(COMMIT_TIME_PREFIX):]) for n in state.config
                  if n.startswith(COMMIT_TIME_PREFIX))
    assert kept == list(range(state.since, state.upper))
    shard.set_retention(None)
    assert shard.retention() is None and RETENTION_KEEP not in shard.state().config


def test_retention_values_are_checked_where_set_and_where_read() -> None:
    shard = memory_shard()
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(InvalidUsage, match="retention must be an integer >= 1"):
            shard.set_retention(bad)  # type: ignore[arg-type]
    shard.machine.apply(lambda s: s.evolve(config={**s.config, RETENTION_KEEP: "two"}))
    with pytest.raises(CorruptData, match="retention.keep='two'"):
        shard.retention()


def test_the_maintenance_switch_reads_its_setting() -> None:
    assert auto_maintenance_from_env({}) is True
    assert auto_maintenance_from_env({"UPSERT_AUTO_MAINTENANCE": "0"}) is False
    with pytest.raises(Exception, match="UPSERT_AUTO_MAINTENANCE"):
        auto_maintenance_from_env({"UPSERT_AUTO_MAINTENANCE": "sometimes"})


@pytest.mark.parametrize("scope", ["batch", "global"])
def test_an_idle_bucket_does_not_hold_the_retention_back(tmp_path: Path, scope: str) -> None:
    # Review: a bucket that got no rows kept its old checkpoint base, and since stayed
    # below it for good (in the global scope, whose bases are never replayed, for nothing).
    shard = memory_shard()
    model = UpsertModel(scope)
    request = IngestRequest(order_scope=scope, buckets=4)
    rows = [{"key": k, "offset": 1, "v": "a"} for k in range(20)]
    write_jsonl(tmp_path, "0000.jsonl", rows)
    model.apply(rows)
    ingest(shard, str(tmp_path), request)
    shard.set_retention(1)
    for i in range(1, 70):  # one key: one bucket busy, the others idle
        one = [{"key": 1, "offset": i + 1, "v": f"v{i}"}]
        write_jsonl(tmp_path, f"{i:04d}.jsonl", one)
        model.apply(one)
        ingest(shard, str(tmp_path), request)
    state = shard.state()
    if scope == "global":
        assert state.since == state.upper - 1
    else:  # held back at most MAX_REPLAY_BATCHES behind the upper
        assert state.since >= state.upper - 65
    _matches(shard, model)


def test_a_bad_maintenance_setting_fails_before_anything_is_ingested(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shard = memory_shard()
    write_jsonl(tmp_path, "0000.jsonl", [{"key": 1, "offset": 1}])
    monkeypatch.setenv("UPSERT_AUTO_MAINTENANCE", "sometimes")
    with pytest.raises(Exception, match="UPSERT_AUTO_MAINTENANCE"):
        ingest(shard, str(tmp_path), IngestRequest())
    assert shard.state().upper == 0


HOUR_MS = 3_600_000


def test_a_retention_by_time_keeps_what_an_as_of_time_read_needs(tmp_path: Path) -> None:
    now = [1_700_000_000_000]
    shard = Shard.open(MemoryConsensus(), MemoryBlob(), "s", clock_ms=lambda: now[0])
    model = UpsertModel("global")  # bases are always current: nothing holds since back
    request = IngestRequest(order_scope="global", buckets=2)
    for i in range(6):  # ts i committed at hour i
        _files(tmp_path, model, 1, start=i)
        ingest(shard, str(tmp_path), request)
        now[0] += HOUR_MS
    # At hour 6, the last 2.5 hours hold ts 4 and 5; an as-of-time read at hour 3.5
    # needs ts 3, committed before them: 3 times stay readable.
    assert shard.set_retention_for(150 * 60) == 9000
    assert shard.retention() == 3 and shard.retention_for() == 9000
    assert shard.inspect()["retention_keep_for"] == "150m"
    assert shard.state().since == 0, "storing a retention moves nothing by itself"
    _files(tmp_path, model, 1, start=6)
    ingest(shard, str(tmp_path), request)  # ts 6, at hour 6: maintenance applies it
    state = shard.state()
    assert state.since == 3 and state.upper == 7
    cutoff = now[0] - 150 * 60 * 1000
    assert ShardTable(shard).snapshot(
        as_of_time=datetime.fromtimestamp(cutoff / 1000, UTC)
    ).num_rows == sum(model.rows(3).values())
    _matches(shard, model)
    now[0] += 100 * HOUR_MS  # long idle: still the newest ts stays
    assert shard.retention() == 1
    shard.set_retention(2)  # a count replaces the duration
    assert shard.retention() == 2 and RETENTION_KEEP_FOR not in shard.state().config
    shard.machine.apply(lambda s: s.evolve(config={**s.config, RETENTION_KEEP_FOR: "7d"}))
    with pytest.raises(CorruptData, match="retention.keep_for_s='7d'"):
        shard.retention()
