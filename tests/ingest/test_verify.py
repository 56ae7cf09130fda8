"""``compare_state``: the committed upsert state equals the consolidated shard, and a
damaged or foreign checkpoint is reported, never silently accepted."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa

from upsert_core.columnar import ColumnarState
from upsert_core.columnar.checkpoint_format import decode_state
from upsert_core.order_scope import OrderScope
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.buckets import bucket_of
from upsert_core.ingest.checkpoint import load_checkpoint, write_checkpoint
from upsert_core.ingest.options import resolve_options
from upsert_core.ingest.rehydrate import rehydrate_bucket
from upsert_core.ingest.shard_config import checkpoint_ref_name
from upsert_core.ingest.verify import compare_state
from upsert_core.landing import encode_key
from upsert_core.persist.shard import Shard

from .helpers import memory_shard, write_jsonl, write_parquet

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


GLOBAL = IngestRequest(key=("key",), order="offset", buckets=4, order_scope="global")


def _global_ingested(tmp_path: Path) -> Shard:
    """Global scope, four buckets, timestamp orders: updates, deletes of live and of
    absent keys, re-inserts, and late rows that lose to newer ones."""
    shard = memory_shard()
    at = datetime(2024, 1, 1, tzinfo=UTC)
    files: list[list[dict]] = [
        [{"key": k, "offset": at + timedelta(seconds=k), "v": f"a{k}"} for k in range(40)],
        [{"key": k, "offset": at + timedelta(hours=1), "__deleted": True}
         for k in range(0, 40, 3)]
        + [{"key": 500, "offset": at, "__deleted": True}],
        [{"key": k, "offset": at + timedelta(hours=2, milliseconds=k), "v": f"b{k}"}
         for k in range(0, 40, 6)]
        + [{"key": 1, "offset": at, "v": "late"}],  # older than key 1's row: ignored
    ]
    for i, rows in enumerate(files):
        table = pa.Table.from_pylist(
            rows, schema=pa.schema([("key", pa.int64()), ("offset", pa.timestamp("ms")),
                                    ("v", pa.string()), ("__deleted", pa.bool_())]),
        )
        write_parquet(tmp_path, f"{i:02d}.parquet", table)
    ingest(shard, str(tmp_path), GLOBAL)
    return shard


def _rewrite_orders(shard: Shard, change: Callable[[ColumnarState], np.ndarray]) -> None:
    """Rewrite every bucket's checkpoint as the ingest writes one (``write_checkpoint``),
    with the orders ``change`` returns."""
    state = shard.state()
    for bucket in range(GLOBAL.buckets or 0):
        ref = state.config[checkpoint_ref_name(bucket)]
        old, meta = decode_state(shard.blob.get(ref) or b"")
        bogus = ColumnarState.checked(old.hi, old.lo, old.rows, change(old))
        key, _ = write_checkpoint(shard.blob, shard.shard_id, bucket, meta["buckets"],
                                  OrderScope.GLOBAL, int(meta["upper"]), bogus)
        shard.blob.set(ref, shard.blob.get(key) or b"")
        shard.blob.delete(key)


def _tombstones(state: ColumnarState) -> np.ndarray:
    return np.asarray(state.rows.is_null().to_numpy(zero_copy_only=False), bool)


def test_a_healthy_global_shard_passes_with_its_orders_checked(tmp_path: Path) -> None:
    shard = _global_ingested(tmp_path)
    result = compare_state(shard)
    assert result.ok, result.problems
    assert result.live_keys == result.shard_rows == 40 - 14 + 7
    assert result.orders_compared == result.live_keys
    assert result.state_keys == result.live_keys + 14 - 7 + 1  # tombstones are state
    # A tombstone's order has no row to be checked against, but the bucket's recorded
    # tombstone set (what a rebuild would use) must agree with the checkpoint.
    _rewrite_orders(shard, lambda s: np.where(_tombstones(s), 7, s.orders))
    problems = compare_state(shard).problems
    assert problems and all("its tombstone set" in p for p in problems), problems


def test_a_checkpoint_with_wrong_orders_of_live_keys_is_reported(tmp_path: Path) -> None:
    # The review repro: stored orders newer than the rows say; the next ingest would
    # then ignore a newer row of those keys.
    shard = _global_ingested(tmp_path)
    _rewrite_orders(shard, lambda s: np.where(_tombstones(s), s.orders, s.orders + 1))
    result = compare_state(shard)
    assert not result.ok
    assert len(result.problems) == GLOBAL.buckets, result.problems
    assert sum(int(p.split(": ")[1].split()[0]) for p in result.problems) == 33
    assert all(p.startswith("bucket ") and "stored order" in p for p in result.problems)


def test_rehydration_reads_the_orders_the_check_compares(tmp_path: Path) -> None:
    # Both take a live key's order from its row with ``rehydrate.order_values``: a bucket
    # rebuilt from the shard holds exactly the committed checkpoint's live orders.
    shard = _global_ingested(tmp_path)
    state = shard.state()
    schema = resolve_options(state.config, IngestRequest()).schema
    for bucket in range(GLOBAL.buckets or 0):
        committed = load_checkpoint(shard.blob, state.config[checkpoint_ref_name(bucket)],
                                    shard.shard_id, bucket, 4, OrderScope.GLOBAL)
        rebuilt = rehydrate_bucket(shard.blob, state, bucket, 4, OrderScope.GLOBAL, schema)
        live = [item for item in committed.items() if item[1] is not None]
        assert live and list(rebuilt.items()) == live
