"""The local base cache (``ingest.base_cache``): a fresh process maps a bucket's base
instead of decoding it, gets the same state, and a damaged, missing or unwritable cache
changes no result."""

from __future__ import annotations

import contextlib
import random
from pathlib import Path

import pyarrow as pa
import pytest

from upsert_core.errors import ConfigError
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.base_cache import KEEP_PER_BUCKET, BaseCache
from upsert_core.ingest.checkpoint import load_checkpoint
from upsert_core.ingest.engine import InProcessEngine
from upsert_core.ingest.shard_config import ShardIngestConfig
from upsert_core.persist.location.blob_local import LocalBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.shard import Shard

from .helpers import change_rows, memory_shard, snapshot_rows, write_jsonl

BUCKETS = 2
REQUEST = IngestRequest(order_scope="batch", buckets=BUCKETS, inline_threshold=0)


def _file(landing: Path, b: int, rng: random.Random) -> None:
    if b == 0:
        rows = [{"key": k, "offset": 0, "v": f"v{k}", "f": 0.5} for k in range(300)]
    else:
        rows = [
            {"key": rng.randrange(330), "offset": b * 100 + i, "__deleted": True}
            if rng.random() < 0.2 else
            {"key": rng.randrange(330), "offset": b * 100 + i, "v": f"w{b}.{i}",
             "f": rng.choice([0.5, -0.0, None, float("nan")])}
            for i in range(20)
        ]
    write_jsonl(landing, f"{b:03d}.jsonl", rows)


def _run(tmp: Path, batches: int, shard: Shard) -> list[tuple[object, object]]:
    """Ingest ``batches`` + 1 files one ingest each, each with a cold engine (as a fresh
    process would), and return every time's snapshot and changes."""
    rng = random.Random(5)
    landing = tmp / "landing"
    landing.mkdir(parents=True)
    for b in range(batches + 1):
        _file(landing, b, rng)
        ingest(shard, str(landing), REQUEST, engine=InProcessEngine(cache=None))
    upper = shard.state().upper
    return [(snapshot_rows(shard, ts), change_rows(shard, ts)) for ts in range(upper)]


def _local_shard(tmp: Path) -> Shard:
    return Shard.open(MemoryConsensus(), LocalBlob(tmp / "blob"), "s")


def _entries(cache_dir: Path) -> list[Path]:
    return sorted(cache_dir.rglob("*.arrow"))


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cache"
    monkeypatch.setenv("UPSERT_CACHE_DIR", str(path))
    return path


