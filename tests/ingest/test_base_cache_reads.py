"""Typed snapshots read a bucket's base from this machine's decoded copy
(``ingest.base_cache``) when the ingest kept one: the same rows as reading the blob, at
every readable time, and a copy that is damaged, of another layout or whose blob is
gone is never used."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from upsert_core.errors import CorruptData
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.base_cache import BaseCache
from upsert_core.ingest.checkpoint import load_checkpoint
from upsert_core.ingest.engine import InProcessEngine
from upsert_core.order_scope import OrderScope
from upsert_core.persist.location.blob_local import LocalBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.state import BlobPart
from upsert_core.persist.write.parts import LoadedPart, OpenPart
from upsert_core.shard_table import ShardTable, typed_bases

from .helpers import write_jsonl

BUCKETS = 2
REQUEST = IngestRequest(order_scope="batch", buckets=BUCKETS, inline_threshold=0)


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cache"
    monkeypatch.setenv("UPSERT_CACHE_DIR", str(path))
    return path


def _history(tmp: Path, batches: int, seed: int) -> Shard:
    """A batch-scope shard of ``batches`` + 1 files, one cold ingest each (as fresh
    processes), so its buckets have bases and the cache holds copies of them."""
    rng = random.Random(seed)
    shard = Shard.open(MemoryConsensus(), LocalBlob(tmp / "blob"), "s")
    landing = tmp / "landing"
    landing.mkdir(parents=True)
    for b in range(batches + 1):
        if b == 0:
            rows = [{"key": k, "offset": 0, "v": f"v{k}", "f": 0.5} for k in range(200)]
        else:
            rows = [
                {"key": rng.randrange(230), "offset": b * 100 + i, "__deleted": True}
                if rng.random() < 0.2 else
                {"key": rng.randrange(230), "offset": b * 100 + i, "v": f"w{b}.{i}",
                 "f": rng.choice([0.5, -0.0, None, float("nan"), 1e300])}
                for i in range(rng.randrange(1, 40))
            ]
        write_jsonl(landing, f"{b:03d}.jsonl", rows)
        ingest(shard, str(landing), REQUEST, engine=InProcessEngine(cache=None))
    for bucket, base in typed_bases(shard.state()).items():
        # The next ingest of a fresh process would load (and so keep a copy of) each base.
        load_checkpoint(shard.blob, base.key, "s", bucket, BUCKETS, OrderScope.BATCH)
    return shard


def _rows(table: pa.Table) -> Counter[tuple[object, ...]]:
    """The snapshot as a multiset of rows (NaN as a string so that NaN equals NaN, and
    -0.0 apart from 0.0)."""
    def norm(v: object) -> object:
        if isinstance(v, float):
            return repr(v)
        return v
    return Counter(tuple(norm(v) for v in r.values()) for r in table.to_pylist())


def _snapshots(shard: Shard) -> list[Counter[tuple[object, ...]]]:
    table = ShardTable(shard)
    state = shard.state()
    return [_rows(table.snapshot(ts)) for ts in range(state.since, state.upper)]


def _count_loaded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Where each :class:`LoadedPart` made from now on came from (its ``where``)."""
    made: list[str] = []
    original = LoadedPart.__init__

    def counting(self: LoadedPart, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        made.append(self.where)

    monkeypatch.setattr(LoadedPart, "__init__", counting)
    return made


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_reads_through_the_copies_equal_reads_of_the_blobs(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    shard = _history(tmp_path, 12, seed)
    assert typed_bases(shard.state()), "the history left no bases to read"
    made = _count_loaded(monkeypatch)
    with_copies = _snapshots(shard)
    assert made, "no read used a local copy of a base"
    monkeypatch.setenv("UPSERT_BASE_CACHE", "0")
    made.clear()
    assert _snapshots(shard) == with_copies
    assert not made


def test_a_copy_whose_blob_is_gone_or_resized_is_not_used(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shard = _history(tmp_path, 12, 4)
    state = shard.state()
    bases = typed_bases(state)
    loader = ShardTable(shard)._base_copies(state)
    assert loader is not None
    bucket, base = sorted(bases.items())[0]
    assert loader(bucket, base) is not None
    stored = Path(shard.blob.root) / base.key  # type: ignore[attr-defined]
    data = stored.read_bytes()
    stored.write_bytes(data + b"\0")  # another size: not the blob that was committed
    assert loader(bucket, base) is None
    stored.unlink()
    assert loader(bucket, base) is None
    made = _count_loaded(monkeypatch)
    # The read goes on as if the copy did not exist: it reports the lost base or reads
    # without it, but never answers from the copy.
    try:
        ShardTable(shard).snapshot()
    except CorruptData:
        pass
    assert not [where for where in made if base.key in where]


def test_a_copy_of_another_layout_or_row_count_is_read_from_the_blob(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shard = _history(tmp_path, 12, 5)
    expected = _rows(ShardTable(shard).snapshot())
    state = shard.state()
    cache = BaseCache.for_blob(shard.blob, state.shard_id)
    assert cache is not None
    copies = {b: cache.get(b, base.key) for b, base in typed_bases(state).items()}
    assert all(copy is not None for copy in copies.values())
    for bucket, copy in copies.items():
        cache.put(bucket, typed_bases(state)[bucket].key, copy.slice(1))  # one row short
    made = _count_loaded(monkeypatch)
    assert _rows(ShardTable(shard).snapshot()) == expected
    assert not made
    for bucket, copy in copies.items():
        cache.put(bucket, typed_bases(state)[bucket].key, copy.replace_schema_metadata({}))
    assert _rows(ShardTable(shard).snapshot()) == expected
    assert not made


def test_a_loaded_part_reads_as_the_blob_does(tmp_path: Path, cache_dir: Path) -> None:
    shard = _history(tmp_path, 12, 6)
    state = shard.state()
    cache = BaseCache.for_blob(shard.blob, state.shard_id)
    assert cache is not None
    bucket, base = sorted(typed_bases(state).items())[0]
    copy = cache.get(bucket, base.key)
    assert copy is not None
    loaded = LoadedPart(copy, where="copy", rows=base.rows, ts=base.upper - 1)
    opened = OpenPart(shard.blob, BlobPart(base.key, base.size, base.rows), shard="s")
    try:
        assert loaded.layout == opened.layout
        columns = ["key", "row", "diff", *(n for n in copy.column_names if n.startswith("v:"))]
        assert loaded.read_whole(columns).equals(opened.read_whole(columns))
        ts = loaded.read_whole(["ts"]).column("ts").to_pylist()
        assert ts == [base.upper - 1] * base.rows
    finally:
        opened.close()
    with pytest.raises(CorruptData, match="local copy"):
        LoadedPart(copy, where="copy", rows=base.rows + 1, ts=0)
    with pytest.raises(CorruptData, match="local copy"):
        LoadedPart(copy.drop_columns(["diff"]), where="copy", rows=base.rows, ts=0)
