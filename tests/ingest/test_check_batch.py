"""Batch-scoped checks (``ingest.verify.check_new_batch``, ``persist.maintenance.check_batch``):
they pass on real ingests (several files per run, both order scopes, deletes, several
buckets, runs that change nothing) and each fails when exactly what it guards is
corrupted: a part blob deleted or overwritten, a touched bucket's checkpoint replaced by
a valid one with a changed row, a batch whose changes do not consolidate or do not fit
the keys' previous rows."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from upsert_core.columnar import ColumnarState
from upsert_core.columnar.checkpoint_format import decode_state, encode_state
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.buckets import bucket_of
from upsert_core.ingest.checkpoint import write_checkpoint
from upsert_core.ingest.shard_config import (
    CONFIG_CHECKPOINT_UPPER,
    checkpoint_base_name,
    checkpoint_ref_name,
)
from upsert_core.ingest.verify import STATE, check_new_batch, compare_state
from upsert_core.landing import encode_key
from upsert_core.order_scope import OrderScope
from upsert_core.persist.maintenance.check import CONSOLIDATION, STORAGE, CheckReport
from upsert_core.persist.maintenance.check_batch import configs_at_uppers
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.state import BlobPart
from upsert_core.persist.write.consolidate import UPDATE_SCHEMA
from upsert_core.persist.write.parts import encode_parquet

from .helpers import memory_shard, write_jsonl

BUCKETS = 4


def _request(scope: str, part_bases: bool = True) -> IngestRequest:
    return IngestRequest(key=("key",), order="offset", buckets=BUCKETS, order_scope=scope,
                         part_bases=part_bases)


def _ingest(
    shard: Shard, root: Path, scope: str, files: dict[str, list[dict]],
    part_bases: bool = True,
) -> int:
    """Ingest ``files`` in one run; returns the upper before it. ``part_bases=False``:
    every checkpoint is a columnar one (``ingest.checkpoint``)."""
    for name, rows in files.items():
        write_jsonl(root, name, rows)
    before = shard.state().upper
    ingest(shard, str(root), _request(scope, part_bases))
    return before


def _ok(report: CheckReport) -> None:
    assert report.ok, report.problems
    assert not report.notes, report.notes


def _value(i: int, k: int) -> str:
    """Incompressible enough that a 300-key batch's parts are blobs, not inline."""
    return hashlib.sha256(f"{i}-{k}".encode()).hexdigest()


def _big(i: int) -> list[dict]:
    return [{"key": k, "offset": i, "v": _value(i, k)} for k in range(300)]


def _built(tmp_path: Path, scope: str, part_bases: bool = True) -> Shard:
    """A big first batch (blob parts, every bucket), then a run of three small files
    with updates, deletes (of live and of absent keys) and an identical re-send."""
    shard = memory_shard()
    _ingest(shard, tmp_path, scope, {"00.jsonl": _big(0)}, part_bases)
    _ok(check_new_batch(shard, 0))
    files = {
        "01.jsonl": [{"key": 1, "offset": 1, "v": "b1"}, {"key": 2, "offset": 1,
                                                          "__deleted": True}],
        "02.jsonl": [{"key": 1, "offset": 2, "v": "b2"}, {"key": 999, "offset": 2,
                                                          "__deleted": True},
                     {"key": 2, "offset": 2, "v": "back"}],
        "03.jsonl": [{"key": 3, "offset": 0, "v": _value(0, 3)}],  # identical: no change
    }
    assert _ingest(shard, tmp_path, scope, files, part_bases) == 1
    return shard


@pytest.mark.parametrize("scope", ["batch", "global"])
def test_real_ingests_pass(tmp_path: Path, scope: str) -> None:
    shard = _built(tmp_path, scope)
    assert shard.state().upper == 4
    whole_run = check_new_batch(shard, 1, 4)
    _ok(whole_run)
    assert whole_run.counts["new_updates"] == 6  # ts 1: key 1 -+, key 2 -; ts 2: 1 -+, 2 +
    assert 0 < whole_run.counts["touched_buckets"] <= BUCKETS
    for ts in range(4):  # each file alone, as a run that committed one file would be
        _ok(check_new_batch(shard, ts, ts + 1))
    last = check_new_batch(shard, 3)  # an identical re-send: an empty batch
    _ok(last)
    assert last.counts["new_updates"] == 0 and last.counts["touched_buckets"] == 0
    nothing = check_new_batch(shard, 4)  # a run that committed nothing reads nothing
    _ok(nothing)
    assert "new_parts" not in nothing.counts
    # A range that ended before the shard's upper (another run committed since).
    _ok(check_new_batch(shard, 1, 2))


