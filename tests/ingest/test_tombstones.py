"""Tombstones are shard data: in the global scope no GC, compaction or rebuild of the
upsert state forgets a deleted key's order (CONTRACT), and a lost tombstone set stops
the ingest instead of being forgotten."""

from __future__ import annotations

from pathlib import Path

import pytest

from upsert_core.errors import IngestError
from upsert_core.ingest import IngestRequest, ingest, pipeline
from upsert_core.ingest.shard_config import (
    CHECKPOINT_REF_PREFIX,
    TOMBSTONES_REF_PREFIX,
    ShardIngestConfig,
)
from upsert_core.ingest.verify import compare_state
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.state import HollowBatch
from upsert_core.persist.write.append import AppendRequest

from .helpers import memory_shard, snapshot_rows, write_jsonl

GLOBAL = IngestRequest(order_scope="global", buckets=2)


def _refs(shard: Shard, prefix: str) -> dict[str, str]:
    return {n: v for n, v in shard.state().config.items() if n.startswith(prefix)}


def _deleted_history(root: Path) -> Shard:
    """Key 1 inserted then deleted at order 6; key 2 deleted at order 9 without ever
    being seen; key 3 live."""
    shard = memory_shard()
    write_jsonl(root, "a.jsonl", [{"key": 1, "offset": 5, "v": "x"},
                                  {"key": 3, "offset": 1, "v": "live"}])
    write_jsonl(root, "b.jsonl", [{"key": 1, "offset": 6, "__deleted": True},
                                  {"key": 2, "offset": 9, "__deleted": True}])
    ingest(shard, str(root), GLOBAL)
    return shard


def _lose_checkpoints(shard: Shard) -> None:
    """A commit no ingest made (an empty batch, every checkpoint reference dropped), so
    no checkpoint is current and the next ingest rebuilds every bucket."""
    state = shard.state()
    lost = {n: "" for n, v in _refs(shard, CHECKPOINT_REF_PREFIX).items() if v}
    assert lost
    result = shard.compare_and_append(AppendRequest(
        HollowBatch(state.upper, state.upper + 1, 0, ()), state.upper, config_updates=lost
    ))
    assert result.committed


def _late_rows(root: Path) -> None:
    write_jsonl(root, "c.jsonl", [{"key": 1, "offset": 3, "v": "late"},
                                  {"key": 2, "offset": 8, "v": "late"},
                                  {"key": 3, "offset": 2, "v": "new"}])


LATEST = {(("key", 3), ("offset", 2), ("v", "new")): 1}


def test_a_rebuild_remembers_tombstones(tmp_path: Path) -> None:
    shard = _deleted_history(tmp_path)
    _lose_checkpoints(shard)
    _late_rows(tmp_path)
    report = ingest(shard, str(tmp_path), IngestRequest())
    assert report.rehydrations, "every bucket was rebuilt"
    assert report.warnings == []
    assert snapshot_rows(shard, shard.state().upper - 1) == LATEST
    assert shard.check().ok


def test_gc_and_compaction_keep_tombstones(tmp_path: Path) -> None:
    shard = _deleted_history(tmp_path)
    shard.gc(retain=1, leak_grace_ms=0)
    _lose_checkpoints(shard)
    shard.gc(retain=1, leak_grace_ms=0)  # the old checkpoints go; the tombstone sets stay
    _late_rows(tmp_path)
    ingest(shard, str(tmp_path), IngestRequest())
    assert snapshot_rows(shard, shard.state().upper - 1) == LATEST


def test_every_bucket_records_its_tombstones_from_the_first_commit(tmp_path: Path) -> None:
    shard = memory_shard()
    write_jsonl(tmp_path, "a.jsonl", [{"key": 1, "offset": 1, "__deleted": True}])
    ingest(shard, str(tmp_path), IngestRequest(order_scope="global", buckets=8))
    refs = ShardIngestConfig.read(shard.state().config).tombstone_refs
    assert sorted(refs) == list(range(8))
    assert sum(1 for v in refs.values() if v) == 1  # only key 1's bucket has one


def test_batch_scope_records_no_tombstones(tmp_path: Path) -> None:
    shard = memory_shard()
    write_jsonl(tmp_path, "a.jsonl", [{"key": 1, "offset": 1, "__deleted": True}])
    ingest(shard, str(tmp_path), IngestRequest(buckets=2))
    assert _refs(shard, TOMBSTONES_REF_PREFIX) == {}


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_a_lost_tombstone_set_stops_the_ingest(tmp_path: Path, damage: str) -> None:
    shard = _deleted_history(tmp_path)
    sets = [v for v in _refs(shard, TOMBSTONES_REF_PREFIX).values() if v]
    assert sets
    saved = {key: shard.blob.get(key) for key in sets}
    for key in sets:
        if damage == "missing":
            shard.blob.delete(key)
        else:
            data = bytearray(saved[key] or b"")
            data[-1] ^= 1
            shard.blob.set(key, bytes(data))
    _lose_checkpoints(shard)
    upper = shard.state().upper
    _late_rows(tmp_path)
    with pytest.raises(IngestError) as caught:
        ingest(shard, str(tmp_path), IngestRequest())
    message = str(caught.value)
    assert "c.jsonl" in message and "tombstones of bucket" in message
    assert any(key in message for key in sets) and "Restore the blob" in message
    assert shard.state().upper == upper, "nothing was committed"
    # Restored, the same ingest goes through and skips the late rows.
    for key, data in saved.items():
        assert data is not None
        shard.blob.set(key, data)
    ingest(shard, str(tmp_path), IngestRequest())
    assert snapshot_rows(shard, shard.state().upper - 1) == LATEST


def test_a_shard_from_before_tombstone_sets_still_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Buckets last written before tombstones were recorded have no entry: the rebuild
    # cannot know their tombstones and says so, as it always did.
    with monkeypatch.context() as patched:
        patched.setattr(pipeline, "tombstones_after", lambda *args: {})
        shard = _deleted_history(tmp_path)
    assert _refs(shard, TOMBSTONES_REF_PREFIX) == {}
    _lose_checkpoints(shard)
    _late_rows(tmp_path)
    report = ingest(shard, str(tmp_path), IngestRequest())
    assert report.warnings and "tombstones" in report.warnings[0]
    # From then on the rebuilt buckets record their sets.
    assert len(_refs(shard, TOMBSTONES_REF_PREFIX)) == 2


def test_the_full_check_verifies_tombstone_sets(tmp_path: Path) -> None:
    shard = _deleted_history(tmp_path)
    assert compare_state(shard).ok
    sets = [v for v in _refs(shard, TOMBSTONES_REF_PREFIX).values() if v]
    data = bytearray(shard.blob.get(sets[0]) or b"")
    data[-1] ^= 1
    shard.blob.set(sets[0], bytes(data))
    problems = compare_state(shard).problems
    assert any("tombstones of bucket" in p and sets[0] in p for p in problems), problems


def test_the_full_check_reads_tombstone_sets_when_checkpoints_are_stale(
    tmp_path: Path,
) -> None:
    # Review: a commit outside the ingest made the checkpoints stale and the check
    # stopped there, although the next ingest would fail on the damaged set.
    shard = _deleted_history(tmp_path)
    sets = [v for v in _refs(shard, TOMBSTONES_REF_PREFIX).values() if v]
    data = bytearray(shard.blob.get(sets[0]) or b"")
    data[-1] ^= 1
    shard.blob.set(sets[0], bytes(data))
    _lose_checkpoints(shard)
    problems = compare_state(shard).problems
    assert any("tombstones of bucket" in p and sets[0] in p for p in problems), problems
