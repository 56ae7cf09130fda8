"""The bulk decoder: ``decode_columns`` inverts ``encode_columns`` and gives, for every
row, exactly what ``decode_row`` gives (nulls, missing trailing columns, NaN, -0.0,
extreme values, unicode); damaged bytes raise CodecError or decode like the per-row
decoder, never anything else; slices, chunks and large offsets decode like whole
arrays; ``decode_rows_to_table`` builds the table the Parquet snapshot writes."""

from __future__ import annotations

import datetime as dt
import math
import struct
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from upsert_core.codec import (
    decode_datums,
    encode_columns,
    encode_columns_in_chunks,
    encode_datums,
)
from upsert_core.codec_columns import decode_columns
from upsert_core.errors import CodecError
from upsert_core.landing import ARROW_TYPES, LogicalType, SourceSchema
from upsert_core.landing.rows import decode_row, decode_rows_to_table, encode_row

_UTC = dt.UTC

VALUES: dict[LogicalType, st.SearchStrategy[Any]] = {
    LogicalType.INT64: st.one_of(
        st.integers(-(2**63), 2**63 - 1), st.sampled_from([-(2**63), 2**63 - 1, 0, -1])
    ),
    LogicalType.FLOAT64: st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([-0.0, math.nan, -math.inf, 5e-324, 1.7976931348623157e308]),
    ),
    LogicalType.STRING: st.one_of(st.text(max_size=12), st.sampled_from(["", "\u00e9\U0001f600"])),
    LogicalType.BOOL: st.booleans(),
    LogicalType.TIMESTAMP: st.datetimes(
        min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31, 23, 59, 59, 999999)
    ).map(lambda d: d.replace(tzinfo=_UTC)),
    LogicalType.DATE: st.dates(),
    LogicalType.BINARY: st.binary(max_size=12),
}
KINDS = sorted(VALUES)


def _schema(types: list[LogicalType]) -> SourceSchema:
    return SourceSchema(key=("c0",), columns=tuple((f"c{i}", t) for i, t in enumerate(types)))


@st.composite
def typed_rows(draw: st.DrawFn) -> tuple[SourceSchema, list[pa.Array], int]:
    """A schema, columns for its first ``written`` columns, and how many rows."""
    n = draw(st.integers(0, 20))
    types = draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=6))
    written = draw(st.integers(1, len(types)))  # later columns were "added later"
    columns = []
    for t in types[:written]:
        items = draw(st.lists(st.one_of(st.none(), VALUES[t]), min_size=n + 2, max_size=n + 2))
        columns.append(pa.array(items, type=ARROW_TYPES[t]).slice(1, n))
    return _schema(types), columns, n


def _norm(v: object) -> object:
    """Exact comparison key: floats by their bits (NaN == NaN, 0.0 != -0.0)."""
    if isinstance(v, float):
        return ("float", struct.pack("<d", v))
    return (type(v).__name__, v)


def _rows_norm(rows: list[dict[str, object]]) -> list[list[object]]:
    return [[_norm(v) for v in r.values()] for r in rows]


def _canonical(v: object) -> object:
    """What the codec stores for ``v``: -0.0 as 0.0, every NaN as the one NaN."""
    if isinstance(v, float):
        return math.nan if v != v else (0.0 if v == 0 else v)
    return v


def _encoded(columns: list[pa.Array]) -> pa.Array:
    enc = encode_columns(columns, drop_trailing_nulls=True)
    assert enc is not None
    return enc


@given(typed_rows())
def test_decode_columns_inverts_encode_columns_and_equals_decode_row(
    data: tuple[SourceSchema, list[pa.Array], int],
) -> None:
    schema, columns, n = data
    rows = _encoded(columns)
    table = decode_rows_to_table(schema, rows)
    assert table.schema == pa.schema([pa.field(nm, ARROW_TYPES[t]) for nm, t in schema.columns])
    assert table.num_rows == n
    got = table.to_pylist()
    # Equal to the per-row decoder, exactly (float bits, types, tz-aware datetimes).
    assert _rows_norm(got) == _rows_norm([decode_row(schema, r) for r in rows.to_pylist()])
    # Equal to the original values (canonicalised), null in the columns never written.
    for c, name in enumerate(schema.names):
        original = columns[c].to_pylist() if c < len(columns) else [None] * n
        assert [_norm(v) for v in table.column(name).to_pylist()] == [
            _norm(_canonical(v)) for v in original
        ]


