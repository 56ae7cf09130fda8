"""A shard never holds a value it cannot decode, nor one silently changed on the way in.

Strings that are not valid UTF-8 (Arrow does not check Parquet's, nor CSV values read
without ``check_utf8``) and values the column's type cannot hold exactly (timestamp
overflow, sub-microsecond parts, integers beyond float64's 53 bits, decimals with more
digits than a float64 keeps) are row errors naming the file and row; every good row
decodes back to exactly what the file said.
"""

from __future__ import annotations

import datetime as dt
import decimal

import numpy as np
import pyarrow as pa
import pytest

from tests.landing.helpers import error_rows, jsonl, validate_csv, validate_jsonl, validate_parquet
from upsert_core.codec import encode_columns
from upsert_core.errors import IngestError
from upsert_core.landing import (
    LogicalType,
    RawBatch,
    SourceKind,
    SourceSchema,
    ValidatedBatch,
    decode_row,
    validate_batch,
)

T = LogicalType
NOT_UTF8 = b"\xff\xfe"


def _strings(values: list[bytes | None], typ: pa.DataType | None = None) -> pa.Array:
    """A string array holding exactly these bytes (Arrow does not check them)."""
    typ = typ or pa.string()
    binary = pa.array(values, pa.large_binary() if typ == pa.large_string() else pa.binary())
    return pa.Array.from_buffers(typ, len(values), binary.buffers())


def _typed(columns: dict[str, object]) -> ValidatedBatch:
    """Validate Arrow columns as a Parquet reader would hand them over."""
    arrays = {k: v if isinstance(v, pa.Array) else pa.array(v) for k, v in columns.items()}
    n = len(next(iter(arrays.values())))
    raw = RawBatch("t.parquet", SourceKind.TYPED, dict(arrays), np.arange(1, n + 1))
    return validate_batch(raw, SourceSchema())


def _decoded(b: ValidatedBatch) -> list[dict[str, object]]:
    return [decode_row(b.schema, r) for r in b.rows]  # raises if a row does not decode


# --- UTF-8 --------------------------------------------------------------------------


@pytest.mark.parametrize("typ", [pa.string(), pa.large_string()])
def test_a_parquet_string_that_is_not_utf8_is_a_row_error(typ: pa.DataType) -> None:
    v = _strings([b"ok", NOT_UTF8, None], typ)
    table = pa.table({"key": [1, 2, 3], "offset": [1, 2, 3], "v": v})
    b = validate_parquet(table, name="s.parquet")
    assert [(e.file, e.row) for e in b.errors] == [("s.parquet", 2)]
    assert "not valid UTF-8" in b.errors[0].reason and "'v'" in b.errors[0].reason
    assert _decoded(b) == [{"key": 1, "offset": 1, "v": "ok"}, {"key": 3, "offset": 3, "v": None}]


def test_a_key_that_is_not_utf8_is_a_row_error_not_a_null_key() -> None:
    key = _strings([b"a", NOT_UTF8])
    b = validate_parquet(pa.table({"key": key, "offset": [1, 2]}))
    assert error_rows(b) == [2]
    assert "not valid UTF-8" in b.errors[0].reason and "null key" not in b.errors[0].reason
    assert _decoded(b) == [{"key": "a", "offset": 1}]


def test_dictionary_strings_and_delete_markers_are_checked_too() -> None:
    # Arrow's Parquet writer refuses these, other writers do not: validate the columns
    # a reader could hand over.
    words = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0]), _strings([b"x", NOT_UTF8]))
    marker = _strings([b"false", b"false", NOT_UTF8])
    b = _typed({"key": [1, 2, 3], "offset": [1, 2, 3], "w": words, "__deleted": marker})
    assert error_rows(b) == [2, 3]
    assert _decoded(b) == [{"key": 1, "offset": 1, "w": "x"}]