def test_configs_at_uppers_undo_the_runs_diffs(tmp_path: Path) -> None:
    shard = _built(tmp_path, "batch")
    configs = configs_at_uppers(shard, shard.state(), {1, 2, 4})
    assert {u: c[CONFIG_CHECKPOINT_UPPER] for u, c in configs.items()} == {
        1: "1", 2: "2", 4: "4"
    }


def _blob_part(shard: Shard, ts: int) -> str:
    batch = next(b for b in shard.state().batches if b.lower == ts)
    return next(p.key for p in batch.parts if isinstance(p, BlobPart))


@pytest.mark.parametrize("damage", ["deleted", "garbage"])
def test_a_damaged_part_fails_storage(tmp_path: Path, damage: str) -> None:
    shard = memory_shard()
    _ingest(shard, tmp_path, "batch", {"00.jsonl": _big(0)})
    _ingest(shard, tmp_path, "batch", {"01.jsonl": _big(1)})
    key = _blob_part(shard, 1)
    if damage == "deleted":
        shard.blob.delete(key)
    else:
        shard.blob.set(key, b"PAR1 not really parquet PAR1")
    report = check_new_batch(shard, 1)
    assert any(key in p for p in report.of_kind(STORAGE)), report.problems
    _ok(check_new_batch(shard, 0, 1))  # the batch before is not read, and intact


def _replace_row(shard: Shard, ref: str) -> str:
    """Overwrite checkpoint ``ref`` with a valid one whose first row differs."""
    state, meta = decode_state(shard.blob.get(ref) or b"")
    rows = state.rows.to_pylist()
    key = rows[0]
    rows[0] = (rows[0] or b"") + b"!"
    changed = ColumnarState.checked(state.hi, state.lo, pa.array(rows, pa.large_binary()),
                                    state.orders)
    shard.blob.set(ref, encode_state(changed, meta))
    return str(key)


@pytest.mark.parametrize("scope", ["batch", "global"])
def test_a_replaced_checkpoint_of_a_touched_bucket_fails_state(
    tmp_path: Path, scope: str
) -> None:
    shard = memory_shard()
    _ingest(shard, tmp_path, scope, {"00.jsonl": _big(0)}, part_bases=False)
    _replace_row(shard, shard.state().config[checkpoint_ref_name(2)])
    report = check_new_batch(shard, 0)
    assert any("bucket 2" in p for p in report.of_kind(STATE)), report.problems
    assert not report.of_kind(STORAGE) and not report.of_kind(CONSOLIDATION)


def test_a_replaced_checkpoint_the_run_kept_fails_state(tmp_path: Path) -> None:
    shard = _built(tmp_path, "batch", part_bases=False)
    touched = [b for b in range(BUCKETS)
               if check_new_batch(shard, 1, 2).counts["touched_buckets"]]
    assert touched
    state = shard.state()
    # The small run kept the first batch's checkpoints as bases (replayed on load).
    assert all(state.config[f"checkpoint.base.{b}"].startswith("1:") for b in range(BUCKETS))
    for b in range(BUCKETS):
        _replace_row(shard, state.config[checkpoint_ref_name(b)])
    report = check_new_batch(shard, 1)
    assert report.of_kind(STATE) or report.of_kind(CONSOLIDATION), report.problems


