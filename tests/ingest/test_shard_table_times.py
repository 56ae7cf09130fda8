"""``open_shard(...)`` reads by commit time: ``as_of_time``, ``since_time`` and
``until_time`` (a ``datetime`` or ISO-8601 text) mirror ``as_of``, ``since`` and
``until``; the ingest's commits record the times they use."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

import upsert_core
from upsert_core.errors import InvalidUsage, NotReadable
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.persist.shard import Shard
from upsert_core.stores import open_stores, resolve

from .helpers import write_jsonl

UTC = dt.UTC
T0 = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def _ms(moment: dt.datetime) -> int:
    return int(moment.timestamp() * 1000)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("UPSERT_CONSENSUS_URL", "UPSERT_BLOB_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("UPSERT_HOME", str(tmp_path / "home"))
    return tmp_path


def _ingest_at(home: Path, moments: list[dt.datetime]) -> None:
    """One ingest per moment, each committing one file with the clock at that moment."""
    landing = home / "landing"
    landing.mkdir(exist_ok=True)
    consensus, blob = open_stores(resolve(None, None))
    now = [0]
    shard = Shard.open(consensus, blob, "t", clock_ms=lambda: now[0])
    for i, moment in enumerate(moments):
        write_jsonl(landing, f"{i:03d}.jsonl", [{"key": i % 2, "offset": i, "v": f"v{i}"}])
        now[0] = _ms(moment)
        ingest(shard, str(landing), IngestRequest())
    assert shard.upper == len(moments)


def test_reads_by_time_equal_reads_by_the_ts_it_stands_for(home: Path) -> None:
    minute = dt.timedelta(minutes=1)
    _ingest_at(home, [T0, T0 + minute, T0 + 2 * minute])
    table = upsert_core.open_shard("t")
    info = table.inspect()
    assert info["since_time"] == "2026-03-01T12:00:00.000+00:00"
    assert info["last_commit_time"] == "2026-03-01T12:02:00.000+00:00"
    for moment, ts in ((T0, 0), (T0 + minute - dt.timedelta(microseconds=1), 0),
                       (T0 + 90 * dt.timedelta(seconds=1), 1), (T0 + 10 * minute, 2)):
        assert table.snapshot(as_of_time=moment) == table.snapshot(ts)
        assert table.to_batches(as_of_time=moment.isoformat()).read_all() == table.snapshot(ts)
    naive = (T0 + minute).replace(tzinfo=None)  # no zone: UTC
    assert table.snapshot(as_of_time=naive) == table.snapshot(1)
    assert table.changes(since_time=T0 + minute) == table.changes(1)
    assert table.changes(since_time="2026-03-01T12:00:30Z") == table.changes(1)
    assert table.changes(until_time=T0 + 2 * minute) == table.changes(until=2)
    assert table.changes(since_time=T0 + 30 * minute).num_rows == 0  # none after: upper
    assert table.changes(since=1, until_time=T0 + 30 * minute) == table.changes(1, 3)


def test_refusals_mirror_the_ts_arguments(home: Path) -> None:
    _ingest_at(home, [T0, T0 + dt.timedelta(seconds=1)])
    table = upsert_core.open_shard("t")
    with pytest.raises(NotReadable, match="readable commit times are 2026-03-01T12:00:00.000"):
        table.snapshot(as_of_time=T0 - dt.timedelta(microseconds=1))
    with pytest.raises(NotReadable, match="readable commit times"):
        table.changes(since_time="2026-03-01T11:59:59")
    with pytest.raises(InvalidUsage, match="as_of or as_of_time, not both"):
        table.snapshot(0, as_of_time=T0)
    with pytest.raises(InvalidUsage, match="since or since_time, not both"):
        table.changes(0, since_time=T0)
    with pytest.raises(InvalidUsage, match="until or until_time, not both"):
        table.changes(until=1, until_time=T0)
    with pytest.raises(InvalidUsage, match="as_of_time must be an ISO-8601 time"):
        table.snapshot(as_of_time="noon")
    with pytest.raises(InvalidUsage, match="since_time must be a datetime"):
        table.changes(since_time=1_700_000_000)  # type: ignore[arg-type]