def test_a_csv_value_that_is_not_utf8_is_a_row_error_not_a_file_error() -> None:
    b = validate_csv(b"key,offset,v\n1,1,ok\n2,2,\xff\xfe\n3,3,\n", name="c.csv")
    assert [(e.file, e.row) for e in b.errors] == [("c.csv", 2)]
    assert "not valid UTF-8" in b.errors[0].reason
    assert [r["key"] for r in _decoded(b)] == [1, 3]


def test_the_bulk_encoder_refuses_strings_it_could_not_decode() -> None:
    assert encode_columns([_strings([b"ok", NOT_UTF8])]) is None
    assert encode_columns([_strings([b"ok", None])]) is not None


def test_a_json_key_that_is_not_utf8_is_a_row_error() -> None:
    b = validate_jsonl(b'{"key": 1, "offset": 1}\n{"key": 2, "offset": 2, "\\ud800": 1}\n')
    assert error_rows(b) == [2] and b.schema.names == ("key", "offset")


# --- exactness ----------------------------------------------------------------------


def test_a_millisecond_timestamp_beyond_the_microsecond_range_is_a_row_error() -> None:
    # 2**63-1 ms, the common "valid forever" sentinel, once wrapped to 1969-12-31.
    ts = pa.array([2**63 - 1, 1_000, -(2**63) + 1], pa.timestamp("ms"))
    b = validate_parquet(pa.table({"key": [1, 2, 3], "offset": [1, 2, 3], "until": ts}))
    assert error_rows(b) == [1, 3]
    assert "'until'" in b.errors[0].reason
    assert _decoded(b) == [
        {"key": 2, "offset": 2, "until": dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=dt.UTC)}
    ]


@pytest.mark.parametrize("unit", ["s", "ms"])
def test_order_timestamps_overflowing_microseconds_are_row_errors(unit: str) -> None:
    b = _typed({"key": [1, 2], "offset": pa.array([2**62, 5], pa.timestamp(unit))})
    assert error_rows(b) == [1] and len(b.orders) == 1


def test_nanoseconds_are_kept_exactly_or_the_row_is_an_error() -> None:
    ts = pa.array([1_000_000_001, 2_000_000_000], pa.timestamp("ns", tz="UTC"))
    b = validate_parquet(pa.table({"key": [1, 2], "offset": [1, 2], "t": ts}))
    assert error_rows(b) == [1]
    assert _decoded(b)[0]["t"] == dt.datetime(1970, 1, 1, 0, 0, 2, tzinfo=dt.UTC)


def test_iso_text_with_more_than_six_fraction_digits_is_exact_or_an_error() -> None:
    rows = [
        {"key": 1, "offset": 1, "t": "2024-01-01T00:00:00.123456789Z"},
        {"key": 2, "offset": 2, "t": "2024-01-01T00:00:00.123456000Z"},
    ]
    schema = SourceSchema(columns=(("t", T.TIMESTAMP),))
    b = validate_jsonl(jsonl(*rows), schema)
    assert error_rows(b) == [1]
    assert _decoded(b)[0]["t"] == dt.datetime(2024, 1, 1, 0, 0, 0, 123456, tzinfo=dt.UTC)
    text = "key,offset,t\n1,1,2024-01-01T00:00:00.1234567\n2,2,2024-01-01T00:00:00.5\n"
    assert error_rows(validate_csv(text.encode(), schema)) == [1]


def test_date64_that_is_not_a_whole_day_is_a_row_error() -> None:
    days = pa.array([86_400_000 * 3, 86_400_000 * 3 + 5], pa.date64())
    b = _typed({"key": [1, 2], "offset": [1, 2], "d": days})
    assert error_rows(b) == [2] and _decoded(b)[0]["d"] == dt.date(1970, 1, 4)


