"""The base cache's size bound between whole-cache scans (``ingest.base_cache``): the
tally of puts since the last scan counts every put, those a replay makes in a row and
applies the bound to once (``evict=False``, then ``evict()``) included, so one process
never takes the cache past its bound (only racing processes may, by what they wrote
in between)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

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