@given(typed_rows(), st.data())
def test_slices_and_chunks_decode_like_the_whole(
    data: tuple[SourceSchema, list[pa.Array], int], draw: st.DataObject
) -> None:
    schema, columns, n = data
    rows = _encoded(columns)
    whole = decode_rows_to_table(schema, rows).to_pylist()
    cut = draw.draw(st.integers(0, n))
    lo = draw.draw(st.integers(0, cut))
    chunked = pa.chunked_array([rows.slice(0, lo), rows.slice(lo, cut - lo), rows.slice(cut)])
    assert _rows_norm(decode_rows_to_table(schema, chunked).to_pylist()) == _rows_norm(whole)
    large = rows.cast(pa.large_binary())
    assert _rows_norm(decode_rows_to_table(schema, large.slice(lo)).to_pylist()) == _rows_norm(
        whole[lo:]
    )


def test_decode_rows_to_table_matches_the_parquet_snapshot_columns() -> None:
    # orchestration.cli.output._ParquetWriter builds each column with pa.array(decoded
    # values, type=ARROW_TYPES[...]) against the schema of (name, ARROW_TYPES[type]).
    schema = _schema(list(LogicalType))
    values = [
        7,
        -0.0,
        "s\u00e9",
        True,
        dt.datetime(2024, 2, 29, 12, 0, 0, 1, tzinfo=_UTC),
        dt.date(1969, 12, 31),
        b"\x00\xff",
    ]
    rows = pa.array([encode_row(values), encode_row(values[:3]), encode_row([None])], pa.binary())
    decoded = [decode_row(schema, r) for r in rows.to_pylist()]
    pq_schema = pa.schema([pa.field(nm, ARROW_TYPES[t]) for nm, t in schema.columns])
    expected = pa.Table.from_arrays(
        [pa.array([r.get(f.name) for r in decoded], type=f.type) for f in pq_schema],
        schema=pq_schema,
    )
    got = decode_rows_to_table(schema, rows)
    assert got.schema == expected.schema
    assert got.equals(expected)


# --- damaged input -----------------------------------------------------------------------


def _row_failure(schema: SourceSchema, raw: bytes | None) -> dict[str, object] | None:
    """decode_row of one row plus the column-type check; None if the row fails."""
    want = {
        LogicalType.INT64: int,
        LogicalType.FLOAT64: float,
        LogicalType.STRING: str,
        LogicalType.BOOL: bool,
        LogicalType.TIMESTAMP: dt.datetime,
        LogicalType.DATE: dt.date,
        LogicalType.BINARY: bytes,
    }
    try:
        row = decode_row(schema, raw)  # type: ignore[arg-type]
    except CodecError:
        return None
    for (_, t), v in zip(schema.columns, row.values(), strict=True):
        if v is not None and type(v) is not want[t]:
            return None
    return row


def _check_damaged(schema: SourceSchema, rows: list[bytes | None]) -> None:
    """CodecError naming the first failing row, or exactly decode_row's values."""
    decoded = [_row_failure(schema, r) for r in rows]
    failing = [i for i, row in enumerate(decoded) if row is None]
    arr = pa.array(rows, pa.binary())
    if failing:
        with pytest.raises(CodecError, match=f"^row {failing[0]}: "):
            decode_rows_to_table(schema, arr)
    else:
        got = decode_rows_to_table(schema, arr).to_pylist()
        assert _rows_norm(got) == _rows_norm(decoded)  # type: ignore[arg-type]


