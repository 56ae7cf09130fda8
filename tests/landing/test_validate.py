"""Validation: the "Source batches" and "Bad input" sections of the contract, per file."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.landing.helpers import (
    error_rows,
    jsonl,
    validate_csv,
    validate_jsonl,
    validate_parquet,
)
from upsert_core.codec import decode_datums
from upsert_core.errors import IngestError
from upsert_core.landing import (
    ARROW_SCHEMA,
    ERRORS_ARROW_SCHEMA,
    LogicalType,
    SourceSchema,
    decode_row,
    encode_key,
)

T = LogicalType


def rows_of(batch_schema: SourceSchema, rows: list[bytes]) -> list[dict[str, object]]:
    return [decode_row(batch_schema, r) for r in rows]


# --- good rows ------------------------------------------------------------------------


def test_good_rows_are_ready_for_the_upsert_operator() -> None:
    b = validate_jsonl(
        jsonl(
            {"key": 1, "offset": 10, "v": "a"},
            {"key": 2, "offset": 11, "v": "b", "__deleted": True},
            {"key": 1, "offset": 12, "__deleted": "FaLsE"},
            {"key": 3, "offset": 13, "__deleted": "TRUE"},
            {"key": 4, "offset": 14, "__deleted": None},
        )
    )
    assert b.schema.columns == (("key", T.INT64), ("offset", T.INT64), ("v", T.STRING))
    assert b.keys == [encode_key([k]) for k in (1, 2, 1, 3, 4)]
    assert all(len(k) == 16 for k in b.keys)
    assert b.deletes.tolist() == [False, True, False, True, False]
    assert b.orders.dtype == np.int64 and b.orders.tolist() == [10, 11, 12, 13, 14]
    assert b.positions.dtype == np.int64 and b.positions.tolist() == [1, 2, 3, 4, 5]
    assert rows_of(b.schema, b.rows)[0] == {"key": 1, "offset": 10, "v": "a"}
    assert rows_of(b.schema, b.rows)[2] == {"key": 1, "offset": 12, "v": None}
    assert b.errors == [] and len(b) == 5 == b.total_rows

    arrow = b.to_arrow()
    assert arrow.schema == ARROW_SCHEMA and arrow.num_rows == 5
    assert arrow.column("key").to_pylist() == b.keys


def test_composite_key_in_option_order() -> None:
    schema = SourceSchema(key=("b", "a"))
    b = validate_jsonl(jsonl({"a": 1, "b": "x", "offset": 1}), schema)
    assert b.keys == [encode_key(["x", 1])]
    assert b.keys != [encode_key([1, "x"])]
    assert b.schema.names == ("a", "b", "offset")  # rows keep order of appearance


# --- row-level bad input ------------------------------------------------------------


def test_row_level_problems_are_excluded_and_reported_once_each() -> None:
    data = jsonl(
        {"key": 1, "offset": 1, "v": 1},
        {"key": None, "offset": 2, "v": 2},  # null key
        {"offset": 3, "v": 3},  # absent key is a null key
        {"key": 4, "offset": None},  # null order
        {"key": 5, "offset": 5, "v": "five"},  # unconvertible value
        {"key": 6, "offset": 6, "__deleted": "maybe"},  # bad delete marker
        {"key": 7, "offset": 7, "__deleted": 1},  # a number is not a boolean
        "{broken",  # malformed JSON line
        {"key": 9, "offset": 9, "v": 9},
    )
    b = validate_jsonl(data, name="bad.jsonl")

    assert b.positions.tolist() == [1, 9]
    assert error_rows(b) == [2, 3, 4, 5, 6, 7, 8]
    assert all(e.file == "bad.jsonl" for e in b.errors)
    reasons = [e.reason for e in b.errors]
    assert reasons[:4] == [
        "null key column 'key'",
        "null key column 'key'",
        "null order column 'offset'",
        "column 'v': cannot convert 'five' to int64",
    ]
    assert "delete marker '__deleted'" in reasons[4] and "'maybe'" in reasons[4]
    assert "delete marker" in reasons[5]
    assert reasons[6].startswith("malformed JSON line")
    errors = b.errors_to_arrow()
    assert errors.schema == ERRORS_ARROW_SCHEMA and errors.column("row").to_pylist()[0] == 2


def test_several_problems_in_one_row_make_one_error() -> None:
    b = validate_jsonl(jsonl({"key": 1, "offset": 1, "v": 1}, {"key": None, "offset": "x"}))
    [error] = b.errors
    assert error.row == 2
    assert error.reason == "column 'offset': cannot convert 'x' to int64; null key column 'key'"


def test_key_or_order_null_in_every_row_means_every_row_is_an_error() -> None:
    b = validate_jsonl(jsonl({"key": None, "offset": 1}, {"key": None, "offset": 2}))
    assert len(b) == 0 and error_rows(b) == [1, 2]
    assert b.schema.type_of("key") is None  # an all-null column fixes no type


def test_a_string_that_is_not_utf8_is_a_row_error() -> None:
    b = validate_jsonl(
        b'{"key": 1, "offset": 1, "v": "ok"}\n{"key": 2, "offset": 2, "v": "\\ud800"}\n'
    )
    assert b.positions.tolist() == [1]
    assert error_rows(b) == [2] and "cannot convert '\\ud800' to string" in b.errors[0].reason


@given(
    st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "key": st.one_of(st.none(), st.integers(0, 3), st.just("s")),
                "offset": st.one_of(st.none(), st.integers(-5, 5), st.just(1.5)),
                "__deleted": st.sampled_from([None, True, False, "true", "False", "no", 0]),
                "v": st.one_of(st.none(), st.integers(), st.floats(), st.text(max_size=3)),
            },
        ).map(lambda d: d if d else "not json"),
        max_size=25,
    )
)
def test_every_row_is_either_good_or_an_error_exactly_once(rows: list[object]) -> None:
    schema = SourceSchema(columns=(("key", T.INT64), ("offset", T.INT64)))
    try:
        b = validate_jsonl(jsonl(*rows), schema)
    except IngestError as exc:  # a whole column of the wrong type, or no key/order column
        assert "changed type" in str(exc) or "missing" in str(exc)
        return
    good = b.positions.tolist()
    assert sorted(good + error_rows(b)) == list(range(1, len(rows) + 1))
    assert len(b.keys) == len(b.rows) == len(b.deletes) == len(b.orders) == len(good)
    for row, raw in zip(good, b.rows, strict=True):
        source = rows[row - 1]
        assert isinstance(source, dict)
        decoded = decode_row(b.schema, raw)
        assert decoded["key"] == source["key"] and decoded["offset"] == source["offset"]


# --- file-level bad input -----------------------------------------------------------


def test_missing_order_or_key_column_is_a_file_error() -> None:
    with pytest.raises(IngestError, match="^m.jsonl: missing order column 'offset'$"):
        validate_jsonl(jsonl({"key": 1, "v": 1}), name="m.jsonl")
    with pytest.raises(IngestError, match="^m.parquet: missing key column 'id'$"):
        validate_parquet(pa.table({"offset": [1]}), SourceSchema(key=("id",)), name="m.parquet")


def test_empty_files_are_empty_batches() -> None:
    assert len(validate_jsonl(b"")) == 0
    assert validate_jsonl(b"").errors == []
    assert len(validate_csv(b"")) == 0
    empty = validate_parquet(pa.table({"key": pa.array([], pa.string()), "offset": []}))
    assert len(empty) == 0 and empty.errors == []
    assert empty.schema.type_of("key") is T.STRING  # typed even without rows
    no_order = validate_parquet(pa.table({"key": pa.array([], pa.int64())}))
    assert len(no_order) == 0  # nothing in it can lack an order value


def test_jsonl_of_only_malformed_lines_is_all_row_errors_not_a_file_error() -> None:
    b = validate_jsonl(jsonl("{", "nope"))
    assert len(b) == 0 and error_rows(b) == [1, 2]


def test_incompatible_type_change_is_a_file_error_naming_file_and_column() -> None:
    first = validate_jsonl(jsonl({"key": 1, "offset": 1, "v": 1}))
    # JSON Lines and CSV values that do not fit a typed value column are error rows,
    # even when no value of the file fits (CONTRACT.md: a boolean is never a number):
    # only a file that declares its types (Parquet), or keys of another type, is refused.
    b2 = validate_jsonl(jsonl({"key": 2, "offset": 2, "v": "x"}), first.schema, name="b2.jsonl")
    assert [(e.file, e.row) for e in b2.errors] == [("b2.jsonl", 1)]
    assert b2.schema.type_of("v") is LogicalType.INT64
    with pytest.raises(
        IngestError, match="^p.parquet: column 'v' changed type from int64 to float64"
    ):
        validate_parquet(
            pa.table({"key": [1], "offset": [1], "v": [1.5]}), first.schema, name="p.parquet"
        )
    with pytest.raises(IngestError, match="column 'key' changed type.*never change"):
        validate_jsonl(jsonl({"key": "k", "offset": 1}), first.schema)


def test_unsupported_parquet_type_is_a_file_error() -> None:
    table = pa.table({"key": [1], "offset": [1], "tags": [[1, 2]]})
    with pytest.raises(IngestError, match="l.parquet: column 'tags': unsupported column type"):
        validate_parquet(table, name="l.parquet")


# --- JSON Lines type rules ----------------------------------------------------------


def test_jsonl_type_rules() -> None:
    b = validate_jsonl(
        jsonl(
            {"key": 1, "offset": 1, "i": 1, "f": 1.5, "m": 1, "s": "x", "b": True, "n": None},
            {"key": 2, "offset": 2, "i": 2, "f": 2.0, "m": 2.5, "s": "y", "b": False},
        )
    )
    types = dict(b.schema.columns)
    assert types == {
        "key": T.INT64,
        "offset": T.INT64,
        "i": T.INT64,
        "f": T.FLOAT64,
        "m": T.FLOAT64,  # integers and fractions mixed: float64
        "s": T.STRING,
        "b": T.BOOL,
    }
    first = decode_row(b.schema, b.rows[0])
    assert first["m"] == 1.0 and isinstance(first["m"], float)
    assert first["b"] is True


def test_an_integer_in_a_float_column_converts() -> None:
    schema = validate_jsonl(jsonl({"key": 1, "offset": 1, "v": 0.5})).schema
    b = validate_jsonl(jsonl({"key": 1, "offset": 2, "v": 3}), schema)
    value = decode_row(b.schema, b.rows[0])["v"]
    assert value == 3.0 and isinstance(value, float)


def test_fraction_bool_or_huge_number_in_an_int_column_is_a_row_error() -> None:
    schema = validate_jsonl(jsonl({"key": 1, "offset": 1, "v": 1})).schema
    b = validate_jsonl(
        jsonl(
            {"key": 1, "offset": 2, "v": 2},
            {"key": 1, "offset": 3, "v": 2.5},
            {"key": 1, "offset": 4, "v": True},
            {"key": 1, "offset": 5, "v": 2**63},
        ),
        schema,
    )
    assert b.positions.tolist() == [1]
    assert [e.reason for e in b.errors] == [
        "column 'v': cannot convert 2.5 to int64",
        "column 'v': cannot convert True to int64",
        f"column 'v': cannot convert {2**63} to int64",
    ]


def test_nested_json_values_are_row_errors_or_unsupported() -> None:
    b = validate_jsonl(jsonl({"key": 1, "offset": 1, "v": "a"}, {"key": 2, "offset": 2, "v": {}}))
    assert error_rows(b) == [2]
    with pytest.raises(IngestError, match="column 'v' holds JSON objects or arrays"):
        validate_jsonl(jsonl({"key": 1, "offset": 1, "v": [1]}))


def test_iso_strings_in_a_jsonl_order_column_are_timestamps() -> None:
    b = validate_jsonl(
        jsonl(
            {"key": 1, "offset": "2024-01-01T00:00:00Z"},
            {"key": 1, "offset": "2024-01-01T01:00:00+01:00"},
            {"key": 1, "offset": "2024-01-01 00:00:01"},
            {"key": 1, "offset": "yesterday"},
        )
    )
    assert b.schema.type_of("offset") is T.TIMESTAMP
    base = int(dt.datetime(2024, 1, 1, tzinfo=dt.UTC).timestamp()) * 1_000_000
    assert b.orders.tolist() == [base, base, base + 1_000_000]
    assert error_rows(b) == [4]
    assert decode_row(b.schema, b.rows[0])["offset"] == dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


# --- schema evolution through batches -----------------------------------------------


def test_columns_added_later_and_left_out() -> None:
    b1 = validate_jsonl(jsonl({"key": 1, "offset": 1, "v": "a"}))
    b2 = validate_jsonl(jsonl({"key": 1, "offset": 2, "w": 1.5}), b1.schema)
    assert b2.schema.names == ("key", "offset", "v", "w")
    assert decode_row(b2.schema, b2.rows[0]) == {"key": 1, "offset": 2, "v": None, "w": 1.5}
    # a row written before w existed reads under the new schema with w null
    assert decode_row(b2.schema, b1.rows[0]) == {"key": 1, "offset": 1, "v": "a", "w": None}


SCALARS = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=5))


@given(values=st.lists(SCALARS, min_size=1, max_size=5), extra=st.integers(1, 4))
def test_adding_columns_does_not_change_existing_row_encodings(
    values: list[object], extra: int
) -> None:
    names = [f"c{i}" for i in range(len(values))]
    # Types from the values where there is one; all-null columns get a string type.
    cols = [
        (n, T.STRING if isinstance(v, str) or v is None else T.INT64)
        for n, v in zip(names, values, strict=True)
    ]
    old = SourceSchema(columns=(("key", T.INT64), ("offset", T.INT64), *cols))
    new = old.evolve([(f"x{i}", T.STRING) for i in range(extra)], "f")
    row = {"key": 1, "offset": 1, **dict(zip(names, values, strict=True))}

    before = validate_jsonl(jsonl(row), old)
    after = validate_jsonl(jsonl(row), new)

    assert after.rows == before.rows and after.keys == before.keys
    assert decode_datums(before.rows[0])[-1] is not None  # trailing nulls are trimmed


# --- Parquet and CSV ----------------------------------------------------------------


def test_parquet_types_map_to_logical_types() -> None:
    table = pa.table(
        {
            "key": pa.array(["a", "b"]).dictionary_encode(),
            "offset": pa.array([1, 2], pa.int32()),
            "ts": pa.array([1_000, 2_000], pa.timestamp("ns")),
            "u": pa.array([1, 2**64 - 1], pa.uint64()),
            "d": pa.array([dt.date(2024, 1, 2), None], pa.date32()),
            "bin": pa.array([b"\x00", b"x"], pa.binary(1)),
            "f": pa.array([1.5, None], pa.float32()),
        }
    )
    b = validate_parquet(table)
    assert dict(b.schema.columns) == {
        "key": T.STRING,
        "offset": T.INT64,
        "ts": T.TIMESTAMP,
        "u": T.INT64,
        "d": T.DATE,
        "bin": T.BINARY,
        "f": T.FLOAT64,
    }
    assert error_rows(b) == [2] and "cannot convert 18446744073709551615" in b.errors[0].reason
    row = decode_row(b.schema, b.rows[0])
    assert row == {
        "key": "a",
        "offset": 1,
        "ts": dt.datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=dt.UTC),
        "u": 1,
        "d": dt.date(2024, 1, 2),
        "bin": b"\x00",
        "f": 1.5,
    }


def test_parquet_timestamp_order_in_microseconds() -> None:
    ts = pa.array([1_000, 3_000_000], pa.timestamp("ns", tz="Europe/Paris"))
    b = validate_parquet(pa.table({"key": [1, 2], "offset": ts, "__deleted": [None, True]}))
    assert b.schema.type_of("offset") is T.TIMESTAMP
    assert b.orders.tolist() == [1, 3_000]
    assert b.deletes.tolist() == [False, True]
    # 1.5 microseconds has no exact microsecond value: a row error, never truncated.
    ts = pa.array([1_500, 3_000_000], pa.timestamp("ns"))
    b = validate_parquet(pa.table({"key": [1, 2], "offset": ts}))
    assert error_rows(b) == [1] and b.orders.tolist() == [3_000]


def test_parquet_non_boolean_delete_marker_is_a_row_error() -> None:
    b = validate_parquet(
        pa.table({"key": [1, 2, 3], "offset": [1, 2, 3], "__deleted": [0, None, 1]})
    )
    assert error_rows(b) == [1, 3] and b.deletes.tolist() == [False]


def test_csv_infers_types_and_converts_into_known_columns() -> None:
    b1 = validate_csv(b"key,offset,v,f,flag,day,__deleted\n1,1,x,1.5,True,2024-01-02,\n")
    assert dict(b1.schema.columns) == {
        "key": T.INT64,
        "offset": T.INT64,
        "v": T.STRING,
        "f": T.FLOAT64,
        "flag": T.BOOL,
        "day": T.DATE,
    }
    b2 = validate_csv(
        b"key,offset,f,__deleted\n2,2,3,true\n3,3,abc,FALSE\n4,4,,yes\n 5 ,5,2.5,\n", b1.schema
    )
    assert b2.positions.tolist() == [1, 4]
    assert b2.deletes.tolist() == [True, False]
    assert [e.reason for e in b2.errors][0] == "column 'f': cannot convert 'abc' to float64"
    assert decode_row(b2.schema, b2.rows[1])["key"] == 5
    # A file none of whose values fit the value column: error rows, the type kept.
    b3 = validate_csv(b"key,offset,f\n1,1,abc\n", b1.schema, name="c.csv")
    assert [(e.file, e.row) for e in b3.errors] == [("c.csv", 1)]
    assert b3.schema.type_of("f") is LogicalType.FLOAT64


def test_parquet_timestamps_and_dates_beyond_python_range_are_row_errors() -> None:
    table = pa.table(
        {
            "key": [1, 2, 3],
            "offset": [1, 2, 3],
            "ts": pa.array([0, 2**62, None], pa.timestamp("us")),
            "d": pa.array([0, 2**30, None], pa.date32()),
        }
    )
    b = validate_parquet(table)
    assert b.positions.tolist() == [1, 3]
    [error] = b.errors
    assert error.row == 2 and "'ts'" in error.reason and "'d'" in error.reason


def test_an_order_of_several_columns_gives_order_keys_and_nulls_in_any_are_errors() -> None:
    from upsert_core.landing.validate import ARROW_SCHEMA_ORDER_KEYS
    from upsert_core.order_keys import order_keys

    schema = SourceSchema(order=("file", "pos"))
    b = validate_jsonl(jsonl(
        {"key": 1, "file": "bin.2", "pos": 1},
        {"key": 2, "file": None, "pos": 1},
        {"key": 3, "file": "bin.1", "pos": None},
        {"key": 4, "pos": None},
        {"key": 5, "file": "bin.1", "pos": -7},
    ), schema)
    assert b.orders.dtype.kind == "S"
    expected = order_keys([pa.array(["bin.2", "bin.1"]), pa.array([1, -7])])
    assert b.orders.tolist() == expected.tolist() and b.positions.tolist() == [1, 5]
    assert [(e.row, e.reason) for e in b.errors] == [
        (2, "null order column 'file'"), (3, "null order column 'pos'"),
        (4, "null order column 'file'; null order column 'pos'")]
    assert b.to_arrow().schema == ARROW_SCHEMA_ORDER_KEYS
    with pytest.raises(IngestError, match="b.jsonl: missing order column .pos."):
        validate_jsonl(jsonl({"key": 1, "file": "a"}), schema)