def test_a_replaced_typed_base_of_a_touched_bucket_fails_state(tmp_path: Path) -> None:
    """A typed base (``ingest.typed_base``) overwritten with a valid one whose first
    value differs is caught like a columnar checkpoint."""
    shard = memory_shard()
    _ingest(shard, tmp_path, "batch", {"00.jsonl": _big(0)})
    before = _ingest(shard, tmp_path, "batch", {"01.jsonl": _big(1)})
    ref = shard.state().config[checkpoint_ref_name(2)]
    assert ref.startswith("s/checkpoint/") and ref.endswith(".parquet"), ref
    table = pq.read_table(pa.BufferReader(shard.blob.get(ref) or b""))
    values = table.column("v:v").to_pylist()
    values[0] = values[0] + "!"
    changed = table.set_column(table.schema.get_field_index("v:v"), "v:v",
                               pa.array(values, pa.string()))
    shard.blob.set(ref, encode_parquet(changed.replace_schema_metadata(table.schema.metadata)))
    report = check_new_batch(shard, before)
    assert any("bucket 2" in p for p in report.of_kind(STATE)), report.problems
    assert not report.of_kind(STORAGE) and not report.of_kind(CONSOLIDATION)


def _append_behind(shard: Shard, rows: list[dict]) -> int:
    """Append ``rows`` (updates at the upper) as the ingest would commit them, with the
    checkpoints claimed current; returns the upper before."""
    upper = shard.state().upper
    table = pa.Table.from_pylist([{**r, "ts": upper} for r in rows], schema=UPDATE_SCHEMA)
    result = shard.append(table, upper, config_updates={CONFIG_CHECKPOINT_UPPER: str(upper + 1)})
    assert result.committed
    return upper


def _live(shard: Shard) -> list[dict]:
    return shard.snapshot_table().to_pylist()


@pytest.mark.parametrize("scope", ["batch", "global"])
def test_an_insertion_over_a_live_row_fails_consolidation(tmp_path: Path, scope: str) -> None:
    shard = _built(tmp_path, scope)
    row = _live(shard)[0]
    upper = _append_behind(shard, [{"key": row["key"], "row": row["row"] + b"y", "diff": 1}])
    report = check_new_batch(shard, upper)
    assert any("inserts over a live row" in p for p in report.of_kind(CONSOLIDATION)), (
        report.problems
    )


def test_a_retraction_of_a_row_not_live_fails_consolidation(tmp_path: Path) -> None:
    shard = _built(tmp_path, "batch")
    row = _live(shard)[0]
    upper = _append_behind(shard, [
        {"key": row["key"], "row": row["row"] + b"old", "diff": -1},
        {"key": row["key"], "row": row["row"] + b"new", "diff": 1},
    ])
    report = check_new_batch(shard, upper)
    assert any("retracts a row the state does not hold" in p
               for p in report.of_kind(CONSOLIDATION)), report.problems


def test_two_insertions_of_a_key_at_one_ts_fail_consolidation(tmp_path: Path) -> None:
    shard = _built(tmp_path, "batch")
    key = (5).to_bytes(16, "big")
    upper = _append_behind(shard, [
        {"key": key, "row": b"one", "diff": 1},
        {"key": key, "row": b"two", "diff": 1},
        {"key": key, "row": b"two", "diff": 1},
    ])
    problems = check_new_batch(shard, upper).of_kind(CONSOLIDATION)
    assert any("2 insertion(s)" in p for p in problems), problems
    assert any("diff 2" in p for p in problems), problems


def test_a_moved_base_of_a_bucket_without_changes_fails_state(tmp_path: Path) -> None:
    # A batch that leaves a bucket's checkpoint blob alone but moves its base past the
    # changes the blob does not hold: the bucket's state at the upper loses them, though
    # the batch has no changes in the bucket (review: only moved refs counted as touched).
    shard = _built(tmp_path, "batch")
    state = shard.state()
    bases = {b: state.config[checkpoint_base_name(b)] for b in range(BUCKETS)}
    bucket = next(b for b, base in bases.items() if int(base.split(":")[1]) > 0)
    _, _, rows, size = bases[bucket].split(":")
    upper = state.upper
    result = shard.append(UPDATE_SCHEMA.empty_table(), upper, config_updates={
        CONFIG_CHECKPOINT_UPPER: str(upper + 1),
        checkpoint_base_name(bucket): f"{upper + 1}:0:{rows}:{size}",
    })
    assert result.committed
    assert not compare_state(shard).ok  # the full check sees the state lost changes
    report = check_new_batch(shard, upper)
    assert any(p.startswith(f"bucket {bucket}:") for p in report.of_kind(STATE)), (
        report.problems, report.notes
    )