_MUTATIONS = st.one_of(
    st.tuples(st.just("set"), st.integers(0, 10_000), st.integers(0, 255)),
    st.tuples(st.just("tag"), st.integers(0, 10_000), st.integers(0, 10)),
    st.tuples(st.just("cut"), st.integers(0, 10_000), st.just(0)),
    st.tuples(st.just("add"), st.integers(0, 10_000), st.integers(0, 255)),
    st.tuples(st.just("del"), st.integers(0, 10_000), st.just(0)),
)


def _mutate(row: bytes, how: tuple[str, int, int]) -> bytes:
    kind, at, byte = how
    b = bytearray(row)
    i = at % (len(b) + 1)
    if kind in ("set", "tag") and i < len(b):
        b[i] = byte
    elif kind == "cut":
        del b[i:]
    elif kind == "add":
        b.insert(i, byte)
    elif kind == "del" and i < len(b):
        del b[i]
    return bytes(b)


@settings(max_examples=300)
@given(typed_rows(), st.data())
def test_damaged_rows_raise_or_decode_like_decode_row(
    data: tuple[SourceSchema, list[pa.Array], int], draw: st.DataObject
) -> None:
    schema, columns, n = data
    rows: list[bytes | None] = list(_encoded(columns).to_pylist())
    if not rows:
        rows = [encode_row([None])]
    for _ in range(draw.draw(st.integers(1, 3))):
        i = draw.draw(st.integers(0, len(rows) - 1))
        row = rows[i]
        assert row is not None
        rows[i] = _mutate(row, draw.draw(_MUTATIONS))
    _check_damaged(schema, rows)


@given(
    st.lists(st.sampled_from(KINDS), min_size=1, max_size=4),
    st.lists(st.binary(max_size=24).map(lambda b: b"\x01" + b), min_size=1, max_size=8),
)
def test_random_bytes_raise_or_decode_like_decode_row(
    types: list[LogicalType], rows: list[bytes]
) -> None:
    _check_damaged(_schema(types), list(rows))


def _str_datum(payload: bytes) -> bytes:
    return b"\x01\x05" + struct.pack("<I", len(payload)) + payload


@pytest.mark.parametrize(
    ("types", "row", "message"),
    [
        ([LogicalType.STRING], _str_datum(b"\xed\xa0\x80"), "invalid UTF-8"),  # surrogate
        ([LogicalType.STRING], _str_datum(b"\xc0\xaf"), "invalid UTF-8"),  # overlong
        ([LogicalType.STRING], _str_datum(b"\xf4\x90\x80\x80"), "invalid UTF-8"),  # > U+10FFFF
        ([LogicalType.STRING], _str_datum(b"abc")[:-1], "truncated"),
        ([LogicalType.FLOAT64], b"\x01\x04" + struct.pack("<d", -0.0), "non-canonical"),
        ([LogicalType.FLOAT64], b"\x01\x04" + struct.pack("<Q", 0x7FF8000000000001), "non-can"),
        ([LogicalType.FLOAT64], b"\x01\x04" + struct.pack("<Q", 0xFFF8000000000000), "non-can"),
        ([LogicalType.TIMESTAMP], b"\x01\x07" + struct.pack("<q", -(2**63)), "out of range"),
        ([LogicalType.DATE], b"\x01\x08" + struct.pack("<i", 2**31 - 1), "out of range"),
        ([LogicalType.INT64], b"\x01\x03\x00", "truncated"),
        ([LogicalType.INT64], b"\x01\x09", "unknown datum tag"),
        ([LogicalType.INT64], b"\x02\x00", "codec version"),
        ([LogicalType.INT64], b"", "empty encoding"),
        ([LogicalType.INT64], b"\x01\x00\x00", "schema has only 1 columns"),
        ([LogicalType.INT64], encode_datums([1.0]), "column 0 holds a float datum"),
        ([LogicalType.BOOL], encode_datums([1]), "column 0 holds a int datum"),
        ([LogicalType.STRING], encode_datums([b"x"]), "column 0 holds a bytes datum"),
    ],
)
def test_bad_rows_raise_codec_error_naming_the_row(
    types: list[LogicalType], row: bytes, message: str
) -> None:
    schema = _schema(types)
    good = encode_row([None])
    rows = pa.array([good, good, row, good], pa.binary())
    with pytest.raises(CodecError, match=message) as info:
        decode_rows_to_table(schema, rows)
    assert str(info.value).startswith("row 2: ")
    if "column 0 holds" not in message:  # the per-row decoder's own message
        with pytest.raises(CodecError) as per_row:
            decode_row(schema, row)
        assert str(info.value) == f"row 2: {per_row.value}"


