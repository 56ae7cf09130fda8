"""A writer keeps this machine's copy of each base it stores (``ingest.base_cache``):
the first file's part bases and every later typed base are in the cache as soon as
they are written, each exactly what a Parquet read of the blob gives, so the next
process maps them instead of fetching and decoding them, with the same results."""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest import checkpoint as checkpoint_module
from upsert_core.ingest.base_cache import BaseCache
from upsert_core.ingest.checkpoint import is_part_base
from upsert_core.ingest.engine import InProcessEngine
from upsert_core.ingest.shard_config import ShardIngestConfig
from upsert_core.persist.keys import checkpoint_prefix
from upsert_core.persist.location.blob_local import LocalBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.shard import Shard
from upsert_core.persist.write.parts import VALUE_PREFIX

from .helpers import change_rows, snapshot_rows, write_parquet

BUCKETS = 3
REQUEST = IngestRequest(order_scope="batch", buckets=BUCKETS, inline_threshold=0)
UTC = dt.timezone.utc


def _rows(keys: list[int], offset: int, rng: random.Random) -> pa.Table:
    n = len(keys)
    return pa.table({
        "key": pa.array(keys, pa.int64()),
        "offset": pa.array([offset + i for i in range(n)], pa.int64()),
        "s": pa.array([rng.choice(["a", "", None, "ü" * rng.randrange(1, 9)])
                       for _ in range(n)]),
        "f": pa.array([rng.choice([0.5, -0.0, None, float("nan"), 1e300]) for _ in range(n)]),
        "b": pa.array([rng.choice([True, False, None]) for _ in range(n)]),
        "t": pa.array([rng.choice([None, dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)])
                       for _ in range(n)], pa.timestamp("us", tz="UTC")),
        "d": pa.array([rng.choice([None, dt.date(1970, 1, 1), dt.date(2999, 12, 31)])
                       for _ in range(n)], pa.date32()),
        "raw": pa.array([rng.choice([None, b"", b"\x00\xff"]) for _ in range(n)], pa.binary()),
    })


def _write_files(landing: Path, batches: int) -> None:
    rng = random.Random(11)
    write_parquet(landing, "000.parquet", _rows(list(range(400)), 0, rng))
    for b in range(1, batches + 1):
        keys = [rng.randrange(450) for _ in range(150)]
        write_parquet(landing, f"{b:03d}.parquet", _rows(keys, b * 1000, rng))


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cache"
    monkeypatch.setenv("UPSERT_CACHE_DIR", str(path))
    return path


def _refs(shard: Shard) -> dict[int, str]:
    return dict(ShardIngestConfig.read(shard.state().config).checkpoint_refs)


def _exact(table: pa.Table) -> dict[str, list[str]]:
    """Every value as its repr (so NaN equals NaN and -0.0 differs from 0.0)."""
    return {name: [repr(v) for v in table.column(name).to_pylist()]
            for name in table.column_names}


def _rows_text(rows: Counter[object]) -> list[str]:
    """Rows and counts as text (NaN in a row is not equal to itself)."""
    return sorted(repr(item) for item in rows.items())


def _assert_copies_equal_the_blobs(shard: Shard) -> list[str]:
    cache = BaseCache.for_blob(shard.blob, shard.shard_id)
    assert cache is not None
    refs = _refs(shard)
    assert set(refs) == set(range(BUCKETS))
    for bucket, ref in refs.items():
        copy = cache.get(bucket, ref)
        assert copy is not None, f"bucket {bucket}: no copy of {ref}"
        stored = pq.ParquetFile(pa.py_buffer(shard.blob.get(ref)))
        names = [n for n in stored.schema_arrow.names if n.startswith(VALUE_PREFIX)]
        read = stored.read(columns=["key", "diff", *names])
        assert copy.schema.equals(read.schema, check_metadata=True)
        assert _exact(copy) == _exact(read)
    return list(refs.values())


def test_the_first_file_and_each_new_base_leave_their_copies(
    tmp_path: Path, cache_dir: Path
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    _write_files(landing, 0)
    shard = Shard.open(MemoryConsensus(), LocalBlob(tmp_path / "blob"), "s")
    ingest(shard, str(landing), REQUEST, engine=InProcessEngine(cache=None))
    refs = _assert_copies_equal_the_blobs(shard)
    assert all(is_part_base(ref, shard.shard_id) for ref in refs)

    _write_files(landing, 4)  # 150 of ~400 keys a batch: each folds into a new base
    typed: set[str] = set()
    for _ in range(4):
        ingest(shard, str(landing), REQUEST, engine=InProcessEngine(cache=None))
        refs = _assert_copies_equal_the_blobs(shard)
        typed |= {r for r in refs if r.startswith(checkpoint_prefix(shard.shard_id))}
    assert typed, "no batch wrote a typed base"


def test_a_fresh_process_after_a_new_base_never_decodes_it(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    _write_files(landing, 3)
    shard = Shard.open(MemoryConsensus(), LocalBlob(tmp_path / "blob"), "s")
    ingest(shard, str(landing), REQUEST, engine=InProcessEngine(cache=None))
    write_parquet(landing, "004.parquet", _rows(list(range(0, 450, 7)), 9000,
                                                random.Random(3)))
    fetched: list[str] = []
    original = checkpoint_module._fetch_checkpoint

    def counting(blob, key, *args, **kwargs):  # type: ignore[no-untyped-def]
        fetched.append(key)
        return original(blob, key, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module, "_fetch_checkpoint", counting)
    ingest(shard, str(landing), REQUEST, engine=InProcessEngine(cache=None))
    assert fetched == []

    # The same files without any cache give the same shard, time by time.
    monkeypatch.setenv("UPSERT_BASE_CACHE", "0")
    theirs = Shard.open(MemoryConsensus(), LocalBlob(tmp_path / "blob2"), "s")
    ingest(theirs, str(landing), REQUEST, engine=InProcessEngine(cache=None))
    upper = shard.state().upper
    assert theirs.state().upper == upper
    for ts in range(upper):
        for rows in (snapshot_rows, change_rows):
            assert _rows_text(rows(shard, ts)) == _rows_text(rows(theirs, ts))