def test_a_run_after_gc_is_checked_in_full(tmp_path: Path) -> None:
    # GC truncates the state diffs before its rollup; the run's own diffs stay, and the
    # backward walk must find them although its page reaches past the earliest diff.
    shard = _built(tmp_path, "batch")
    shard.gc()
    upper = _ingest(shard, tmp_path, "batch", {"04.jsonl": _big(4)})
    report = check_new_batch(shard, upper)
    _ok(report)
    assert report.counts["touched_buckets"] == BUCKETS


def _rewrite_orders(
    shard: Shard, bucket: int, new_orders: Callable[[ColumnarState], np.ndarray]
) -> bool:
    """Rewrite bucket ``bucket``'s committed checkpoint, as the ingest writes one
    (``write_checkpoint``: same metadata, a valid digest), with the orders
    ``new_orders(state)`` returns; the rows stay those of the shard. Only a rewrite of
    the committed size is done (returns whether it was): the size is checked on its
    own, and these tests are about the orders."""
    ref = shard.state().config[checkpoint_ref_name(bucket)]
    data = shard.blob.get(ref) or b""
    old, meta = decode_state(data)
    bogus = ColumnarState.checked(old.hi, old.lo, old.rows, new_orders(old))
    key, size = write_checkpoint(shard.blob, shard.shard_id, bucket, BUCKETS,
                                 OrderScope.GLOBAL, int(meta["upper"]), bogus)
    if size == len(data):
        shard.blob.set(ref, shard.blob.get(key) or b"")
    shard.blob.delete(key)
    return size == len(data)


def _tombstones(state: ColumnarState) -> np.ndarray:
    return np.asarray(state.rows.is_null().to_numpy(zero_copy_only=False), bool)


def test_real_global_ingests_compare_the_orders_of_live_keys(tmp_path: Path) -> None:
    shard = _built(tmp_path, "global")  # deletes, a tombstone of an absent key, a re-insert
    first = check_new_batch(shard, 0, 1)
    _ok(first)
    assert first.counts["orders_compared"] == 300
    report = check_new_batch(shard, 1)
    _ok(report)
    assert 0 < report.counts["orders_compared"] < 300
    # Tombstones keep an order the shard cannot confirm: any value is accepted.
    tomb = bucket_of(encode_key((999,)), BUCKETS)
    assert any(
        _rewrite_orders(shard, tomb, lambda s, v=v: np.where(_tombstones(s), v, s.orders))
        for v in range(3, 200)
    )
    _ok(check_new_batch(shard, 1))


@pytest.mark.parametrize("sign", [1, -1], ids=["newer", "older"])
def test_a_checkpoint_with_wrong_orders_of_live_keys_fails_state(
    tmp_path: Path, sign: int
) -> None:
    # The review repro: a touched bucket's checkpoint claims orders its rows contradict
    # (newer: a newer row would be ignored; older: an older row would win).
    shard = memory_shard()
    _ingest(shard, tmp_path, "global", {"00.jsonl": _big(0)})
    upper = _ingest(shard, tmp_path, "global",
                    {"01.jsonl": [{**r, "offset": 50} for r in _big(1)]})
    _ok(check_new_batch(shard, upper))
    live = len(decode_state(shard.blob.get(shard.state().config[checkpoint_ref_name(2)])
                            or b"")[0].hi)
    # Every live key of bucket 2 gets one wrong order (their rows say offset 50): the
    # first candidate that keeps the checkpoint's size.
    stored = next(v for v in range(50 + sign, 50 + 40 * sign, sign)
                  if _rewrite_orders(shard, 2, lambda s, v=v: np.full(len(s.hi), v, np.int64)))
    report = check_new_batch(shard, upper)
    problems = report.of_kind(STATE)
    assert len(problems) == 1 and not report.of_kind(CONSOLIDATION), report.problems
    assert problems[0].startswith(f"bucket 2: {live} live key(s)"), problems
    assert problems[0].count(f"(stored {stored}, row 50)") == 10  # examples, then the count
