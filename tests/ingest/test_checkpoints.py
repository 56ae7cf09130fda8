"""Checkpoints: lost, corrupt or stale checkpoints are rebuilt from the shard (rehydration)
with the same result; the global scope keeps its tombstones through a rebuild."""

from __future__ import annotations

import random
from pathlib import Path

from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.shard_config import CONFIG_CHECKPOINT_UPPER, checkpoint_ref_name
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.state import HollowBatch
from upsert_core.persist.write.append import AppendRequest

from .helpers import contents, memory_shard, snapshot_rows, write_jsonl


def _landing(root: Path, files: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    for i in range(files):
        rows = []
        for _ in range(12):
            row = {"key": rng.randrange(10), "offset": rng.randrange(20)}
            if rng.random() < 0.25:
                row["__deleted"] = True
            else:
                row["v"] = rng.choice("abc")
            rows.append(row)
        write_jsonl(root, f"{i:03d}.jsonl", rows)


def _checkpoint_keys(shard: Shard) -> list[str]:
    config = shard.state().config
    return [v for k, v in config.items() if k.startswith(checkpoint_ref_name(0)[:-1]) and v]


def _two_phase(root: Path, damage: object, scope: str = "batch") -> tuple[Shard, list[str]]:
    """Ingest 3 files, damage the checkpoints, ingest 3 more; returns the shard and the
    rehydration notes of the second run."""
    shard = memory_shard("damaged")
    first, second = root / "first", root / "all"
    first.mkdir()
    second.mkdir()
    _landing(second, 6)
    for p in sorted(second.iterdir())[:3]:
        (first / p.name).write_bytes(p.read_bytes())
    ingest(shard, str(first), IngestRequest(order_scope=scope))
    damage(shard)  # type: ignore[operator]
    report = ingest(shard, str(second), IngestRequest())
    return shard, report.rehydrations + report.warnings


def _reference(root: Path, scope: str = "batch") -> Shard:
    shard = memory_shard("reference")
    ingest(shard, str(root / "all"), IngestRequest(order_scope=scope))
    return shard


def test_missing_checkpoints_are_rehydrated_with_the_same_result(tmp_path: Path) -> None:
    def delete(shard: Shard) -> None:
        keys = _checkpoint_keys(shard)
        assert keys
        for key in keys:
            shard.blob.delete(key)

    shard, notes = _two_phase(tmp_path, delete)
    assert any("is missing" in n for n in notes)
    assert contents(shard) == contents(_reference(tmp_path))


def test_corrupt_checkpoints_are_rehydrated_with_the_same_result(tmp_path: Path) -> None:
    def corrupt(shard: Shard) -> None:
        for key in _checkpoint_keys(shard):
            shard.blob.set(key, b"not parquet")

    shard, notes = _two_phase(tmp_path, corrupt)
    assert any("not valid Parquet" in n for n in notes)
    assert contents(shard) == contents(_reference(tmp_path))


def test_stale_checkpoints_are_rehydrated_with_the_same_result(tmp_path: Path) -> None:
    def stale(shard: Shard) -> None:
        # A commit that does not maintain checkpoints (an empty batch) leaves them stale.
        upper = shard.state().upper
        result = shard.compare_and_append(
            AppendRequest(HollowBatch(upper, upper + 1, 0, ()), upper)
        )
        assert result.committed
        assert shard.state().config[CONFIG_CHECKPOINT_UPPER] == str(upper)

    shard, notes = _two_phase(tmp_path, stale)
    assert sum("no checkpoint is known to be current" in n for n in notes) == 4  # all buckets
    reference = memory_shard("reference")
    (tmp_path / "all" / "002a.jsonl").touch()  # the same empty batch, as a file
    ingest(reference, str(tmp_path / "all"), IngestRequest())
    assert contents(shard) == contents(reference)


def test_global_scope_rehydration_keeps_tombstones(tmp_path: Path) -> None:
    shard = memory_shard()
    write_jsonl(tmp_path, "a.jsonl", [{"key": 1, "offset": 5, "v": "x"}])
    write_jsonl(tmp_path, "b.jsonl", [{"key": 1, "offset": 6, "__deleted": True}])
    ingest(shard, str(tmp_path), IngestRequest(order_scope="global"))
    # With its checkpoint, the tombstone (order 6) rejects a late update (order 3).
    write_jsonl(tmp_path, "c.jsonl", [{"key": 1, "offset": 3, "v": "late"}])
    intact = memory_shard("intact")
    report = ingest(intact, str(tmp_path), IngestRequest(order_scope="global"))
    assert report.warnings == [] and sum(snapshot_rows(intact, 2).values()) == 0
    # Without it, the rebuild takes the tombstone from the bucket's tombstone set (shard
    # data), so the late update is still rejected (tests/ingest/test_tombstones.py).
    for key in _checkpoint_keys(shard):
        shard.blob.delete(key)
    rebuilt = ingest(shard, str(tmp_path), IngestRequest())
    assert rebuilt.warnings == [] and any("is missing" in n for n in rebuilt.rehydrations)
    assert sum(snapshot_rows(shard, 2).values()) == 0


def test_global_scope_rehydration_restores_orders_from_rows(tmp_path: Path) -> None:
    def delete(shard: Shard) -> None:
        for key in _checkpoint_keys(shard):
            shard.blob.delete(key)

    # Without deletes, rehydration in the global scope is exact: orders come from rows.
    (tmp_path / "all").mkdir()
    (tmp_path / "first").mkdir()
    rng = random.Random(3)
    for i in range(6):
        rows = [{"key": rng.randrange(6), "offset": rng.randrange(30), "v": rng.choice("ab")}
                for _ in range(10)]
        write_jsonl(tmp_path / "all", f"{i}.jsonl", rows)
        if i < 3:
            write_jsonl(tmp_path / "first", f"{i}.jsonl", rows)
    shard = memory_shard()
    ingest(shard, str(tmp_path / "first"), IngestRequest(order_scope="global"))
    delete(shard)
    ingest(shard, str(tmp_path / "all"), IngestRequest())
    reference = memory_shard("reference")
    ingest(reference, str(tmp_path / "all"), IngestRequest(order_scope="global"))
    assert contents(shard) == contents(reference)
