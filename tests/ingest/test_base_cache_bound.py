"""The base cache's size bound between whole-cache scans (``ingest.base_cache``): the
tally of puts since the last scan counts every put, those a replay makes in a row and
applies the bound to once (``evict=False``, then ``evict()``) included, so one process
never takes the cache past its bound (only racing processes may, by what they wrote
in between)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pytest

from upsert_core.ingest.base_cache import PARTS, BaseCache


def _entries_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*.arrow"))


def _table(seed: int) -> pa.Table:
    return pa.table({"key": pa.array([bytes([seed % 256]) * 16] * 20000),
                     "diff": pa.array([1] * 20000)})


def test_puts_applied_once_at_the_end_count_towards_the_bound(tmp_path: Path) -> None:
    probe = BaseCache(tmp_path / "probe" / "shard", limit_bytes=1 << 40)
    probe.put(0, "base", _table(0))
    entry = _entries_bytes(tmp_path / "probe")
    limit = entry * 4 + entry // 2  # room for four entries
    cache = BaseCache(tmp_path / "bases" / "shard", limit_bytes=limit)
    cache.put(0, "base", _table(0))  # a scan: the tally now holds one entry
    for i in range(12):  # a replay's part copies, the bound applied after them
        cache.put(PARTS, f"part-{i}", _table(i), evict=False)
    cache.evict()
    assert _entries_bytes(tmp_path / "bases") <= limit
    for i in range(12, 24):  # and again, within the same minute
        cache.put(PARTS, f"part-{i}", _table(i), evict=False)
    cache.evict()
    assert _entries_bytes(tmp_path / "bases") <= limit
    assert cache.get(PARTS, "part-23") is not None, "the newest copies stay"


def _overfilled(tmp_path: Path) -> tuple[BaseCache, int]:
    """A cache with twelve entries written behind its tally's back (by a process killed
    before it applied the bound), and its bound: room for four entries."""
    root = tmp_path / "bases" / "shard"
    BaseCache(root, limit_bytes=1 << 40).put(0, "base", _table(0))
    entry = _entries_bytes(tmp_path / "bases")
    limit = entry * 4 + entry // 2
    killed = BaseCache(root, limit_bytes=limit)
    for i in range(12):
        killed.put(PARTS, f"part-{i}", _table(i), evict=False)
    return BaseCache(root, limit_bytes=limit), limit


@pytest.mark.parametrize("tally", ["-999999999999", "0"])
def test_a_tally_that_cannot_be_right_is_scanned_again(tmp_path: Path, tally: str) -> None:
    """A negative tally, or one timestamped in the future (a clock set back since, or a
    damaged file), would skip every scan: the time check never expires it, and a write
    of the tally keeps its time. It is taken for no tally at all."""
    cache, limit = _overfilled(tmp_path)
    path = tmp_path / "bases" / ".size"
    path.write_text(f"{tally}\n")
    if tally == "0":
        future = time.time() + 86400
        os.utime(path, (future, future))
    cache.put(1, "base", _table(99))
    assert _entries_bytes(tmp_path / "bases") <= limit


def test_temporaries_a_killed_writer_left_are_removed_by_a_scan(tmp_path: Path) -> None:
    """A process killed between writing a temporary and renaming it leaves it behind:
    an entry's (two levels down) or the tally's (beside it); a scan removes both once
    they are older than any live writer's could be."""
    from upsert_core.ingest.base_cache import STALE_TEMPORARY_S

    cache, _ = _overfilled(tmp_path)
    bases = tmp_path / "bases"
    entry_tmp = bases / "shard" / "0" / ".base.arrow.1234.tmp"
    tally_tmp = bases / ".size.5678.tmp"
    fresh_tmp = bases / ".size.9999.tmp"
    for path in (entry_tmp, tally_tmp, fresh_tmp):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("partial")
    old = time.time() - STALE_TEMPORARY_S - 60
    for path in (entry_tmp, tally_tmp):
        os.utime(path, (old, old))
    (bases / ".size").unlink()  # no tally: the next put scans the cache
    cache.put(1, "base", _table(99))
    assert not entry_tmp.exists() and not tally_tmp.exists()
    assert fresh_tmp.exists()  # a writer may still be writing it
