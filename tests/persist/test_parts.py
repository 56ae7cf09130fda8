"""Batch parts and error parts: round trips, validation, corruption, consolidation."""

from __future__ import annotations

import hashlib
from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from upsert_core.errors import CorruptData, InvalidUsage
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.state.state import BlobPart, InlinePart
from upsert_core.persist.write.consolidate import (
    advance_ts,
    consolidate,
    consolidate_sorted,
    is_sorted,
    sort_updates,
)
from upsert_core.persist.write.parts import (
    ERROR_SCHEMA,
    delete_parts,
    read_error_part,
    read_part,
    read_part_table,
    write_batch,
    write_error_batch,
    write_part,
    write_parts,
)

SHARD = "s1"

Update = tuple[bytes, bytes, int, int]


def key(i: int) -> bytes:
    return i.to_bytes(16, "big")


def updates_table(updates: list[Update]) -> pa.Table:
    return pa.table(
        {
            "key": pa.array([u[0] for u in updates], pa.binary()),
            "row": pa.array([u[1] for u in updates], pa.binary()),
            "ts": pa.array([u[2] for u in updates], pa.int64()),
            "diff": pa.array([u[3] for u in updates], pa.int64()),
        }
    )


def rows_of(table: pa.Table) -> list[Update]:
    d = table.to_pydict()
    return list(zip(d["key"], d["row"], d["ts"], d["diff"], strict=True))


updates_strategy = st.lists(
    st.tuples(
        st.integers(0, 6).map(key),
        st.sampled_from([b"", b"a", b"b", b"ab", b"\x00", b"\xff" * 3]),
        st.integers(0, 4),
        st.integers(-2, 2),
    ),
    max_size=40,
)


def model_consolidate(updates: list[Update]) -> list[Update]:
    acc: Counter[tuple[bytes, bytes, int]] = Counter()
    for k, r, t, d in updates:
        acc[(k, r, t)] += d
    return sorted((k, r, t, d) for (k, r, t), d in acc.items() if d != 0)


# --- parts ----------------------------------------------------------------------------


@given(updates_strategy, st.sampled_from([0, 10**9]))
def test_part_round_trip_sorts_and_keeps_every_update(
    updates: list[Update], threshold: int
) -> None:
    blob = MemoryBlob()
    part = write_part(blob, SHARD, updates_table(updates), inline_threshold=threshold)
    assert part.num_updates == len(updates)
    assert isinstance(part, InlinePart if threshold else BlobPart)
    back = read_part_table(blob, part)
    assert rows_of(back) == sorted(updates, key=lambda u: u[:3])
    assert is_sorted(back)


def test_small_parts_are_inline_and_big_ones_are_blobs() -> None:
    blob = MemoryBlob()
    small = write_part(blob, SHARD, updates_table([(key(1), b"x", 0, 1)]))
    assert isinstance(small, InlinePart)
    assert list(blob.list_keys("")) == []
    # Rows that do not compress (zstd would shrink repeated bytes under the threshold).
    big_rows = [(key(i), hashlib.sha512(i.to_bytes(4, "big")).digest(), 0, 1)
                for i in range(500)]
    big = write_part(blob, SHARD, updates_table(big_rows))
    assert isinstance(big, BlobPart)
    assert big.key.startswith(f"{SHARD}/part/") and big.key.endswith(".parquet")
    assert blob.get(big.key) is not None
    assert big.encoded_size_bytes == len(blob.get(big.key) or b"")


def test_read_part_streams_in_record_batches() -> None:
    blob = MemoryBlob()
    rows = [(key(i), b"v", 0, 1) for i in range(100)]
    part = write_part(blob, SHARD, updates_table(rows), inline_threshold=0, row_group_rows=16)
    batches = list(read_part(blob, part, batch_rows=7))
    assert len(batches) > 10
    assert all(b.num_rows <= 7 for b in batches)
    assert rows_of(pa.Table.from_batches(batches)) == rows


def test_write_parts_and_write_batch_split_by_rows() -> None:
    blob = MemoryBlob()
    rows = [(key(i % 7), bytes([i]), 3, 1) for i in range(25)]
    parts = write_parts(blob, SHARD, updates_table(rows), part_rows=10, inline_threshold=0)
    assert [p.num_updates for p in parts] == [10, 10, 5]
    merged = pa.concat_tables(read_part_table(blob, p) for p in parts)
    assert rows_of(merged) == sorted(rows)
    batch = write_batch(blob, SHARD, updates_table(rows), 3, 4, part_rows=10)
    assert (batch.lower, batch.upper, batch.since, batch.num_updates) == (3, 4, 0, 25)
    assert write_batch(blob, SHARD, updates_table([]), 0, 1).parts == ()
    with pytest.raises(InvalidUsage, match=r"\[0, 3\) holds updates at ts 3..3"):
        write_batch(blob, SHARD, updates_table(rows), 0, 3)
    with pytest.raises(InvalidUsage, match="lower < upper"):
        write_batch(blob, SHARD, updates_table(rows), 3, 3)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (updates_table([(b"short", b"r", 0, 1)]), "keys must be 16 bytes"),
        (pa.table({"key": [key(1)], "row": [b"r"], "ts": [0]}), "missing column"),
        (
            pa.table({"key": [key(1)], "row": [None], "ts": [0], "diff": [1]}).cast(
                pa.schema([("key", pa.binary()), ("row", pa.binary()), ("ts", pa.int64()),
                           ("diff", pa.int64())])
            ),
            "nulls in column 'row'",
        ),
        (pa.table({"key": [key(1)], "row": [b"r"], "ts": ["x"], "diff": [1]}), "schema"),
    ],
)
def test_write_part_rejects_malformed_updates(table: pa.Table, message: str) -> None:
    with pytest.raises(InvalidUsage, match=message):
        write_part(MemoryBlob(), SHARD, table)


