"""Value checks (pandera, Polars backend): each kind flags exactly its bad rows, with
file row numbers and a reason naming the check; contract errors are not re-reported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from tests.landing.helpers import jsonl, parquet
from upsert_core.errors import ConfigError
from upsert_core.landing import (
    CheckKind,
    SourceSchema,
    ValueCheck,
    parse_value_checks,
    read_csv,
    read_jsonl,
    read_parquet,
    validate_batch,
)
from upsert_core.landing import value_checks as vc

ROOT = Path(__file__).resolve().parents[2]


def errors_of(data: bytes, checks: object, name: str = "b.jsonl") -> dict[int, str]:
    batch = validate_batch(read_jsonl(name, data), SourceSchema(), parse_value_checks(checks))
    assert all(e.file == name for e in batch.errors)
    return {e.row: e.reason for e in batch.errors}


def test_range_flags_exactly_the_rows_outside_it() -> None:
    data = jsonl(*({"key": i, "offset": i, "amount": a}
                   for i, a in enumerate([0, 1000, -1, 1001, None, 500, 1000.0])))
    got = errors_of(data, {"amount": {"min": 0, "max": 1000}})
    reason = "value check amount in_range(0, 1000) failed"
    assert got == {3: reason, 4: reason}  # null passes; 1000.0 converts to float column


def test_min_or_max_alone() -> None:
    data = jsonl({"key": 1, "offset": 1, "a": -5}, {"key": 2, "offset": 2, "a": 5})
    assert errors_of(data, {"a": {"min": 0}}) == {1: "value check a min(0) failed"}
    assert errors_of(data, {"a": {"max": 0}}) == {2: "value check a max(0) failed"}


def test_isin_regex_and_not_null() -> None:
    data = jsonl(
        {"key": 1, "offset": 1, "status": "paid", "email": "a@b", "v": 1},
        {"key": 2, "offset": 2, "status": "lost", "email": "a@b", "v": 2},
        {"key": 3, "offset": 3, "status": "new", "email": "nope", "v": 3},
        {"key": 4, "offset": 4, "status": "new", "email": "a@b"},
        {"key": 5, "offset": 5, "status": None, "email": None, "v": None},
    )
    got = errors_of(data, {
        "status": {"isin": ["new", "paid", "shipped"]},
        "email": {"regex": "^[^@]+@[^@]+$"},
        "v": {"not_null": True},
    })
    assert got == {
        2: "value check status isin(['new', 'paid', 'shipped']) failed",
        3: "value check email regex('^[^@]+@[^@]+$') failed",
        4: "value check v not_null failed",
        5: "value check v not_null failed",
    }


def test_several_failures_of_one_row_are_one_error() -> None:
    data = jsonl({"key": 1, "offset": 1, "a": 99, "s": "x"})
    got = errors_of(data, {"a": {"max": 10}, "s": {"isin": ["y"]}})
    assert got == {1: "value check a max(10) failed; value check s isin(['y']) failed"}


def test_failing_rows_are_not_applied_and_row_numbers_follow_the_file() -> None:
    # a malformed line (row 2) is not in the columns: row numbers must still be exact
    data = jsonl({"key": 1, "offset": 1, "a": 5}, "{not json", {"key": 2, "offset": 2, "a": 50},
                 {"key": 3, "offset": 3, "a": 7})
    batch = validate_batch(read_jsonl("b.jsonl", data), SourceSchema(),
                           parse_value_checks({"a": {"max": 10}}))
    assert [e.row for e in batch.errors] == [2, 3]
    assert batch.errors[1].reason == "value check a max(10) failed"
    assert batch.positions.tolist() == [1, 4]
    assert len(batch) == 2 and batch.total_rows == 4


def test_contract_errors_are_not_double_reported() -> None:
    data = jsonl(
        {"key": None, "offset": 1, "a": 99},     # null key: contract error only
        {"key": 2, "offset": 2, "a": "x"},        # unconvertible -> null: contract error only
        {"key": 3, "offset": 3, "a": 99},         # value check only
    )
    got = errors_of(data, {"a": {"max": 10, "not_null": True}})
    assert got[1] == "null key column 'key'"
    assert got[2].startswith("column 'a': cannot convert")
    assert "value check" not in got[1] + got[2]
    assert got[3] == "value check a max(10) failed"


def test_deletes_are_not_value_checked() -> None:
    data = jsonl({"key": 1, "offset": 1, "__deleted": True},
                 {"key": 2, "offset": 2, "a": 99, "__deleted": "true"},
                 {"key": 3, "offset": 3, "a": 99, "__deleted": False})
    got = errors_of(data, {"a": {"max": 10, "not_null": True}})
    assert got == {3: "value check a max(10) failed"}


def test_checks_see_converted_values_in_csv_and_parquet() -> None:
    csv = b"key,offset,a\n1,1,5\n2,2,50\n"
    batch = validate_batch(read_csv("b.csv", csv), SourceSchema(),
                           parse_value_checks({"a": {"max": 10}}))
    assert [(e.row, e.reason) for e in batch.errors] == [(2, "value check a max(10) failed")]
    table = pa.table({"key": [1, 2, 3], "offset": [1, 2, 3], "a": [1.5, None, 20.0]})
    batch = validate_batch(read_parquet("b.parquet", parquet(table)), SourceSchema(),
                           parse_value_checks({"a": {"min": 0, "max": 10}}))
    assert [e.row for e in batch.errors] == [3]


def test_no_checks_leave_the_batch_untouched_and_never_import_pandera() -> None:
    data = jsonl({"key": 1, "offset": 1, "a": 5}, {"key": None, "offset": 2})
    plain = validate_batch(read_jsonl("b.jsonl", data), SourceSchema())
    none = validate_batch(read_jsonl("b.jsonl", data), SourceSchema(), ())
    assert plain.errors == none.errors and plain.rows == none.rows
    code = (
        "import sys\n"
        "from upsert_core.landing import SourceSchema, read_jsonl, validate_batch\n"
        "validate_batch(read_jsonl('b.jsonl', b'{\"key\":1,\"offset\":1}\\n'), SourceSchema())\n"
        "print(any(m.split('.')[0] in ('pandera', 'polars') for m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "False"


def test_pandera_import_leaves_no_spark_side_effects() -> None:
    code = (
        "import os, sys\n"
        "os.environ.pop('SPARK_LOCAL_IP', None); os.environ.pop('PYARROW_IGNORE_TIMEZONE', None)\n"
        "from upsert_core.landing import value_checks as vc\n"
        "vc._import_pandera()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyspark'),\n"
        "      os.environ.get('SPARK_LOCAL_IP'), os.environ.get('PYARROW_IGNORE_TIMEZONE'))\n"
        "import pyspark\n"  # still importable afterwards
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "[] None None"


def test_the_pandera_schema_is_built_once_per_checks() -> None:
    checks = parse_value_checks({"a": {"max": 10}})
    data = jsonl({"key": 1, "offset": 1, "a": 50})
    vc._pandera_schema.cache_clear()
    for _ in range(3):
        validate_batch(read_jsonl("b.jsonl", data), SourceSchema(), checks)
    info = vc._pandera_schema.cache_info()
    assert (info.misses, info.hits) == (1, 2)


def test_a_column_left_out_of_a_file_reads_as_null() -> None:
    schema = SourceSchema(columns=(("key", vc.LogicalType.INT64),
                                   ("offset", vc.LogicalType.INT64),
                                   ("a", vc.LogicalType.INT64)))
    data = jsonl({"key": 1, "offset": 1}, {"key": 2, "offset": 2})
    ok = validate_batch(read_jsonl("b.jsonl", data), schema, parse_value_checks({"a": {"max": 1}}))
    assert ok.errors == [] and len(ok) == 2
    strict = validate_batch(read_jsonl("b.jsonl", data), schema,
                            parse_value_checks({"a": {"not_null": True}}))
    assert [e.row for e in strict.errors] == [1, 2]
    # in the file but null in every row (so never typed): the same
    data = jsonl({"key": 1, "offset": 1, "b": None})
    got = validate_batch(read_jsonl("b.jsonl", data), SourceSchema(),
                         parse_value_checks({"b": {"isin": ["x"], "not_null": True}}))
    assert [(e.row, e.reason) for e in got.errors] == [(1, "value check b not_null failed")]


@pytest.mark.parametrize(
    ("checks", "message"),
    [
        ({"amont": {"max": 1}}, "b.jsonl: value check amont max(1): no column 'amont'"),
        ({"s": {"max": 1}}, "b.jsonl: value check s max(1) does not apply to column 's' of"
                            " type string"),
        ({"a": {"regex": "x"}}, "does not apply to column 'a' of type int64"),
        ({"a": {"isin": ["1"]}}, "does not apply to column 'a' of type int64"),
        ({"__deleted": {"not_null": True}}, "is the delete marker column"),
    ],
)
def test_a_check_that_cannot_apply_is_a_file_level_config_error(
    checks: object, message: str
) -> None:
    data = jsonl({"key": 1, "offset": 1, "a": 1, "s": "x", "__deleted": False})
    with pytest.raises(ConfigError, match="^b.jsonl: ") as info:
        validate_batch(read_jsonl("b.jsonl", data), SourceSchema(), parse_value_checks(checks))
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([1], "checks must be a mapping"),
        ({"a": {"maximum": 1}}, "column 'a': unknown check kind(s) ['maximum']"),
        ({"a": 5}, "column 'a': expected a mapping"),
        ({"a": {"min": 5, "max": 1}}, "min 5 is greater than max 1"),
        ({"a": {"min": "0"}}, "min and max must be finite numbers"),
        ({"a": {"min": True}}, "min and max must be finite numbers"),
        ({"a": {"isin": []}}, "isin needs a non-empty list"),
        ({"a": {"isin": "x"}}, "isin must be a list"),
        ({"a": {"regex": "("}}, "does not compile"),
        ({"a": {"not_null": "yes"}}, "not_null must be true or false"),
    ],
)
def test_malformed_declarations_are_config_errors(spec: object, message: str) -> None:
    with pytest.raises(ConfigError, match="^src: ") as info:
        parse_value_checks(spec, "src")
    assert message in str(info.value)


def test_parse_order_and_hashable() -> None:
    checks = parse_value_checks({"a": {"min": 0, "max": 9, "not_null": True, "isin": [1, 2]},
                                 "b": {"not_null": False}})
    assert [(c.column, c.kind) for c in checks] == [
        ("a", CheckKind.IN_RANGE), ("a", CheckKind.ISIN), ("a", CheckKind.NOT_NULL)]
    assert hash(checks) == hash(parse_value_checks({"a": {"min": 0, "max": 9, "not_null": True,
                                                          "isin": [1, 2]}}))
    assert ValueCheck("a", CheckKind.NOT_NULL).reason() == "value check a not_null failed"


def test_nan_fails_every_range_check_min_alone_included() -> None:
    """NaN is not >= any bound (IEEE, numpy, Python): a ``min`` check must flag it as
    ``max`` and ``in_range`` do (Polars orders NaN above every number, so ``ge`` alone let
    NaN in while ``le`` alone rejected it); ints and nulls are checked as before."""
    table = pa.table({"key": [1, 2, 3, 4], "offset": [1, 2, 3, 4],
                      "a": [float("nan"), 5.0, -1.0, None]})
    for checks, bad in (({"a": {"min": 0}}, {1, 3}), ({"a": {"max": 10}}, {1}),
                        ({"a": {"min": 0, "max": 10}}, {1, 3})):
        batch = validate_batch(read_parquet("x.parquet", parquet(table)), SourceSchema(),
                               parse_value_checks(checks))
        assert {e.row for e in batch.errors} == bad, checks
        assert len(batch.keys) == 4 - len(bad), checks
    ints = jsonl({"key": 1, "offset": 1, "n": -1}, {"key": 2, "offset": 2, "n": 2})
    assert errors_of(ints, {"n": {"min": 0}}) == {1: "value check n min(0) failed"}
    assert errors_of(ints, {"n": {"max": 0}}) == {2: "value check n max(0) failed"}