def test_integers_into_a_float_column_convert_only_exactly() -> None:
    schema = SourceSchema(columns=(("f", T.FLOAT64),))
    big = 2**53 + 1
    exact = 2**60  # large but exactly a float64
    for b in (
        validate_parquet(pa.table({"key": [1, 2, 3], "offset": [1, 2, 3], "f": [big, exact, 7]}),
                         schema),
        validate_jsonl(jsonl(*({"key": i, "offset": i, "f": f}
                               for i, f in enumerate([big, exact, 7], 1))), schema),
        validate_jsonl(jsonl(*({"key": i, "offset": i, "f": f}
                               for i, f in enumerate([big, exact, 0.5], 1))), schema),
        validate_csv(f"key,offset,f\n1,1,{big}\n2,2,{exact}\n3,3,7\n".encode(), schema),
    ):
        assert error_rows(b) == [1]
        assert [r["f"] for r in _decoded(b)][0] == float(exact)


def test_json_and_csv_numbers_beyond_float64_are_row_errors_not_infinity() -> None:
    schema = SourceSchema(columns=(("f", T.FLOAT64),))
    b = validate_jsonl(b'{"key":1,"offset":1,"f":1e400}\n{"key":2,"offset":2,"f":1.5}\n', schema)
    assert error_rows(b) == [1]
    b = validate_csv(b"key,offset,f\n1,1,1e400\n2,2,inf\n", schema)
    assert error_rows(b) == [1] and _decoded(b)[0]["f"] == float("inf")


@pytest.mark.parametrize("text", ["1e400", "-1e400", "12345678901234567891"])
def test_a_new_csv_column_is_not_typed_float_by_text_no_float_holds(text: str) -> None:
    # Inference said float64 when Arrow's cast read the text (1e400 as infinity, a long
    # integer rounded), then conversion refused the value: a row lost to a type its own
    # values chose. As for calendar overflow above, such a column stays a string. (The
    # chunked CSV read relies on it too: inference must mean "every value converts" so
    # chunks can be combined; landing.stream_types.)
    b = validate_csv(f"key,offset,f\n1,1,1.5\n2,2,{text}\n".encode(), name="c.csv")
    assert b.schema.type_of("f") is T.STRING and not b.errors
    assert [r["f"] for r in _decoded(b)] == ["1.5", text]


def test_uint64_above_int64_is_a_row_error() -> None:
    v = pa.array([2**64 - 1, 5], pa.uint64())
    b = validate_parquet(pa.table({"key": [1, 2], "offset": [1, 2], "u": v}))
    assert error_rows(b) == [1] and _decoded(b)[0]["u"] == 5


def test_decimals_convert_when_the_float_reads_back_as_the_same_decimal() -> None:
    D = decimal.Decimal
    v = pa.array([D("0.3"), D("-0.7"), D("12345678901234567.1")], pa.decimal128(20, 1))
    b = validate_parquet(pa.table({"key": [1, 2, 3], "offset": [1, 2, 3], "d": v}))
    assert error_rows(b) == [3]
    assert [r["d"] for r in _decoded(b)] == [0.3, -0.7]  # the nearest floats, exactly


@pytest.mark.parametrize(
    ("column", "typ", "text"),
    [
        ("t", T.TIMESTAMP, "0000-01-01T00:00:00"),  # Arrow parses year 0, Python cannot
        ("t", T.TIMESTAMP, "0001-01-01T00:00:00+01:00"),  # year 0 in UTC
        ("t", T.TIMESTAMP, "9999-12-31T23:59:59-01:00"),  # year 10000 in UTC
        ("d", T.DATE, "0000-01-01"),
    ],
)
def test_csv_text_outside_the_calendar_is_a_row_error_not_a_crash(
    column: str, typ: LogicalType, text: str
) -> None:
    # CONTRACT.md, bad input: "a value that cannot be converted to the column's type or
    # represented exactly in it" is a row error; Arrow's fast text cast accepted these
    # and the ingest then died with "unexpected OverflowError" (no file name, the whole
    # file and every later one blocked).
    schema = SourceSchema(columns=(("t", T.TIMESTAMP), ("d", T.DATE)))
    good = "2024-01-01T00:00:00" if typ is T.TIMESTAMP else "2024-01-01"
    data = f"key,offset,{column}\n1,1,{good}\n2,2,{text}\n3,3,{good}\n".encode()
    b = validate_csv(data, schema, name="c.csv")
    assert [(e.file, e.row) for e in b.errors] == [("c.csv", 2)]
    assert f"'{column}'" in b.errors[0].reason
    assert [r["key"] for r in _decoded(b)] == [1, 3]
    # A new column is not typed by values that do not convert: it stays a string.
    fresh = validate_csv(data, name="c.csv")
    assert fresh.schema.type_of(column) is T.STRING and not fresh.errors
    assert [r[column] for r in _decoded(fresh)][1] == text


