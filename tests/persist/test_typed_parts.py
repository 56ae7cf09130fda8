"""Typed, bucket-labelled parts (``parts``), their typed snapshot (``typed_read``) and
the bucket-preserving compaction (``compact``), at the persist level."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from upsert_core.errors import CorruptData, InvalidUsage
from upsert_core.persist.location.blob_local import LocalBlob
from upsert_core.persist.location.consensus_sql import SqlConsensus
from upsert_core.persist.read.typed_read import open_typed_snapshot
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.state import HollowBatch, InlinePart
from upsert_core.persist.write.append import AppendRequest
from upsert_core.persist.write.buckets import bucket_of_keys
from upsert_core.persist.write.parts import (
    VALUE_PREFIX,
    OpenPart,
    encode_parquet,
    is_consolidated,
    read_part_table,
    write_part,
    write_parts,
)

N = 2
FIELDS = [pa.field("v", pa.string()), pa.field("n", pa.int64())]


def _key(i: int, bucket: int) -> bytes:
    """A 16-byte key of ``bucket`` (of ``N``), distinct per ``i``."""
    for salt in range(1000):
        key = (i * 1000 + salt).to_bytes(8, "big") + b"k" * 8
        if bucket_of_keys(pa.array([key], pa.binary()), N)[0] == bucket:
            return key
    raise AssertionError("unreachable")


def _updates(rows: list[tuple[bytes, str, int, int]]) -> tuple[pa.Table, pa.Table]:
    """(key, value, ts, diff) -> updates (row = the value's bytes) and their values."""
    updates = pa.table({
        "key": pa.array([r[0] for r in rows], pa.binary()),
        "row": pa.array([r[1].encode() for r in rows], pa.binary()),
        "ts": pa.array([r[2] for r in rows], pa.int64()),
        "diff": pa.array([r[3] for r in rows], pa.int64()),
    })
    values = pa.table({"v": pa.array([r[1] for r in rows], pa.string()),
                       "n": pa.array([len(r[1]) for r in rows], pa.int64())})
    return updates, values


def _shard(root: Path) -> Shard:
    return Shard.open(SqlConsensus(f"sqlite:///{root}/c.db"), LocalBlob(root / "blob"), "s")


def _append_typed(
    shard: Shard, lower: int, parts: list[tuple[list[tuple[bytes, str, int, int]], int | None]],
    *, values: bool = True,
) -> None:
    written = []
    for rows, bucket in parts:
        updates, typed = _updates(rows)
        written.append(write_part(
            shard.blob, shard.shard_id, updates, values=typed if values else None,
            bucket=None if bucket is None else (bucket, N), inline_threshold=0,
        ))
    batch = HollowBatch(lower=lower, upper=lower + 1, since=0, parts=tuple(written))
    assert shard.compare_and_append(AppendRequest(batch, lower)).committed


def _typed_bag(shard: Shard, as_of: int) -> Counter[tuple[str, int]] | None:
    opened = open_typed_snapshot(shard.blob, shard.state(), as_of, FIELDS)
    if opened is None:
        return None
    try:
        return Counter(
            (row["v"], row["n"])
            for _, tables in opened.tables() for t in tables for row in t.to_pylist()
        )
    finally:
        opened.close()


def _merged_bag(shard: Shard, as_of: int) -> Counter[tuple[str, int]]:
    bag: Counter[tuple[str, int]] = Counter()
    for row in shard.snapshot_table(as_of).to_pylist():
        value = row["row"].decode()
        bag[(value, len(value))] += row["diff"]
    return bag


def test_value_columns_are_stored_but_update_readers_never_see_them(tmp_path: Path) -> None:
    blob = LocalBlob(tmp_path)
    updates, values = _updates([(_key(1, 0), "b", 0, 1), (_key(0, 0), "a", 0, 1)])
    part = write_part(blob, "s", updates, values=values, bucket=(0, N), inline_threshold=0)
    opened = OpenPart(blob, part)
    try:
        assert opened.layout.bucket == (0, N) and opened.layout.consolidated
        assert [f.name for f in opened.layout.values] == ["v", "n"]
        stored = opened.read_row_group(0, columns=["row", VALUE_PREFIX + "v"])
        # Sorted with the updates, row for row.
        assert [r.decode() for r in stored.column("row").to_pylist()] == stored.column(
            VALUE_PREFIX + "v").to_pylist()
    finally:
        opened.close()
    assert read_part_table(blob, part).schema.names == ["key", "row", "ts", "diff"]


def test_bad_values_and_labels_are_refused_at_write(tmp_path: Path) -> None:
    blob = LocalBlob(tmp_path)
    updates, values = _updates([(_key(0, 0), "a", 0, 1)])
    with pytest.raises(InvalidUsage, match="rows"):
        write_part(blob, "s", updates, values=values.slice(0, 0))
    with pytest.raises(InvalidUsage, match="bucket label"):
        write_part(blob, "s", updates, values=values, bucket=(2, 2))
    with pytest.raises(InvalidUsage, match="distinct"):
        write_part(blob, "s", updates, values=pa.table([values["v"], values["v"]], ["v", "v"]))


@pytest.mark.parametrize("metadata, column", [
    ({b"upsert.bucket": b"1/1"}, None),  # b not < N
    ({b"upsert.bucket": b"x"}, None),
    ({}, "stray"),  # an extra column that is not a value column
])
def test_malformed_typed_footers_are_corrupt(
    metadata: dict[bytes, bytes], column: str | None
) -> None:
    updates, _ = _updates([(_key(0, 0), "a", 0, 1)])
    if column is not None:
        updates = updates.append_column(column, pa.array([1], pa.int64()))
    data = encode_parquet(updates.replace_schema_metadata(metadata or None))
    with pytest.raises(CorruptData, match="inline part"):
        OpenPart(LocalBlob(Path("/nonexistent")), InlinePart(data=data, num_updates=1))


def test_is_consolidated() -> None:
    k0, k1 = _key(0, 0), _key(1, 0)
    assert is_consolidated(_updates([(k0, "a", 0, 1), (k0, "b", 0, -1), (k1, "a", 0, 2)])[0])
    assert not is_consolidated(_updates([(k0, "a", 0, 1), (k0, "a", 1, -1)])[0])
    assert not is_consolidated(_updates([(k0, "a", 0, 0)])[0])
    assert is_consolidated(_updates([])[0])


def test_typed_snapshot_consolidates_buckets_of_several_parts(tmp_path: Path) -> None:
    shard = _shard(tmp_path)
    a0, b0, a1 = _key(0, 0), _key(1, 0), _key(2, 1)
    _append_typed(shard, 0, [([(a0, "a", 0, 1), (b0, "b", 0, 1)], 0), ([(a1, "c", 0, 1)], 1)])
    # ts 1: a0's row held twice; b0 retracted; a lone retraction in bucket 1 (dropped).
    _append_typed(shard, 1, [([(a0, "a", 1, 1), (b0, "b", 1, -1)], 0),
                             ([(a1, "zz", 1, -1)], 1)])
    assert _typed_bag(shard, 0) == Counter({("a", 1): 1, ("b", 1): 1, ("c", 1): 1})
    assert _typed_bag(shard, 1) == Counter({("a", 1): 2, ("c", 1): 1})
    assert +_merged_bag(shard, 1) == _typed_bag(shard, 1)
    # Bucket-preserving compaction keeps the layout and the answer.
    shard.compact(merge_all=True)
    state = shard.state()
    assert len(state.batches) == 1
    labels = []
    for part in state.batches[0].parts:
        opened = OpenPart(shard.blob, part)
        labels.append(opened.layout.bucket)
        assert [f.name for f in opened.layout.values] == ["v", "n"]
        opened.close()
    assert sorted(labels) == [(0, N), (1, N)]  # type: ignore[type-var]
    assert _typed_bag(shard, 1) == Counter({("a", 1): 2, ("c", 1): 1})


def test_a_value_column_added_later_reads_as_null_and_a_wrong_type_is_corrupt(
    tmp_path: Path,
) -> None:
    shard = _shard(tmp_path)
    updates, values = _updates([(_key(0, 0), "a", 0, 1)])
    part = write_part(shard.blob, "s", updates, values=values.select(["v"]), bucket=(0, N))
    batch = HollowBatch(lower=0, upper=1, since=0, parts=(part,))
    assert shard.compare_and_append(AppendRequest(batch, 0)).committed
    opened = open_typed_snapshot(shard.blob, shard.state(), 0, FIELDS)
    assert opened is not None
    try:
        tables = [t for _, ts in opened.tables() for t in ts]
        assert tables[0].to_pylist() == [{"v": "a", "n": None}]
    finally:
        opened.close()
    wrong = open_typed_snapshot(shard.blob, shard.state(), 0, [pa.field("v", pa.int64())])
    assert wrong is not None
    try:
        with pytest.raises(CorruptData, match="value column 'v'"):
            list(wrong.tables())
    finally:
        wrong.close()


def test_plain_or_unlabelled_parts_leave_the_merged_read_in_charge(tmp_path: Path) -> None:
    shard = _shard(tmp_path)
    a0, a1 = _key(0, 0), _key(1, 1)
    _append_typed(shard, 0, [([(a0, "a", 0, 1)], 0), ([(a1, "b", 0, 1)], 1)])
    assert _typed_bag(shard, 0) is not None
    _append_typed(shard, 1, [([(a0, "a", 1, -1)], None)])  # labelled: no
    assert _typed_bag(shard, 0) is not None  # not read as of 0
    assert _typed_bag(shard, 1) is None
    _append_typed(shard, 2, [([(a1, "b", 2, -1)], 1)], values=False)
    assert _typed_bag(shard, 2) is None
    # Compacting a run with plain parts writes plain parts (the streaming merge).
    shard.compact(merge_all=True)
    assert _typed_bag(shard, 2) is None
    assert +_merged_bag(shard, 2) == Counter()


def test_write_parts_leaves_nothing_behind_when_a_later_part_fails(tmp_path: Path) -> None:
    class FailingSecondWrite(LocalBlob):
        writes = 0

        def set(self, key: str, value: bytes) -> None:
            FailingSecondWrite.writes += 1
            if FailingSecondWrite.writes == 2:
                raise OSError("disk full")
            super().set(key, value)

    blob = FailingSecondWrite(tmp_path / "blob")
    updates, values = _updates([(_key(i, 0), "x" * 50, 0, 1) for i in range(8)])
    with pytest.raises(OSError, match="disk full"):
        write_parts(blob, "s", updates, values=values, bucket=(0, N), part_rows=3,
                    inline_threshold=0)
    assert [p for p in (tmp_path / "blob").rglob("*") if p.is_file()] == []


@pytest.mark.parametrize("budget, most", [(1, 1), (10_000, 3)])
def test_read_ahead_is_bounded_by_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, budget: int, most: int
) -> None:
    """Buckets are read ahead only within the row budget (at least the next one): a
    streaming reader holds about one bucket when buckets are big."""
    import threading

    import upsert_core.persist.read.typed_read as typed_read

    monkeypatch.setattr(typed_read, "AHEAD_ROWS", budget)
    monkeypatch.setitem(globals(), "N", 3)
    shard = _shard(tmp_path)
    _append_typed(shard, 0, [([(_key(i, b), f"v{b}{i}", 0, 1) for i in range(3)], b)
                             for b in range(3)])
    opened = open_typed_snapshot(shard.blob, shard.state(), 0, FIELDS)
    assert opened is not None
    lock, running, peak = threading.Lock(), [0], [0]
    real = opened.read_bucket
    gate = threading.Event()

    def counted(bucket: int) -> list[pa.Table]:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        gate.wait(0.2)  # let the others start if they were submitted
        try:
            return real(bucket)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(opened, "read_bucket", counted)
    try:
        got = [b for b, _ in opened.tables()]
    finally:
        opened.close()
    assert got == [0, 1, 2] and peak[0] == most


