"""Replay maps the parts this machine replayed before from their local copies
(``ingest.base_cache``, directory ``parts``): the same state as decoding the blobs, and
a copy that is damaged, of another layout or whose blob is gone is never used."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest

import upsert_core.ingest.replay as replay
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.base_cache import PARTS, BaseCache
from upsert_core.ingest.engine import InProcessEngine
from upsert_core.persist.location.blob_local import LocalBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.read.read import unmerged_changes_by_part
from upsert_core.persist.shard import Shard

from .helpers import change_rows, snapshot_rows, write_jsonl

REQUEST = IngestRequest(order_scope="batch", buckets=2, inline_threshold=0)


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cache"
    monkeypatch.setenv("UPSERT_CACHE_DIR", str(path))
    return path


def _history(root: Path, seed: int, files: int = 8) -> tuple[Shard, list[object]]:
    """A shard whose buckets keep their first base while small files land (so every
    cold ingest replays them), one cold engine per file, and its reads at every ts."""
    rng = random.Random(seed)
    shard = Shard.open(MemoryConsensus(), LocalBlob(root / "blob"), "s")
    landing = root / "landing"
    landing.mkdir(parents=True)
    for b in range(files):
        if b == 0:
            rows = [{"key": k, "offset": 0, "v": f"v{k}", "f": 0.5} for k in range(300)]
        else:
            rows = [
                {"key": rng.randrange(320), "offset": b * 100 + i, "__deleted": True}
                if rng.random() < 0.2 else
                {"key": rng.randrange(320), "offset": b * 100 + i, "v": f"w{b}.{i}",
                 "f": rng.choice([0.5, -0.0, None, float("nan")])}
                for i in range(rng.randrange(1, 25))
            ]
        write_jsonl(landing, f"{b:03d}.jsonl", rows)
        replay._memo.clear()  # a fresh process
        ingest(shard, str(landing), REQUEST, engine=InProcessEngine(cache=None))
    upper = shard.state().upper
    return shard, [(snapshot_rows(shard, ts), change_rows(shard, ts)) for ts in range(upper)]


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    used: list[str] = []
    original = BaseCache.get

    def spy(self: BaseCache, bucket: int | str, key: str) -> pa.Table | None:
        table = original(self, bucket, key)
        if table is not None and bucket == PARTS:
            used.append(key)
        return table

    monkeypatch.setattr(BaseCache, "get", spy)
    return used


@pytest.mark.parametrize("seed", [1, 2])
def test_replays_from_copies_give_the_shard_that_decoding_gives(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    used = _spy(monkeypatch)
    _, with_copies = _history(tmp_path / "a", seed)
    assert used, "no replay mapped a part it had copied"
    assert list(cache_dir.rglob(f"{PARTS}/*.arrow"))
    monkeypatch.setenv("UPSERT_BASE_CACHE", "0")
    used.clear()
    _, without = _history(tmp_path / "b", seed)
    assert not used
    assert with_copies == without


def _read(shard: Shard, copies: object) -> list[tuple[object, object]]:
    state = shard.state()
    out = unmerged_changes_by_part(shard.blob, state, 1, state.upper, copies)  # type: ignore[arg-type]
    return sorted(((label, table.to_pylist()) for label, table in out), key=repr)


def test_copies_read_as_the_blobs_and_keep_the_labels(tmp_path: Path, cache_dir: Path) -> None:
    shard, _ = _history(tmp_path, 3)
    copies = replay._LocalPartCopies.for_shard(shard.blob, "s")
    assert copies is not None
    expected = _read(shard, None)
    assert _read(shard, copies) == expected  # every part copied (or mapped) on the way
    assert any(label is not None for label, _ in expected)
    mapped: list[str] = []
    original = copies.get

    def counting(key: str, size: int) -> pa.Table | None:
        table = original(key, size)
        if table is not None:
            mapped.append(key)
        return table

    copies.get = counting  # type: ignore[method-assign]
    assert _read(shard, copies) == expected
    assert mapped


def test_a_copy_whose_part_is_gone_resized_or_of_another_layout_is_not_used(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shard, _ = _history(tmp_path, 4)
    state = shard.state()
    parts = [p for b in state.batches for p in b.parts if hasattr(p, "key")]
    copies = replay._LocalPartCopies.for_shard(shard.blob, "s")
    assert copies is not None
    _read(shard, copies)  # copies made
    part = parts[-1]
    cache = BaseCache.for_blob(shard.blob, "s")
    assert cache is not None and cache.get(PARTS, part.key) is not None
    fresh = replay._LocalPartCopies.for_shard(shard.blob, "s")
    assert fresh is not None
    assert fresh.get(part.key, part.encoded_size_bytes) is not None
    assert fresh.get(part.key, part.encoded_size_bytes + 1) is None  # another size
    stored = Path(shard.blob.root) / part.key  # type: ignore[attr-defined]
    stored.unlink()
    gone = replay._LocalPartCopies.for_shard(shard.blob, "s")
    assert gone is not None and gone.get(part.key, part.encoded_size_bytes) is None
    # An intact copy of another layout (a row short) is read from the blob instead.
    shard2, _ = _history(tmp_path / "again", 5)
    expected = _read(shard2, None)
    cache2 = BaseCache.for_blob(shard2.blob, "s")
    assert cache2 is not None
    state2 = shard2.state()
    for p in (p for b in state2.batches for p in b.parts if hasattr(p, "key")):
        copy = cache2.get(PARTS, p.key)
        if copy is not None and copy.num_rows:
            cache2.put(PARTS, p.key, copy.slice(1))
    copies2 = replay._LocalPartCopies.for_shard(shard2.blob, "s")
    assert _read(shard2, copies2) == expected


@pytest.mark.parametrize("seed", [6, 7])
def test_copies_kept_by_the_writer_equal_reading_the_parts(
    tmp_path: Path, cache_dir: Path, seed: int
) -> None:
    """The bucket step keeps a copy of each part it writes; the copy holds exactly what
    decoding the part (its rows derived from its values) and its label give."""
    from upsert_core.persist.state.state import BlobPart
    from upsert_core.persist.write.parts import BUCKET_META, OpenPart

    shard, _ = _history(tmp_path, seed)
    cache = BaseCache.for_blob(shard.blob, "s")
    assert cache is not None
    checked = 0
    for batch in shard.state().batches[1:]:
        for part in batch.parts:
            if not isinstance(part, BlobPart):
                continue
            copy = cache.get(PARTS, part.key)
            assert copy is not None, f"no copy of {part.key}"
            opened = OpenPart(shard.blob, part, shard="s")
            try:
                expected, label = opened.read_whole(), opened.layout.bucket
            finally:
                opened.close()
            assert copy.replace_schema_metadata(None).equals(expected)
            assert copy.schema.metadata[BUCKET_META].decode() == f"{label[0]}/{label[1]}"
            checked += 1
    assert checked
