"""Typed parts are verified (``ingest.verify_typed``) by the full check (``compare_state``)
and the batch check (``check_new_batch``): a real ingest passes both, and a committed part
overwritten with one that keeps its updates but breaks a promise its footer makes to
the typed snapshot (values, bucket label, value column types, ``consolidated``) fails
both, naming the part."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.buckets import bucket_of_keys
from upsert_core.ingest.verify import check_new_batch, compare_state
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.maintenance.check import STORAGE, CheckReport
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.state import BlobPart
from upsert_core.persist.write.consolidate import UPDATE_SCHEMA
from upsert_core.persist.write.parts import (
    CONSOLIDATED_META,
    VALUE_PREFIX,
    OpenPart,
    write_part,
)

from .helpers import memory_shard, schema_of, write_jsonl, write_parquet

BUCKETS = 2
REQUEST = IngestRequest(key=("key",), order="offset", buckets=BUCKETS, inline_threshold=0)
"""Every part a blob, so it can be overwritten in place."""


def _built(tmp_path: Path) -> Shard:
    """Two runs: 40 keys with a float column (NaNs and nulls among them), then updates
    that add a column, and a delete of one key in a second file."""
    shard = memory_shard()
    floats = [math.nan if k % 7 == 0 else None if k % 5 == 0 else k / 3 for k in range(40)]
    first = pa.table({
        "key": pa.array(range(40), pa.int64()),
        "offset": pa.array([0] * 40, pa.int64()),
        "v": pa.array([f"a{k}" for k in range(40)]),
        "f": pa.array(floats, pa.float64()),
    })
    write_parquet(tmp_path, "00.parquet", first)
    ingest(shard, str(tmp_path), REQUEST)
    # A column added by the second run: the first run's parts have no value column for
    # it, and their rows decode to null in it, as a typed read gives.
    write_jsonl(tmp_path, "01.jsonl", [{"key": k, "offset": 1, "v": f"b{k}", "w": k > 1}
                                       for k in (1, 2)])
    write_jsonl(tmp_path, "02.jsonl", [{"key": 3, "offset": 2, "__deleted": True}])
    ingest(shard, str(tmp_path), REQUEST)
    return shard


def _target(shard: Shard) -> BlobPart:
    """A part of the first batch (ts 0)."""
    batch = next(b for b in shard.state().batches if b.lower == 0)
    parts = [p for p in batch.parts if isinstance(p, BlobPart) and p.num_updates >= 4]
    assert parts
    return parts[0]


def _read(shard: Shard, part: BlobPart) -> tuple[pa.Table, pa.Table, tuple[int, int]]:
    """The part's updates, its values (named without the prefix) and its bucket label."""
    opened = OpenPart(shard.blob, part, shard=shard.shard_id)
    try:
        stored = [VALUE_PREFIX + f.name for f in opened.layout.values]
        table = pa.concat_tables(
            opened.read_row_group(i, columns=[*UPDATE_SCHEMA.names, *stored])
            for i in range(opened.num_row_groups)
        )
        assert opened.layout.bucket is not None
        bucket = opened.layout.bucket
    finally:
        opened.close()
    values = table.select(stored).rename_columns([f.name for f in opened.layout.values])
    return table.select(UPDATE_SCHEMA.names), values, bucket


def _overwrite(
    shard: Shard, part: BlobPart, values: pa.Table, bucket: tuple[int, int]
) -> None:
    """Overwrite the part's blob with the same updates, ``values`` and ``bucket``."""
    updates, _, _ = _read(shard, part)
    scratch = MemoryBlob()
    new = write_part(scratch, shard.shard_id, updates, values=values, bucket=bucket,
                     presorted=True, inline_threshold=0)
    assert isinstance(new, BlobPart) and new.num_updates == part.num_updates
    shard.blob.set(part.key, scratch.get(new.key) or b"")


def _reported(shard: Shard, part: BlobPart, *words: str) -> None:
    """Both checks report a problem naming the part and saying ``words``."""
    def named(problems: list[str]) -> list[str]:
        return [p for p in problems if part.key in p and all(w in p for w in words)]

    full = compare_state(shard)
    assert named(full.problems), full.problems
    batch = check_new_batch(shard, 0, 1)
    assert named(batch.of_kind(STORAGE)), batch.problems
    assert not named(check_new_batch(shard, 1).problems)  # the run after is not it


def _ok(report: CheckReport) -> None:
    assert report.ok, report.problems