@pytest.mark.parametrize("bad_at", [0, 1, 5, 6, 9])
def test_the_first_failing_row_is_named_whatever_fails_later(bad_at: int) -> None:
    # Row ``bad_at`` holds invalid UTF-8 (found only by bisection); every later row is
    # structurally broken, which the vectorised checks see first.
    schema = _schema([LogicalType.STRING, LogicalType.INT64])
    good = encode_row(["ok", 1])
    rows = [good] * 10
    rows[bad_at] = _str_datum(b"\xff")
    for i in range(bad_at + 1, 10):
        rows[i] = b"\x01\x09" if i % 2 else b"\x02"
    with pytest.raises(CodecError, match=f"^row {bad_at}: invalid UTF-8"):
        decode_rows_to_table(schema, pa.array(rows, pa.binary()))


def test_null_row_raises_like_decode_row() -> None:
    schema = _schema([LogicalType.INT64])
    with pytest.raises(CodecError, match="row 1: expected bytes"):
        decode_rows_to_table(schema, pa.array([encode_row([1]), None], pa.binary()))


def test_row_index_counts_across_chunks() -> None:
    schema = _schema([LogicalType.INT64])
    good = encode_row([1])
    rows = pa.chunked_array([pa.array([good, good]), pa.array([good, b"\x01\x09"])])
    with pytest.raises(CodecError, match="row 3: unknown datum tag"):
        decode_rows_to_table(schema, rows)


def test_empty_input_and_unsupported_types() -> None:
    schema = _schema([LogicalType.INT64, LogicalType.STRING])
    empty = decode_rows_to_table(schema, pa.array([], pa.binary()))
    assert empty.num_rows == 0 and empty.column_names == ["c0", "c1"]
    assert decode_rows_to_table(schema, pa.chunked_array([], pa.binary())).num_rows == 0
    with pytest.raises(TypeError):
        decode_columns(pa.array([encode_row([1])]), [pa.int32()])
    with pytest.raises(TypeError):
        decode_columns(pa.array(["x"]), [pa.int64()])


def test_decode_columns_null_and_large_types() -> None:
    rows = pa.array([encode_datums([None, "a", b"b"]), encode_datums([])], pa.binary())
    got = decode_columns(rows, [pa.null(), pa.large_string(), pa.large_binary()], ["n", "s", "b"])
    assert got.schema.types == [pa.null(), pa.large_string(), pa.large_binary()]
    assert got.to_pylist() == [{"n": None, "s": "a", "b": b"b"}, {"n": None, "s": None, "b": None}]
    assert [decode_datums(r) for r in rows.to_pylist()] == [(None, "a", b"b"), ()]


@pytest.mark.parametrize("chunk_rows", [1, 3, 7, 1000])
def test_encoding_in_chunks_on_threads_gives_the_same_bytes(chunk_rows: int) -> None:
    columns = [
        pa.array([1, None, 3, 4, 5, None, 7], pa.int64()),
        pa.array(["a", "bb", None, "", "é", "x", None]),
        pa.array([None, None, 1.5, -0.0, float("nan"), None, None]),
    ]
    for trailing in (False, True):
        whole = encode_columns(columns, drop_trailing_nulls=trailing)
        chunked = encode_columns_in_chunks(columns, drop_trailing_nulls=trailing,
                                           chunk_rows=chunk_rows, threads=3)
        assert whole is not None and chunked is not None
        assert chunked.to_pylist() == whole.to_pylist()
    bad = [pa.array([1, 2, 3]), pa.array(["ok", "ok", "ok"]).cast(pa.large_string())]
    assert (encode_columns_in_chunks(bad, chunk_rows=1, threads=2) is None) == (
        encode_columns(bad) is None)
