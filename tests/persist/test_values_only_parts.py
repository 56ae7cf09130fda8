"""Part format 3 (``parts``): each row stored once, as its value columns, with ``row``
computed from them on read; readers see exactly the updates that were written."""

from __future__ import annotations

import datetime as dt
import io
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from upsert_core.errors import CorruptData, InvalidUsage
from upsert_core.landing import LogicalType, SourceSchema
from upsert_core.landing.rows import decode_rows_to_table, encode_key, encode_row
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.state.state import BlobPart, InlinePart
from upsert_core.persist.write.parts import (
    FORMAT_META,
    OpenPart,
    read_part_table,
    rows_of_values,
    write_part,
)

T = LogicalType
SCHEMA = SourceSchema(columns=(
    ("key", T.INT64), ("offset", T.INT64), ("s", T.STRING), ("f", T.FLOAT64),
    ("t", T.TIMESTAMP), ("d", T.DATE), ("b", T.BOOL), ("y", T.BINARY),
))

floats = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([0.0, -0.0, math.nan, -math.nan]))
timestamps = st.one_of(st.none(), st.datetimes(
    min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31, 23, 59, 59),
    timezones=st.just(dt.UTC)))
rows = st.tuples(
    st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1),
    st.one_of(st.none(), st.text()), floats, timestamps,
    st.one_of(st.none(), st.dates()), st.one_of(st.none(), st.booleans()),
    st.one_of(st.none(), st.binary(max_size=20)),
)


def _encoded(values: list[tuple[object, ...]]) -> pa.Array:
    return pa.array([encode_row(list(v)) for v in values], pa.binary())


@settings(max_examples=200)
@given(values=st.lists(rows, min_size=1, max_size=30))
def test_rows_of_decoded_values_are_the_rows_byte_for_byte(
    values: list[tuple[object, ...]],
) -> None:
    # What makes dropping ``row`` lossless: encode(decode(row)) == row, trailing nulls,
    # -0.0, every NaN, timestamps and dates included.
    encoded = _encoded(values)
    decoded = decode_rows_to_table(SCHEMA, encoded)
    assert rows_of_values(decoded.columns).to_pylist() == encoded.to_pylist()


def test_rows_of_values_falls_back_row_by_row_where_the_bulk_encoder_declines() -> None:
    # A column type the vectorised encoder declines (dictionary-encoded strings) is
    # encoded row by row, to the same bytes.
    strings = pa.array(["a", None, "c"]).dictionary_encode()
    ints = pa.array([1, 2, None], pa.int64())
    want = [encode_row(["a", 1]), encode_row([None, 2]), encode_row(["c", None])]
    assert rows_of_values([strings, ints]).to_pylist() == want


def _updates(n: int) -> tuple[pa.Table, pa.Table]:
    values = [(i, i * 2, f"s{i}" * (i % 4), -0.0 if i % 2 else None,
               dt.datetime(2024, 1, 1, tzinfo=dt.UTC), None, i % 3 == 0, None)
              for i in range(n)]
    encoded = _encoded(values)
    updates = pa.table({
        "key": pa.array([encode_key([v[0]]) for v in values], pa.binary()),
        "row": encoded,
        "ts": pa.array([3] * n, pa.int64()),
        "diff": pa.array([1 if i % 5 else -1 for i in range(n)], pa.int64()),
    })
    return updates, decode_rows_to_table(SCHEMA, encoded)


@pytest.mark.parametrize("n", [3, 5000])  # inline, and a blob of two row groups
def test_a_values_only_part_stores_no_row_and_reads_back_the_same_updates(n: int) -> None:
    blob = MemoryBlob()
    updates, values = _updates(n)
    part = write_part(blob, "s", updates, values=values, bucket=(0, 1), values_only=True,
                      inline_threshold=4096, row_group_rows=4096)
    assert isinstance(part, InlinePart if n == 3 else BlobPart)
    data = part.data if isinstance(part, InlinePart) else blob.get(part.key)
    assert data is not None
    stored = pq.read_schema(io.BytesIO(data))
    assert "row" not in stored.names and stored.metadata[FORMAT_META] == b"3"
    want = updates.sort_by([("key", "ascending"), ("row", "ascending"), ("ts", "ascending")])
    assert read_part_table(blob, part, shard="s").equals(want)
    opened = OpenPart(blob, part, shard="s")
    try:
        assert opened.layout.derived_rows and opened.layout.consolidated
        assert opened.read_whole(["row", "ts"]).column("row").to_pylist() == (
            want.column("row").to_pylist())
        assert opened.read_whole(["diff"]).column_names == ["diff"]
    finally:
        opened.close()


def test_a_values_only_part_needs_values() -> None:
    updates, _ = _updates(3)
    with pytest.raises(InvalidUsage, match="format 3"):
        write_part(MemoryBlob(), "s", updates, values_only=True)


def test_a_part_format_this_release_does_not_know_is_refused_by_name() -> None:
    blob = MemoryBlob()
    updates, values = _updates(3)
    part = write_part(blob, "s", updates, values=values, values_only=True)
    assert isinstance(part, InlinePart)
    table = pq.read_table(io.BytesIO(part.data))
    sink = io.BytesIO()
    pq.write_table(table.replace_schema_metadata({FORMAT_META: b"4"}), sink)
    newer = InlinePart(data=sink.getvalue(), num_updates=3)
    with pytest.raises(CorruptData, match="part format '4'.*cannot read.*upgrade"):
        read_part_table(blob, newer, shard="s")
