"""An ingest whose bucket step loses a part to a concurrent GC plans again on the fresh
state instead of reporting corruption; a failure on an unchanged state still fails."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from upsert_core.errors import IngestError
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.engine import InProcessEngine
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.shard import Shard
from upsert_core.persist.testing import DelegatingBlob

from .helpers import snapshot_rows, write_jsonl

# Columnar checkpoints: the only parts the later files read are the ones they replay.
REQUEST = IngestRequest(key=("key",), order="offset", buckets=2, inline_threshold=0,
                        part_bases=False)


class VanishingPartsBlob(DelegatingBlob):
    """A blob that, while armed, reports batch parts missing (as after a GC) and calls
    ``on_vanish`` first (e.g. another process moving the shard on)."""

    def __init__(self, inner: MemoryBlob) -> None:
        super().__init__(inner)
        self.armed = 0
        self.on_vanish: Callable[[], None] = lambda: None

    def get(self, key: str) -> bytes | None:
        if self.armed and "/part/" in key:
            self.armed -= 1
            self.on_vanish()
            return None
        return self.inner.get(key)


def _landing(tmp_path: Path) -> tuple[Path, Path]:
    """(a landing with only the first file, the full landing)."""
    # A big first file, then small ones: checkpoint bases stay at the first file, so
    # the later files replay the shard's changes (reading its parts).
    first, full = tmp_path / "first", tmp_path / "full"
    first.mkdir()
    full.mkdir()
    big = [{"key": k, "offset": 0, "v": "a"} for k in range(200)]
    write_jsonl(first, "00.jsonl", big)
    write_jsonl(full, "00.jsonl", big)
    for i in range(1, 4):
        write_jsonl(full, f"{i:02d}.jsonl", [{"key": i, "offset": i, "v": f"b{i}"}])
    return first, full


def _reference(landing: Path) -> Shard:
    shard = Shard.open(MemoryConsensus(), MemoryBlob(), "s")
    ingest(shard, str(landing), REQUEST, engine=InProcessEngine(cache=None))
    return shard


def test_a_part_lost_to_a_concurrent_gc_is_retried_on_the_fresh_state(tmp_path: Path) -> None:
    first, full = _landing(tmp_path)
    consensus, blob = MemoryConsensus(), VanishingPartsBlob(MemoryBlob())
    shard = Shard.open(consensus, blob, "s")
    ingest(shard, str(first), REQUEST, engine=InProcessEngine(cache=None))
    other = Shard.open(consensus, blob, "s")
    moved = []

    def gc_moves_the_shard() -> None:
        moved.append(other.machine.apply(lambda s: s.evolve(config={**s.config, "x": "y"})))

    blob.on_vanish = gc_moves_the_shard
    blob.armed = 1
    report = ingest(shard, str(full), REQUEST, engine=InProcessEngine(cache=None))
    assert moved, "the test never made a part vanish"
    assert [f.name for f in report.files] == ["01.jsonl", "02.jsonl", "03.jsonl"]
    assert max(f.attempts for f in report.files) == 2
    reference = _reference(full)
    for ts in range(4):
        assert snapshot_rows(shard, ts) == snapshot_rows(reference, ts)


def test_a_part_base_lost_to_a_concurrent_gc_loses_nothing(tmp_path: Path) -> None:
    """With part bases the first part read is a bucket's base: losing it (a GC that saw
    the bucket move to a newer base) makes the bucket unusable, never wrong."""
    first, full = _landing(tmp_path)
    request = IngestRequest(key=("key",), order="offset", buckets=2, inline_threshold=0)
    consensus, blob = MemoryConsensus(), VanishingPartsBlob(MemoryBlob())
    shard = Shard.open(consensus, blob, "s")
    ingest(shard, str(first), request, engine=InProcessEngine(cache=None))
    other = Shard.open(consensus, blob, "s")
    blob.on_vanish = lambda: other.machine.apply(
        lambda s: s.evolve(config={**s.config, "x": "y"}))
    blob.armed = 1
    report = ingest(shard, str(full), request, engine=InProcessEngine(cache=None))
    assert blob.armed == 0, "the test never made a part vanish"
    assert [f.name for f in report.files] == ["01.jsonl", "02.jsonl", "03.jsonl"]
    reference = _reference(full)
    for ts in range(4):
        assert snapshot_rows(shard, ts) == snapshot_rows(reference, ts)
    assert shard.check().ok


def test_a_missing_part_on_an_unchanged_shard_is_reported(tmp_path: Path) -> None:
    first, full = _landing(tmp_path)
    blob = VanishingPartsBlob(MemoryBlob())
    shard = Shard.open(MemoryConsensus(), blob, "s")
    ingest(shard, str(first), REQUEST, engine=InProcessEngine(cache=None))
    blob.armed = 100
    with pytest.raises(IngestError, match=r"\.jsonl: CorruptData: .*missing from the blob store"):
        ingest(shard, str(full), REQUEST, engine=InProcessEngine(cache=None))
    assert shard.state().upper < 4