def test_a_real_ingest_passes_both_checks(tmp_path: Path) -> None:
    shard = _built(tmp_path)
    parts = sum(len(b.parts) for b in shard.state().batches)
    full = compare_state(shard)
    assert full.ok, full.problems
    assert full.typed_parts == parts > BUCKETS
    assert schema_of(shard).names == ("key", "offset", "v", "f", "w")
    first, rest = check_new_batch(shard, 0, 1), check_new_batch(shard, 1)
    _ok(first)
    _ok(rest)
    assert first.counts["typed_parts"] == BUCKETS
    assert first.counts["typed_parts"] + rest.counts["typed_parts"] == parts


def test_wrong_values_are_reported(tmp_path: Path) -> None:
    shard = _built(tmp_path)
    part = _target(shard)
    updates, values, bucket = _read(shard, part)
    v = values.column("v").to_pylist()
    v[2] = "not what the row says"
    _overwrite(shard, part, values.set_column(values.schema.get_field_index("v"), "v",
                                              pa.array(v)), bucket)
    key = updates.column("key")[2].as_py().hex()
    _reported(shard, part, "value column 'v'", "1 row(s) differ", key)


def test_a_nan_that_is_not_the_rows_value_is_reported(tmp_path: Path) -> None:
    shard = _built(tmp_path)
    part = _target(shard)
    _, values, bucket = _read(shard, part)
    index = values.schema.get_field_index("f")
    original = values.column("f")
    assert pc.any(pc.is_nan(original)).as_py()  # the clean part has NaNs, and passes
    # Every non-null float becomes NaN: NaN stays equal to NaN, the rest differ.
    changed = pc.if_else(pc.is_null(original), original, math.nan)
    differing = pc.sum(pc.invert(pc.fill_null(pc.is_nan(original), True))).as_py()
    assert differing
    _overwrite(shard, part, values.set_column(index, "f", changed), bucket)
    _reported(shard, part, "value column 'f'", f"{differing} row(s) differ")


def test_a_missing_value_column_is_reported(tmp_path: Path) -> None:
    shard = _built(tmp_path)
    part = _target(shard)
    _, values, bucket = _read(shard, part)
    _overwrite(shard, part, values.drop_columns(["v"]), bucket)
    _reported(shard, part, "no value column 'v'", f"{part.num_updates} row(s) hold a value")


@pytest.mark.parametrize("label", ["other bucket", "other count"])
def test_a_wrong_bucket_label_is_reported(tmp_path: Path, label: str) -> None:
    shard = _built(tmp_path)
    part = _target(shard)
    updates, values, (b, n) = _read(shard, part)
    assert (bucket_of_keys(updates.column("key"), n) == b).all()
    if label == "other bucket":
        _overwrite(shard, part, values, (1 - b, n))
        key = updates.column("key")[0].as_py().hex()
        _reported(shard, part, f"bucket {1 - b}/{n}",
                  f"{part.num_updates} row(s) have keys of other buckets", key)
    else:
        _overwrite(shard, part, values, (b, n + 1))
        _reported(shard, part, f"bucket {b}/{n + 1}", f"the shard has {n} buckets")


def test_value_columns_of_the_wrong_type_or_name_are_reported(tmp_path: Path) -> None:
    shard = _built(tmp_path)
    part = _target(shard)
    _, values, bucket = _read(shard, part)
    index = values.schema.get_field_index("offset")
    wrong = values.set_column(index, "offset", values.column("offset").cast(pa.float64()))
    _overwrite(shard, part, wrong, bucket)
    _reported(shard, part, "value column 'offset' is double", "says int64")
    _overwrite(shard, part, values.append_column("x", values.column("v")), bucket)
    _reported(shard, part, "value column 'x'", "not a column of the shard's schema")


@pytest.mark.parametrize("lie", ["duplicate", "zero diff"])
def test_a_lying_consolidated_flag_is_reported(tmp_path: Path, lie: str) -> None:
    shard = _built(tmp_path)
    part = _target(shard)
    data = shard.blob.get(part.key) or b""
    table = pq.read_table(pa.BufferReader(data))
    assert table.schema.metadata[CONSOLIDATED_META] == b"1"
    rows = table.to_pylist()
    if lie == "duplicate":
        # Row 2 retracts row 1: sorted, not consolidated (a typed read of the lone part
        # keeps row 1), and across the boundary of the two-row row groups written below.
        rows[2] = {**rows[1], "diff": -1}
        words = ("says consolidated", "1 row(s) repeat", rows[1]["key"].hex())
    else:
        rows[3] = {**rows[3], "diff": 0}
        words = ("says consolidated", "1 row(s) have diff 0", rows[3]["key"].hex())
    lying = pa.Table.from_pylist(rows, schema=table.schema).replace_schema_metadata({
        **table.schema.metadata, CONSOLIDATED_META: b"1",  # the part format kept too
    })
    sink = pa.BufferOutputStream()
    pq.write_table(lying, sink, row_group_size=2)
    shard.blob.set(part.key, sink.getvalue().to_pybytes())
    _reported(shard, part, *words)
