"""Compaction merges a run's buckets on several threads (``persist.maintenance.compact``): the
result is the sequential merge's, parts in bucket order, and a bucket that fails
leaves nothing behind: no part of any bucket, the shard unchanged."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from upsert_core.errors import UpsertPlatformError
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.persist.keys import writer_id_of
from upsert_core.persist.maintenance import compact as compact_module
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.state import BlobPart

from .helpers import change_rows, memory_shard, snapshot_rows, write_jsonl

BUCKETS = 4
REQUEST = IngestRequest(order_scope="batch", buckets=BUCKETS, inline_threshold=0)


def _shard_with_history(tmp_path: Path) -> Shard:
    rng = random.Random(17)
    landing = tmp_path / "landing"
    landing.mkdir(parents=True)
    write_jsonl(landing, "000.jsonl", [{"key": k, "offset": 0, "v": f"v{k}"}
                                       for k in range(200)])
    for b in range(1, 7):
        write_jsonl(landing, f"{b:03d}.jsonl", [
            {"key": rng.randrange(240), "offset": b * 100 + i, "__deleted": True}
            if rng.random() < 0.2 else
            {"key": rng.randrange(240), "offset": b * 100 + i, "v": f"w{b}.{i}",
             "f": rng.choice([1.5, -0.0, None, float("nan")])}
            for i in range(40)
        ])
    shard = memory_shard()
    ingest(shard, str(landing), REQUEST)
    return shard


def _text(rows: object) -> list[str]:
    return sorted(repr(item) for item in rows.items())  # type: ignore[attr-defined]


def _history(shard: Shard) -> list[tuple[list[str], list[str]]]:
    upper = shard.state().upper
    return [(_text(snapshot_rows(shard, ts)), _text(change_rows(shard, ts)))
            for ts in range(upper)]


def _labels(shard: Shard) -> list[list[int]]:
    from upsert_core.persist.write.parts import OpenPart

    out = []
    for batch in shard.state().batches:
        labels = []
        for part in batch.parts:
            reader = OpenPart(shard.blob, part, shard=shard.shard_id)
            try:
                bucket = reader.layout.bucket
            finally:
                reader.close()
            assert bucket is not None
            labels.append(bucket[0])
        out.append(labels)
    return out


def test_threads_merge_like_one_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert compact_module.merge_threads(BUCKETS) >= 1
    ours = _shard_with_history(tmp_path / "a")
    history = _history(ours)
    monkeypatch.setattr(compact_module.os, "cpu_count", lambda: 4)
    assert compact_module.merge_threads(BUCKETS) == 4
    ours.compact(merge_all=True, inline_threshold=0)
    monkeypatch.setattr(compact_module, "MAX_MERGE_THREADS", 1)
    theirs = _shard_with_history(tmp_path / "b")
    theirs.compact(merge_all=True, inline_threshold=0)
    assert len(ours.state().batches) == len(theirs.state().batches) == 1
    merged = ours.state().batches[0].parts
    assert len(merged) >= BUCKETS and all(isinstance(p, BlobPart) for p in merged)
    assert _history(ours) == _history(theirs) == history  # all history kept (since 0)
    labels = _labels(ours)
    assert labels == _labels(theirs)
    assert all(batch == sorted(batch) for batch in labels)
    assert ours.check().ok


def test_a_failing_bucket_leaves_no_part_of_any_bucket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shard = _shard_with_history(tmp_path)
    before = shard.state()
    keys_before = {m.key for m in shard.blob.list_keys("")}
    history = _history(shard)
    monkeypatch.setattr(compact_module.os, "cpu_count", lambda: 4)
    others_done = threading.Barrier(BUCKETS, timeout=30)
    original = compact_module.write_parts

    def failing(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        bucket = kwargs["bucket"]
        assert isinstance(bucket, tuple)
        if bucket[0] == 2:
            others_done.wait()  # every other bucket is writing: fail after them
            raise UpsertPlatformError("bucket 2: the blob store refused the part")
        parts = original(*args, **kwargs)
        others_done.wait()
        return parts

    monkeypatch.setattr(compact_module, "write_parts", failing)
    with pytest.raises(UpsertPlatformError, match="bucket 2"):
        shard.compact(merge_all=True, inline_threshold=0)
    assert shard.state().batches == before.batches
    assert {m.key for m in shard.blob.list_keys("")} == keys_before
    assert _history(shard) == history
    assert shard.check().ok


def test_parts_merged_on_threads_name_the_compacting_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every part a compaction writes names its registered writer, whichever thread
    wrote it (``writing_as`` is a context variable, which a pool's threads do not
    inherit): GC then keeps it while that writer is registered, and a fenced compactor
    cannot commit it. A part naming no writer is a legacy blob to GC, deleted once seen
    unreferenced for the grace period, while the compaction may still commit it."""
    shard = _shard_with_history(tmp_path)
    monkeypatch.setattr(compact_module.os, "cpu_count", lambda: 4)
    assert compact_module.merge_threads(BUCKETS) > 1
    gc_handle = Shard.open(shard.consensus, shard.blob, shard.shard_id)
    history = _history(shard)
    before = {p.key for b in shard.state().batches for p in b.parts
              if isinstance(p, BlobPart)}
    others_done = threading.Barrier(BUCKETS, timeout=30)
    original = compact_module.write_parts

    def gc_while_compacting(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        bucket = kwargs["bucket"]
        assert isinstance(bucket, tuple)
        if bucket[0] == BUCKETS - 1:
            others_done.wait()  # every other bucket's parts are written, not committed
            gc_handle.gc(leak_grace_ms=0, run_compaction=False)
            return original(*args, **kwargs)
        parts = original(*args, **kwargs)
        others_done.wait()
        return parts

    monkeypatch.setattr(compact_module, "write_parts", gc_while_compacting)
    shard.compact(merge_all=True, inline_threshold=0)
    writer = shard.writer_id()
    new = [p.key for b in shard.state().batches for p in b.parts
           if isinstance(p, BlobPart) and p.key not in before]
    assert new
    assert {writer_id_of(key) for key in new} == {writer}
    assert shard.check().ok
    assert _history(shard) == history