def test_fresh_processes_read_bases_from_the_cache_and_get_the_same_shard(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hits: list[str] = []
    original = BaseCache.get

    def counting(self: BaseCache, bucket: int, key: str) -> pa.Table | None:
        table = original(self, bucket, key)
        if table is not None:
            hits.append(key)
        return table

    monkeypatch.setattr(BaseCache, "get", counting)
    cached = _run(tmp_path / "a", 8, _local_shard(tmp_path / "a"))
    assert hits, "no base was read from the cache"
    assert _entries(cache_dir)
    monkeypatch.setenv("UPSERT_BASE_CACHE", "0")
    hits.clear()
    uncached = _run(tmp_path / "b", 8, _local_shard(tmp_path / "b"))
    assert not hits
    assert cached == uncached
    assert cached == _run(tmp_path / "c", 8, memory_shard())  # memory stores: never cached


def _bucket_base(tmp: Path) -> tuple[Shard, int, str]:
    shard = _local_shard(tmp)
    _run(tmp, 1, shard)
    refs = ShardIngestConfig.read(shard.state().config).checkpoint_refs
    bucket, key = sorted(refs.items())[0]
    return shard, bucket, key


def _load(shard: Shard, bucket: int, key: str) -> object:
    from upsert_core.order_scope import OrderScope

    state = load_checkpoint(shard.blob, key, "s", bucket, BUCKETS, OrderScope.BATCH)
    return state.hi.tolist(), state.lo.tolist(), state.rows.materialize().to_pylist()


@pytest.mark.parametrize("damage", ["flip", "truncate", "trailer", "empty"])
def test_a_damaged_entry_is_dropped_and_the_blob_read(
    tmp_path: Path, cache_dir: Path, damage: str
) -> None:
    shard, bucket, key = _bucket_base(tmp_path)
    expected = _load(shard, bucket, key)  # fetched (or cached) once: an entry exists
    cache = BaseCache.for_blob(shard.blob, "s")
    assert cache is not None and cache.get(bucket, key) is not None
    (entry,) = [p for p in _entries(cache_dir) if p.parent.name == str(bucket)]
    data = bytearray(entry.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    elif damage == "truncate":
        del data[len(data) // 3:]
    elif damage == "trailer":
        data[-1] ^= 0x01
    else:
        data.clear()
    entry.write_bytes(bytes(data))
    assert cache.get(bucket, key) is None
    assert not entry.exists(), "a damaged entry must be deleted"
    assert _load(shard, bucket, key) == expected
    assert cache.get(bucket, key) is not None, "the blob read keeps a fresh entry"


def test_an_unusable_cache_directory_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    monkeypatch.setenv("UPSERT_CACHE_DIR", str(blocker))
    assert _run(tmp_path / "a", 4, _local_shard(tmp_path / "a")) == _run(
        tmp_path / "b", 4, memory_shard()
    )


def test_each_bucket_keeps_its_newest_entries_and_the_cache_its_size(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = BaseCache.for_blob(LocalBlob(tmp_path / "blob"), "s")
    assert cache is not None
    table = pa.table({"key": pa.array([b"k" * 16] * 1000), "diff": pa.array([1] * 1000)})
    for i in range(5):
        cache.put(0, f"base-{i}", table)
    assert [cache.get(0, f"base-{i}") is not None for i in range(5)] == (
        [False] * (5 - KEEP_PER_BUCKET) + [True] * KEEP_PER_BUCKET
    )
    size = _entries(cache_dir)[0].stat().st_size
    small = BaseCache(cache.root, limit_bytes=size * 3 - 1)  # room for two entries
    for bucket in range(1, 4):
        small.put(bucket, "base", table)
    assert len(_entries(cache_dir)) == 2
    assert small.get(3, "base") is not None, "the newest entry stays"


def test_cache_settings_are_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blob = LocalBlob(tmp_path / "blob")
    monkeypatch.setenv("UPSERT_BASE_CACHE", "maybe")
    with pytest.raises(ConfigError, match="UPSERT_BASE_CACHE='maybe'"):
        BaseCache.for_blob(blob, "s")
    monkeypatch.setenv("UPSERT_BASE_CACHE", "1")
    monkeypatch.setenv("UPSERT_BASE_CACHE_MB", "lots")
    with pytest.raises(ConfigError, match="UPSERT_BASE_CACHE_MB='lots'"):
        BaseCache.for_blob(blob, "s")
    monkeypatch.setenv("UPSERT_BASE_CACHE", "0")
    assert BaseCache.for_blob(blob, "s") is None


def test_a_cached_base_whose_blob_is_gone_is_not_used(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache never hides what the store lost: with the base's blob deleted, the
    next ingest fails or rebuilds exactly as without the cache, and ``check`` reads the
    store, not the copy."""
    from upsert_core.ingest.verify import compare_state

    shard, bucket, key = _bucket_base(tmp_path)
    cache = BaseCache.for_blob(shard.blob, "s")
    assert cache is not None and cache.get(bucket, key) is not None
    shard.blob.delete(key)
    assert cache.get(bucket, key) is not None, "the copy outlives the blob"
    compared = compare_state(shard)
    assert not compared.ok and any(key in p for p in compared.problems), compared.problems
    used: list[str] = []
    original = BaseCache.get

    def spy(self: BaseCache, b: int, k: str) -> pa.Table | None:
        table = original(self, b, k)
        if table is not None:
            used.append(k)
        return table

    monkeypatch.setattr(BaseCache, "get", spy)
    landing = tmp_path / "landing"
    write_jsonl(landing, "900.jsonl", [{"key": k, "offset": 9000 + k, "v": "z"} for k in range(40)])
    # Failing is as good as rebuilding; using the copy is not.
    with contextlib.suppress(Exception):
        ingest(shard, str(landing), REQUEST, engine=InProcessEngine(cache=None))
    assert key not in used, "the ingest used the local copy of a blob that is gone"


@pytest.mark.parametrize("kind", ["part base", "typed base"])
def test_check_verifies_the_stored_base_not_the_local_copy(
    tmp_path: Path, cache_dir: Path, kind: str
) -> None:
    from upsert_core.ingest.verify import compare_state
    from upsert_core.persist.keys import checkpoint_prefix

    shard = _local_shard(tmp_path)
    _run(tmp_path, 1 if kind == "part base" else 8, shard)
    refs = ShardIngestConfig.read(shard.state().config).checkpoint_refs
    typed = [(b, k) for b, k in refs.items() if k.startswith(checkpoint_prefix("s"))]
    bucket, key = sorted(typed if kind == "typed base" else set(refs.items()) - set(typed))[0]
    _load(shard, bucket, key)  # an ingest of a fresh process would keep the copy
    cache = BaseCache.for_blob(shard.blob, "s")
    assert cache is not None and cache.get(bucket, key) is not None
    assert compare_state(shard).ok
    stored = shard.blob.root / key  # type: ignore[attr-defined]
    data = bytearray(stored.read_bytes())
    for at in range(len(data) // 4, len(data) // 2, 97):  # the same size, other bytes
        data[at] ^= 0x5A
    stored.write_bytes(bytes(data))
    assert not compare_state(shard).ok, "check passed on a damaged base it never read"


def test_an_s3_store_is_cached_by_its_bucket_prefix_and_endpoint(
    tmp_path: Path, cache_dir: Path, s3_bucket: str, s3_endpoint: str
) -> None:
    """On the moto S3 server: a fresh engine's batch reads its bases from the cache,
    gives the shard a memory-store run gives, and another prefix is another cache."""
    from tests.services import AWS_TEST_CREDENTIALS
    from upsert_core.persist.location.blob_s3 import S3Blob

    def s3_shard(prefix: str) -> Shard:
        blob = S3Blob(s3_bucket, prefix, s3_endpoint, **AWS_TEST_CREDENTIALS)
        return Shard.open(MemoryConsensus(), blob, "s")

    shard = s3_shard("one")
    one, other = (BaseCache.for_blob(s3_shard(p).blob, "s") for p in ("one", "two"))
    assert one is not None and other is not None and one.root != other.root
    assert _run(tmp_path / "a", 4, shard) == _run(tmp_path / "b", 4, memory_shard())
    assert any(p.is_relative_to(one.root) for p in _entries(cache_dir))


def test_an_entry_under_another_bases_name_is_not_taken_for_it(
    tmp_path: Path, cache_dir: Path
) -> None:
    """Each entry records which bucket and blob key it copies: an intact entry copied
    (or renamed) to another base's name, with the same layout, is dropped, not read."""
    shard, bucket, key = _bucket_base(tmp_path)
    cache = BaseCache.for_blob(shard.blob, "s")
    assert cache is not None and cache.get(bucket, key) is not None
    (entry,) = [p for p in _entries(cache_dir) if p.parent.name == str(bucket)]
    other = cache._path(bucket, key + ".other")
    other.write_bytes(entry.read_bytes())
    assert cache.get(bucket, key + ".other") is None
    assert not other.exists()
    assert cache.get(bucket, key) is not None