def _history(rows: list[tuple[bytes, int, int, object]]) -> tuple[list[pa.Table], pa.Table]:
    table = pa.table({"key": pa.array([r[0] for r in rows], pa.binary()),
                      "ts": pa.array([r[1] for r in rows], pa.int64()),
                      "diff": pa.array([r[2] for r in rows], pa.int64())})
    return [table.slice(0, 2), table.slice(2)], pa.table({"f": pa.array([r[3] for r in rows],
                                                                        pa.float64())})


def test_a_bucket_is_resolved_key_by_key_only_for_a_verified_upsert_history() -> None:
    from upsert_core.persist.read.typed_read import _latest_per_key

    k1, k2, k3 = b"\x01" * 16, b"\x02" * 16, b"\x01" * 8 + b"\x09" * 8  # k3 shares k1's hi
    nan = float("nan")
    good = [(k1, 0, 1, nan), (k2, 0, 1, 0.0), (k1, 1, -1, nan), (k1, 1, 1, 2.0),
            (k2, 2, -1, -0.0), (k3, 1, 1, 5.0)]
    tables, stored = _history(good)
    picked = _latest_per_key(tables, stored)
    assert picked is not None and sorted(picked.tolist()) == [3, 5]  # k1's 2.0, k3; k2 gone
    for bad in (
        [(k1, 0, 1, 1.0), (k2, 0, 1, 1.0), (k1, 1, -1, 9.0)],  # retracts a row k1 never held
        [(k1, 0, 1, 1.0), (k2, 0, 2, 1.0), (k1, 1, -1, 1.0)],  # a multiplicity
        [(k1, 0, 1, 1.0), (k2, 0, 1, 1.0), (k1, 1, 1, 3.0)],  # two live rows for k1
    ):
        assert _latest_per_key(*_history(bad)) is None  # the exact merge decides instead