def test_truncated_blob_part_is_corrupt_data_naming_shard_and_key() -> None:
    blob = MemoryBlob()
    rows = [(key(i), b"row-%d" % i, 0, 1) for i in range(300)]
    part = write_part(blob, SHARD, updates_table(rows), inline_threshold=0)
    assert isinstance(part, BlobPart)
    data = blob.get(part.key) or b""
    blob.set(part.key, data[: len(data) // 2])
    with pytest.raises(CorruptData) as info:
        list(read_part(blob, part))
    assert part.key in str(info.value) and f"shard {SHARD}" in str(info.value)


def test_garbage_inline_part_is_corrupt_data() -> None:
    part = InlinePart(data=b"PAR1 not really", num_updates=1)
    with pytest.raises(CorruptData, match=f"shard {SHARD}: inline part is not valid Parquet"):
        list(read_part(MemoryBlob(), part, shard=SHARD))


def test_missing_blob_part_is_corrupt_data() -> None:
    part = BlobPart(key=f"{SHARD}/part/gone.parquet", encoded_size_bytes=10, num_updates=1)
    with pytest.raises(CorruptData, match="gone.parquet is referenced by the state but missing"):
        list(read_part(MemoryBlob(), part))


def test_part_with_wrong_count_or_schema_is_corrupt_data() -> None:
    blob = MemoryBlob()
    part = write_part(blob, SHARD, updates_table([(key(1), b"a", 0, 1)]))
    assert isinstance(part, InlinePart)
    lying = InlinePart(data=part.data, num_updates=2)
    with pytest.raises(CorruptData, match="holds 1 rows but the state says 2"):
        list(read_part(blob, lying, shard=SHARD))
    errors = write_error_batch(
        blob, SHARD, 0, pa.table({"file": ["f"], "row": [1], "reason": ["bad"]})
    )
    with pytest.raises(CorruptData, match="has schema"):
        list(read_part(blob, errors.part, shard=SHARD))


def test_error_parts_round_trip() -> None:
    blob = MemoryBlob()
    table = pa.table(
        {"file": ["a.jsonl", "a.jsonl"], "row": [3, 9], "reason": ["null key", "bad json"]}
    )
    batch = write_error_batch(blob, SHARD, 5, table, inline_threshold=0)
    assert (batch.ts, batch.num_errors) == (5, 2)
    assert isinstance(batch.part, BlobPart) and batch.part.key.startswith(f"{SHARD}/errors/")
    assert read_error_part(blob, batch.part).equals(table.cast(ERROR_SCHEMA))


def test_delete_parts_deletes_only_blob_parts() -> None:
    blob = MemoryBlob()
    rows = updates_table([(key(1), b"a", 0, 1)])
    inline = write_part(blob, SHARD, rows)
    stored = write_part(blob, SHARD, rows, inline_threshold=0)
    assert delete_parts(blob, [inline, stored]) == 1
    assert list(blob.list_keys(SHARD)) == []


# --- consolidation ----------------------------------------------------------------------


@given(updates_strategy)
def test_consolidate_matches_model(updates: list[Update]) -> None:
    result = consolidate(updates_table(updates))
    assert rows_of(result) == model_consolidate(updates)
    assert is_sorted(result)


@given(updates_strategy, st.integers(0, 5))
def test_advance_keeps_order_and_consolidate_sorted_agrees(
    updates: list[Update], frontier: int
) -> None:
    advanced = advance_ts(sort_updates(updates_table(updates)), frontier)
    assert is_sorted(advanced)
    expected = model_consolidate([(k, r, max(t, frontier), d) for k, r, t, d in updates])
    assert rows_of(consolidate_sorted(advanced)) == expected


def test_is_sorted_detects_disorder() -> None:
    assert not is_sorted(updates_table([(key(2), b"a", 0, 1), (key(1), b"a", 0, 1)]))
    assert not is_sorted(updates_table([(key(1), b"a", 1, 1), (key(1), b"a", 0, 1)]))
    assert is_sorted(updates_table([(key(1), b"a", 0, 1), (key(1), b"a", 0, 1)]))


@given(
    st.lists(
        st.tuples(
            st.one_of(st.binary(min_size=16, max_size=16), st.sampled_from([b"\xff" * 16])),
            st.binary(max_size=3),
            st.integers(-3, 3),
            st.integers(-2, 2),
        ),
        max_size=30,
    )
)
def test_numeric_key_sort_orders_like_bytes(updates: list[Update]) -> None:
    result = consolidate(updates_table(updates))
    assert rows_of(result) == model_consolidate(updates)


@given(
    st.lists(
        st.tuples(
            st.binary(max_size=18),  # keys of any length take the binary-compare path
            st.binary(max_size=2),
            st.integers(0, 2),
            st.integers(-2, 2),
        ),
        max_size=30,
    )
)
def test_consolidate_handles_keys_of_any_length(updates: list[Update]) -> None:
    table = updates_table(updates)
    assert rows_of(consolidate(table)) == model_consolidate(updates)
    assert rows_of(consolidate_sorted(sort_updates(table))) == model_consolidate(updates)
