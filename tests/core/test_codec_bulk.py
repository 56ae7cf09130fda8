"""The bulk encoder: ``encode_columns`` is byte-identical to ``encode_datums`` row by row
(with and without dropping trailing nulls), on every supported Arrow type, nulls, slices
and chunked input; ``key_digests`` equals ``key_digest``; unsupported input says None."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from upsert_core.codec import (
    encode_columns,
    encode_datums,
    encodes_in_bulk,
    key_digest,
    key_digests,
)
from upsert_core.landing.rows import encode_row

_UTC = dt.UTC

_DATETIMES = st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31))

COLUMN_KINDS: dict[str, tuple[pa.DataType, st.SearchStrategy[Any]]] = {
    "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "int8": (pa.int8(), st.integers(-128, 127)),
    "uint64": (pa.uint64(), st.integers(0, 2**63 - 1)),
    "float64": (pa.float64(), st.floats(allow_nan=True, allow_infinity=True)),
    "float32": (pa.float32(), st.floats(width=32, allow_nan=True)),
    "bool": (pa.bool_(), st.booleans()),
    "string": (pa.string(), st.text(max_size=12)),
    "large_string": (pa.large_string(), st.text(max_size=5)),
    "binary": (pa.binary(), st.binary(max_size=12)),
    "ts_us_utc": (pa.timestamp("us", tz="UTC"), _DATETIMES.map(lambda d: d.replace(tzinfo=_UTC))),
    "ts_ms": (pa.timestamp("ms"), _DATETIMES.map(lambda d: d.replace(microsecond=0))),
    "ts_us_naive": (pa.timestamp("us"), _DATETIMES),
    "date32": (pa.date32(), st.dates()),
    "null": (pa.null(), st.none()),
}


@st.composite
def tables(draw: st.DrawFn) -> tuple[list[pa.Array], int]:
    n = draw(st.integers(0, 25))
    kinds = draw(st.lists(st.sampled_from(sorted(COLUMN_KINDS)), min_size=1, max_size=5))
    columns = []
    for kind in kinds:
        typ, values = COLUMN_KINDS[kind]
        items = draw(st.lists(st.one_of(st.none(), values), min_size=n + 2, max_size=n + 2))
        arr = pa.array(items, type=typ)
        columns.append(arr.slice(1, n))  # exercise non-zero array offsets
    return columns, n


def _row_values(columns: list[pa.Array], i: int) -> list[Any]:
    return [col[i].as_py() for col in columns]


@given(tables(), st.booleans())
def test_encode_columns_is_byte_identical_to_encode_datums(
    data: tuple[list[pa.Array], int], drop: bool
) -> None:
    columns, n = data
    got = encode_columns(columns, drop_trailing_nulls=drop)
    assert got is not None
    encode = encode_row if drop else encode_datums
    expected = [encode(_row_values(columns, i)) for i in range(n)]
    assert got.to_pylist() == expected


@given(tables())
def test_chunked_columns_encode_like_whole_ones(data: tuple[list[pa.Array], int]) -> None:
    columns, n = data
    half = n // 2
    chunked = [pa.chunked_array([c.slice(0, half), c.slice(half)], type=c.type) for c in columns]
    assert encode_columns(chunked) == encode_columns(columns)


@given(st.lists(st.binary(max_size=30), max_size=20))
def test_key_digests_equal_key_digest(values: list[bytes]) -> None:
    arr = pa.array([b"pad", *values], pa.binary()).slice(1)
    assert key_digests(arr) == [key_digest(v) for v in values]


@given(st.integers(1, 12), st.lists(st.binary(min_size=12, max_size=12), max_size=20),
       st.integers(0, 3))
def test_key_digests_of_equal_width_keys(width: int, values: list[bytes], cut: int) -> None:
    # All keys the same width (the fast path), in a sliced array; and one key longer.
    same = [v[:width] for v in values]
    arr = pa.array([b"x" * cut, *same], pa.binary()).slice(1)
    assert key_digests(arr) == [key_digest(v) for v in same]
    mixed = [*same, b"y" * (width + 1)]
    assert key_digests(pa.array(mixed, pa.binary())) == [key_digest(v) for v in mixed]


def test_canonical_floats_and_trailing_nulls() -> None:
    floats = pa.array([-0.0, float("nan"), None, 1.5], pa.float64())
    strings = pa.array(["a", None, None, None], pa.string())
    got = encode_columns([floats, strings], drop_trailing_nulls=True)
    assert got is not None
    assert got.to_pylist() == [
        encode_datums([0.0, "a"]),
        encode_datums([float("nan")]),
        encode_datums([]),
        encode_datums([1.5]),
    ]


@pytest.mark.parametrize(
    "column",
    [
        pa.array([[1]], pa.list_(pa.int64())),  # unsupported type
        pa.array([2**64 - 1], pa.uint64()),  # outside int64: the row encoder reports it
        pa.array([1], pa.timestamp("ns")),  # not exactly microseconds
        pa.array([10**18], pa.timestamp("us")),  # beyond Python's datetimes
    ],
)
def test_unsupported_input_falls_back(column: pa.Array) -> None:
    assert encode_columns([pa.array([1], pa.int64()), column]) is None


@given(tables())
def test_encodes_in_bulk_is_never_wrong(data: tuple[list[pa.Array], int]) -> None:
    columns, _ = data
    if encodes_in_bulk(columns):
        assert encode_columns(columns, drop_trailing_nulls=True) is not None


@pytest.mark.parametrize(
    "column",
    [
        pa.array([10**18], pa.timestamp("us", tz="UTC")),  # beyond Python's datetimes
        pa.array([-(10**18)], pa.timestamp("us")),
        pa.array([2**31 - 1], pa.date32()),
        pa.array([b"\xff"], pa.binary()).cast(pa.string(), safe=False),  # not UTF-8
        pa.array([1], pa.timestamp("ms")),  # not the stored unit: not vouched for
        pa.array([[1]], pa.list_(pa.int64())),
    ],
)
def test_encodes_in_bulk_refuses_what_may_not_encode(column: pa.Array) -> None:
    assert not encodes_in_bulk([pa.array([1], pa.int64()), column])


def test_encodes_in_bulk_vouches_for_the_stored_types() -> None:
    columns = [
        pa.array([1, None], pa.int64()), pa.array([-0.0, float("nan")]),
        pa.array([True, None]), pa.array(["é", None]), pa.array([b"\x00", None]),
        pa.array([0, None], pa.timestamp("us", tz="UTC")), pa.array([0, None], pa.date32()),
    ]
    assert encodes_in_bulk(columns)
    assert encodes_in_bulk([pa.chunked_array([c, c]) for c in columns])