@pytest.mark.parametrize("text", ["1_2", "1_000.5", "\uff15", "\u0661\u0662.5"])
def test_csv_text_only_python_reads_as_a_number_is_not_silently_a_float(
    text: str,
) -> None:
    # CONTRACT.md, bad input: no value silently changed. float() reads "1_2" as 12.0 and
    # non-ASCII digits as numbers: a CSV column of such codes became float64 12.0, ...
    data = f"key,offset,v\n1,1,{text}\n".encode()
    assert _decoded(validate_csv(data)) == [{"key": 1, "offset": 1, "v": text}]
    floats = SourceSchema(columns=(("v", T.FLOAT64),))
    b = validate_csv(f"key,offset,v\n1,1,2.5\n2,2,{text}\n".encode(), floats, name="f.csv")
    assert [(e.file, e.row) for e in b.errors] == [("f.csv", 2)]
    assert _decoded(b) == [{"key": 1, "offset": 1, "v": 2.5}]


# --- a boolean is never a number (CONTRACT.md: "how floats and booleans compare") -------


@pytest.mark.parametrize("typ", [T.FLOAT64, T.INT64, T.TIMESTAMP, T.DATE, T.STRING])
@pytest.mark.parametrize("column", ["key", "v"])
@pytest.mark.parametrize("flag", [True, False])
def test_a_json_boolean_is_an_error_row_in_every_non_bool_column(
    typ: LogicalType, column: str, flag: bool
) -> None:
    # The review's reproduction: with a float before it, Arrow inferred float64 for the
    # whole column and `true` became 1.0 (as a key, merged into key 1.0).
    good = {T.FLOAT64: [1.5, 1.0], T.INT64: [7, 1], T.TIMESTAMP: ["2024-01-01T00:00:00",
            "2024-01-02T00:00:00"], T.DATE: ["2024-01-01", "2024-01-02"],
            T.STRING: ["a", "b"]}[typ]
    schema = SourceSchema(columns=((column, typ),))
    other = "v" if column == "key" else "key"
    rows = [{column: good[0], other: 1}, {column: flag, other: 2}, {column: good[1], other: 3}]
    for r, offset in zip(rows, (1, 1, 2), strict=True):
        r["offset"] = offset
    for known in (schema, None):  # a shard that typed the column, or a first file
        if known is None and typ in (T.TIMESTAMP, T.DATE):
            continue  # a first file infers strings for these: nothing to convert to
        b = validate_jsonl(jsonl(*rows), known, name="a.jsonl")
        assert [(e.file, e.row) for e in b.errors] == [("a.jsonl", 2)], (known, b.errors)
        assert str(flag) in b.errors[0].reason
        assert [r[column] for r in _decoded(b)] == [_decoded_value(typ, v) for v in good]


def _decoded_value(typ: LogicalType, value: object) -> object:
    if typ is T.TIMESTAMP:
        return dt.datetime.fromisoformat(str(value)).replace(tzinfo=dt.UTC)
    if typ is T.DATE:
        return dt.date.fromisoformat(str(value))
    return value


