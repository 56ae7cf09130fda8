"""``compare_state``: the committed upsert state equals the consolidated shard, and a
damaged or foreign checkpoint is reported, never silently accepted."""

from __future__ import annotations

from pathlib import Path

from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.buckets import bucket_of
from upsert_core.ingest.checkpoint import checkpoint_ref_name
from upsert_core.ingest.verify import compare_state
from upsert_core.landing import encode_key
from upsert_core.persist.shard import Shard

from .helpers import memory_shard, write_jsonl

REQUEST = IngestRequest(key=("key",), order="offset", buckets=2)


def _ingested(tmp_path: Path, files: int = 4) -> Shard:
    shard = memory_shard()
    for i in range(files):
        rows = [{"key": k, "offset": i, "v": f"v{i}-{k}"} for k in range(i, i + 20)]
        rows.append({"key": i + 100, "offset": i, "__deleted": True})
        write_jsonl(tmp_path, f"{i:02d}.jsonl", rows)
    ingest(shard, str(tmp_path), REQUEST)
    return shard


def test_the_committed_state_equals_the_shard(tmp_path: Path) -> None:
    shard = _ingested(tmp_path)
    result = compare_state(shard)
    assert result.ok, result.problems
    assert result.live_keys == result.shard_rows == 23 and not result.rebuilt_buckets


def test_a_checkpoint_swapped_for_another_buckets_is_reported(tmp_path: Path) -> None:
    shard = _ingested(tmp_path)
    state = shard.state()
    first, second = (state.config[checkpoint_ref_name(b)] for b in (0, 1))
    shard.blob.set(first, shard.blob.get(second) or b"")
    result = compare_state(shard)
    assert not result.ok and any("bucket 0" in p for p in result.problems)


def test_a_truncated_checkpoint_is_reported(tmp_path: Path) -> None:
    shard = _ingested(tmp_path)
    ref = shard.state().config[checkpoint_ref_name(1)]
    shard.blob.set(ref, (shard.blob.get(ref) or b"")[:40])
    assert not compare_state(shard).ok


def test_buckets_whose_base_gc_made_unreadable_are_left_to_rebuild(tmp_path: Path) -> None:
    shard = memory_shard()
    # A big first batch, then small ones: the checkpoint bases stay at the first batch
    # and the later batches are replayed on top of them.
    write_jsonl(tmp_path, "00.jsonl", [{"key": k, "offset": 0, "v": "a"} for k in range(300)])
    for i in range(1, 6):
        write_jsonl(tmp_path, f"{i:02d}.jsonl", [{"key": i, "offset": i, "v": f"b{i}"}])
    ingest(shard, str(tmp_path), REQUEST)
    assert compare_state(shard).ok
    shard.gc(retain=1, leak_grace_ms=0)
    result = compare_state(shard)
    assert result.ok, result.problems
    assert result.rebuilt_buckets == {0, 1}
    # Whatever was skipped, the next ingest rebuilds it and the state matches again.
    write_jsonl(tmp_path, "99.jsonl", [{"key": 1, "offset": 50, "v": "late"}])
    ingest(shard, str(tmp_path), IngestRequest())
    after = compare_state(shard)
    assert after.ok, after.problems
    touched = bucket_of(encode_key((1,)), 2)
    assert touched not in after.rebuilt_buckets  # the ingest rebuilt it, from the shard