@pytest.mark.parametrize("order", [[1.5, True, None, 2.0], [None, False, 0.5], [True, 2.5]])
def test_no_mix_of_floats_and_booleans_reaches_a_float_column(order: list[object]) -> None:
    schema = SourceSchema(columns=(("f", T.FLOAT64),))
    rows = [{"key": i, "offset": 1, "f": f} for i, f in enumerate(order, 1)]
    b = validate_jsonl(jsonl(*rows), schema)
    assert error_rows(b) == [i for i, f in enumerate(order, 1) if isinstance(f, bool)]
    assert all(type(r.get("f")) in (float, type(None)) for r in _decoded(b))


@pytest.mark.parametrize("typ", [T.FLOAT64, T.INT64])
def test_csv_true_and_false_are_error_rows_in_a_numeric_column(typ: LogicalType) -> None:
    schema = SourceSchema(columns=(("n", typ),))
    b = validate_csv(b"key,offset,n\n1,1,2\n2,2,true\n3,3,FALSE\n", schema, name="c.csv")
    assert [(e.file, e.row) for e in b.errors] == [("c.csv", 2), ("c.csv", 3)]
    assert [r["n"] for r in _decoded(b)] == [2]


def test_a_parquet_bool_column_for_a_float_column_is_a_file_error() -> None:
    schema = SourceSchema(columns=(("f", T.FLOAT64),))
    table = pa.table({"key": [1], "offset": [1], "f": pa.array([True])})
    with pytest.raises(IngestError, match="'f'"):
        validate_parquet(table, schema, name="p.parquet")


@pytest.mark.parametrize(
    ("typ", "text"),
    [(T.INT64, "0x10"), (T.INT64, "0xFFFFFFFFFFFFFFFF"), (T.FLOAT64, "nan(5)"),
     (T.FLOAT64, "0x1p3")],
)
def test_csv_numbers_arrow_reads_but_python_does_not_are_error_rows_everywhere(
    typ: LogicalType, text: str
) -> None:
    # Arrow's text cast reads "0x10" as 16 and "0xFFFFFFFFFFFFFFFF" as -1: the review
    # merged key 0x10 into key 16. The answer must not depend on the file's other rows.
    schema = SourceSchema(columns=(("n", typ),))
    for rows in ("1,1,5\n2,2,{t}\n", "1,1,5\n2,2,{t}\n3,3,x\n"):
        data = ("key,offset,n\n" + rows.format(t=text)).encode()
        b = validate_csv(data, schema, name="h.csv")
        assert 2 in error_rows(b), (rows, b.errors)
        assert [r["key"] for r in _decoded(b)] == [1]
    assert validate_csv(f"key,offset,n\n1,1,{text}\n".encode()).schema.type_of("n") is T.STRING


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_value_column_of_only_booleans_is_error_rows_not_a_type_change(fmt: str) -> None:
    # The review: a later file whose every value of a float column was `true` stopped the
    # ingest ("changed type from float64 to bool") and blocked every later file.
    schema = SourceSchema(columns=(("f", T.FLOAT64), ("n", T.INT64)))
    if fmt == "jsonl":
        b = validate_jsonl(jsonl({"key": 1, "offset": 1, "f": True, "n": "7"},
                                 {"key": 2, "offset": 1}), schema, name="x.jsonl")
    else:
        b = validate_csv(b"key,offset,f,n\n1,1,true,seven\n2,1,,\n", schema, name="x.csv")
    assert error_rows(b) == [1] and b.schema.type_of("f") is T.FLOAT64
    assert [r["key"] for r in _decoded(b)] == [2]
    # A key column whose every value is of another type is still a wrong file.
    keyed = SourceSchema(columns=(("key", T.INT64),))
    with pytest.raises(IngestError, match="'key'"):
        validate_jsonl(jsonl({"key": True, "offset": 1}), keyed, name="k.jsonl")
