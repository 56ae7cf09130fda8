"""The Debezium translation (``upsert_core.landing.debezium``): every op, the wrapper with
and without a schema, logical types, every error-row reason, ``null`` lines and skipped
``t``/``m`` events; then validation of the translated rows."""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

import pytest

from upsert_core.errors import IngestError
from upsert_core.landing.debezium import DELETE_MARKER, translate_jsonl
from upsert_core.landing.schema import LogicalType, SourceSchema
from upsert_core.landing.validate import validate_batch

KEY = ("id",)
ORDER = "source.lsn"


def _data(lines: list[Any]) -> bytes:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                   for line in lines).encode()


def _rows(lines: list[Any], order: str = ORDER) -> tuple[list[dict[str, Any]], Any]:
    batch = translate_jsonl("f.jsonl", _data(lines), KEY, order)
    raw = batch.raw
    cols = {name: (col.to_pylist() if hasattr(col, "to_pylist") else list(col))
            for name, col in raw.columns.items()}
    rows = [{name: values[i] for name, values in cols.items()} for i in range(raw.num_rows)]
    return rows, batch


def _event(op: str, lsn: int | None = 1, **images: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"op": op, "source": {"lsn": lsn}, "ts_ms": 99}
    event.update(images)
    return event


def _connect_schema(after: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "struct", "fields": [
        {"field": "before", "type": "struct", "optional": True, "fields": after},
        {"field": "after", "type": "struct", "optional": True, "fields": after},
        {"field": "op", "type": "string"},
    ]}


def test_create_read_update_make_the_after_row() -> None:
    rows, batch = _rows([
        _event("c", 1, after={"id": 1, "v": "a"}),
        _event("r", 2, after={"id": 2, "v": "b"}),
        _event("u", 3, before={"id": 1, "v": "a"}, after={"id": 1, "v": "c"}),
    ])
    assert [(r["id"], r["v"], r[ORDER], r[DELETE_MARKER]) for r in rows] == [
        (1, "a", 1, False), (2, "b", 2, False), (1, "c", 3, False)]
    assert list(batch.raw.positions) == [1, 2, 3]
    assert batch.raw.errors == [] and batch.skipped == 0


def test_delete_reads_only_the_key_from_before() -> None:
    rows, _ = _rows([_event("d", 5, before={"id": 7, "v": "gone"}, after=None)])
    assert rows == [{"id": 7, ORDER: 5, DELETE_MARKER: True}]


def test_truncate_and_message_are_skipped_and_counted_not_errors() -> None:
    rows, batch = _rows([_event("t"), _event("m"), _event("c", 2, after={"id": 1})])
    assert batch.skipped == 2 and batch.raw.errors == []
    assert [r["id"] for r in rows] == [1]
    assert list(batch.raw.positions) == [3]


def test_null_lines_and_null_payloads_change_nothing() -> None:
    rows, batch = _rows(["null", {"schema": None, "payload": None}, "",
                         _event("c", 1, after={"id": 1})])
    assert batch.raw.errors == [] and batch.skipped == 0
    assert list(batch.raw.positions) == [4]  # blank and null lines still count
    assert len(rows) == 1


def test_only_tombstones_is_an_empty_batch() -> None:
    _, batch = _rows(["null", "null"])
    assert batch.raw.num_rows == 0 and batch.raw.columns == {} and batch.raw.errors == []


def test_a_wrapper_with_a_null_schema_is_the_event() -> None:
    rows, _ = _rows([{"schema": None, "payload": _event("c", 5, after={"id": 2})}])
    assert [(r["id"], r[ORDER]) for r in rows] == [(2, 5)]


@pytest.mark.parametrize("payload", [
    pytest.param({"op": "c", "after": {"id": 2}, "source": {"lsn": 5}}, id="event"),
    pytest.param(None, id="null"),
    pytest.param(3, id="number"),
])
def test_payload_without_schema_is_an_error_row_naming_the_line(payload: Any) -> None:
    """Kafka Connect's JsonConverter writes ``schema`` and ``payload`` together (and with
    ``schemas.enable=true`` refuses a message without both); without the setting the
    message is the event itself. ``{"payload": ...}`` alone is neither: an error row with
    its line, never silently unwrapped (nor, for a null payload, taken as a tombstone)."""
    rows, batch = _rows([_event("c", 1, after={"id": 1}), {"payload": payload}])
    assert [r["id"] for r in rows] == [1]
    [error] = batch.raw.errors
    assert (error.file, error.row) == ("f.jsonl", 2)
    assert "'payload' but no 'schema'" in error.reason
    assert "schemas.enable" in error.reason


def test_a_field_named_like_the_default_marker_is_an_ordinary_column() -> None:
    rows, _ = _rows([_event("c", 1, after={"id": 1, "__deleted": True})])
    assert rows[0]["__deleted"] is True and rows[0][DELETE_MARKER] is False


def test_order_reaches_inside_the_event() -> None:
    rows, _ = _rows([_event("c", 1, after={"id": 1})], order="ts_ms")
    assert rows[0]["ts_ms"] == 99
    rows, _ = _rows([{"op": "c", "after": {"id": 1}, "source": {"pos": {"row": 3}}}],
                    order="source.pos.row")
    assert rows[0]["source.pos.row"] == 3


@pytest.mark.parametrize(("line", "reason"), [
    ([1, 2], "Debezium event is not an object (got list)"),
    ('"text"', "Debezium event is not an object (got str)"),
    ({"schema": None, "payload": 3}, "Debezium event is not an object (got int)"),
    ({"after": {"id": 1}, "source": {"lsn": 1}}, "Debezium event has no 'op'"),
    ({"op": None, "after": {"id": 1}}, "Debezium event has no 'op'"),
    ({"op": "x", "after": {"id": 1}}, "Debezium event has an unknown op 'x'"),
    ({"op": "c", "source": {"lsn": 1}}, "Debezium event with op 'c' lacks 'after'"),
    ({"op": "u", "after": None}, "Debezium event with op 'u' lacks 'after'"),
    ({"op": "d", "after": {"id": 1}}, "Debezium event with op 'd' lacks 'before'"),
    ({"op": "c", "after": {"id": 1, DELETE_MARKER: 1}},
     f"field {DELETE_MARKER!r} of 'after' is named like the envelope's delete marker"),
    ({"op": "c", "after": {"id": 1, ORDER: 1}},
     f"field {ORDER!r} of 'after' is named like the envelope's order"),
    ({"op": "c", "after": {"id": 1}, "source": {"lsn": {"a": 1}}},
     "order 'source.lsn' is not a number or a timestamp: {'a': 1}"),
    ("{not json", "malformed JSON line"),
    # Review: an op that is a list or object crashed the ingest (unhashable).
    ({"op": ["c"], "after": {"id": 1}}, "Debezium event has an unknown op ['c']"),
    ({"op": {"c": 1}, "after": {"id": 1}}, "Debezium event has an unknown op {'c': 1}"),
])
def test_error_rows_name_line_and_reason(line: Any, reason: str) -> None:
    rows, batch = _rows([_event("c", 1, after={"id": 1}), line])
    assert len(rows) == 1
    [error] = batch.raw.errors
    assert (error.file, error.row) == ("f.jsonl", 2)
    assert error.reason.startswith(reason), error.reason


@pytest.mark.parametrize(("event", "reason"), [
    (_event("c", 1, after={"id": None}), "null key column 'id'"),
    (_event("c", 1, after={"v": 1}), "null key column 'id'"),
    (_event("d", 1, before={"v": 1}), "null key column 'id'"),
    (_event("c", None, after={"id": 1}), "null order column 'source.lsn'"),
    ({"op": "c", "after": {"id": 1}}, "null order column 'source.lsn'"),
])
def test_null_key_or_order_is_an_error_row_from_validation(event: Any, reason: str) -> None:
    _, batch = _rows([event])
    schema = SourceSchema(key=KEY, order=ORDER, deleted=DELETE_MARKER)
    out = validate_batch(batch.raw, schema)
    assert len(out) == 0
    assert [(e.row, e.reason) for e in out.errors] == [(1, reason)]


def test_logical_types_from_the_wrapper_schema() -> None:
    fields = [
        {"field": "id", "type": "int32"},
        {"field": "ms", "type": "int64", "name": "io.debezium.time.Timestamp"},
        {"field": "us", "type": "int64", "name": "io.debezium.time.MicroTimestamp"},
        {"field": "ns", "type": "int64", "name": "io.debezium.time.NanoTimestamp"},
        {"field": "zoned", "type": "string", "name": "io.debezium.time.ZonedTimestamp"},
        {"field": "kts", "type": "int64", "name": "org.apache.kafka.connect.data.Timestamp"},
        {"field": "day", "type": "int32", "name": "io.debezium.time.Date"},
        {"field": "kday", "type": "int32", "name": "org.apache.kafka.connect.data.Date"},
        {"field": "amount", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
         "parameters": {"scale": "2"}},
        {"field": "plain_ms", "type": "int64"},
    ]
    after = {"id": 1, "ms": 1_700_000_000_123, "us": 1_700_000_000_123_456,
             "ns": 1_700_000_000_123_456_000, "zoned": "2023-11-14T23:13:20.5+01:00",
             "kts": 0, "day": 19_000, "kday": -1,
             "amount": base64.b64encode((-12345).to_bytes(2, "big", signed=True)).decode(),
             "plain_ms": 5}
    line = {"schema": _connect_schema(fields), "payload": _event("c", 1, after=after)}
    rows, batch = _rows([line])
    utc = dt.UTC
    assert rows[0]["ms"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=utc)
    assert rows[0]["us"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=utc)
    assert rows[0]["ns"] == rows[0]["us"]
    assert rows[0]["zoned"] == dt.datetime(2023, 11, 14, 22, 13, 20, 500000, tzinfo=utc)
    assert rows[0]["kts"] == dt.datetime(1970, 1, 1, tzinfo=utc)
    assert rows[0]["day"] == dt.date(2022, 1, 8)
    assert rows[0]["kday"] == dt.date(1969, 12, 31)
    assert rows[0]["amount"] == -123.45
    assert rows[0]["plain_ms"] == 5
    out = validate_batch(batch.raw, SourceSchema(key=KEY, order=ORDER, deleted=DELETE_MARKER))
    assert out.errors == [] and len(out) == 1
    types = dict(out.schema.columns)
    assert types["ms"] is LogicalType.TIMESTAMP and types["zoned"] is LogicalType.TIMESTAMP
    assert types["day"] is LogicalType.DATE and types["amount"] is LogicalType.FLOAT64
    assert types["plain_ms"] is LogicalType.INT64


def test_without_a_schema_values_follow_the_json_lines_rules() -> None:
    rows, batch = _rows([_event("c", 1, after={"id": 1, "ms": 1_700_000_000_123,
                                               "t": "2023-11-14T22:13:20Z"})])
    out = validate_batch(batch.raw, SourceSchema(key=KEY, order=ORDER, deleted=DELETE_MARKER))
    types = dict(out.schema.columns)
    assert types["ms"] is LogicalType.INT64 and types["t"] is LogicalType.STRING


@pytest.mark.parametrize(("field", "value", "why"), [
    ({"type": "int64", "name": "io.debezium.time.NanoTimestamp"}, 1_500, "sub-microsecond"),
    ({"type": "int64", "name": "io.debezium.time.Timestamp"}, "soon", "not an integer"),
    ({"type": "int64", "name": "io.debezium.time.Timestamp"}, True, "a boolean"),
    ({"type": "int64", "name": "io.debezium.time.Timestamp"}, 10**20, "off the calendar"),
    ({"type": "string", "name": "io.debezium.time.ZonedTimestamp"}, "2023-01-01T00:00",
     "no zone"),
    # Review: nanoseconds were cut to microseconds without a word.
    ({"type": "string", "name": "io.debezium.time.ZonedTimestamp"},
     "2024-01-01T10:00:00.123456789Z", "nanoseconds a timestamp column cannot hold"),
    ({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
      "parameters": {"scale": "0"}},
     base64.b64encode((2**60 + 1).to_bytes(8, "big", signed=True)).decode(), "inexact"),
    ({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
      "parameters": {"scale": "0"}}, "@@", "not base64"),
])
def test_a_value_not_of_its_logical_type_is_an_error_row(
    field: dict[str, Any], value: Any, why: str
) -> None:
    fields = [{"field": "id", "type": "int32"}, {"field": "x", **field}]
    payload = _event("c", 1, after={"id": 1, "x": value})
    line = {"schema": _connect_schema(fields), "payload": payload}
    rows, batch = _rows([line, _event("c", 2, after={"id": 2})])
    assert len(rows) == 1, why
    [error] = batch.raw.errors
    assert error.row == 1
    assert error.reason.startswith(f"column 'x': cannot read {value!r}"[:30]), error.reason


def test_a_decimal_that_a_float_holds_at_its_scale_is_read() -> None:
    fields = [{"field": "id", "type": "int32"},
              {"field": "x", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
               "parameters": {"scale": "1"}}]
    one_tenth = base64.b64encode(b"\x01").decode()
    payload = _event("c", 1, after={"id": 1, "x": one_tenth})
    line = {"schema": _connect_schema(fields), "payload": payload}
    rows, _ = _rows([line])
    assert rows[0]["x"] == 0.1


def test_a_typed_column_with_an_untyped_value_is_an_error_row() -> None:
    fields = [{"field": "id", "type": "int32"},
              {"field": "x", "type": "int32", "name": "io.debezium.time.Date"}]
    typed = {"schema": _connect_schema(fields), "payload": _event("c", 1, after={"id": 1, "x": 3})}
    untyped = _event("c", 2, after={"id": 2, "x": 3})
    null = _event("c", 3, after={"id": 3, "x": None})
    rows, batch = _rows([typed, untyped, null])
    assert [r["id"] for r in rows] == [1, 3]
    [error] = batch.raw.errors
    assert error.row == 2
    assert error.reason == (
        "column 'x': a value without a logical type where other events give it "
        "io.debezium.time.Date")


def test_deletes_read_logical_key_types_from_before() -> None:
    fields = [{"field": "day", "type": "int32", "name": "io.debezium.time.Date"}]
    line = {"schema": _connect_schema(fields),
            "payload": _event("d", 1, before={"day": 2, "v": "x"})}
    batch = translate_jsonl("f.jsonl", _data([line]), ("day",), ORDER)
    assert batch.raw.columns["day"].to_pylist() == [dt.date(1970, 1, 3)]
    assert "v" not in batch.raw.columns


def test_other_file_formats_are_refused(tmp_path: Any) -> None:
    from upsert_core.landing import list_landing
    from upsert_core.landing.debezium_parquet import read_debezium

    (tmp_path / "a.csv").write_text("id\n1\n")
    [file] = list_landing(str(tmp_path))
    with pytest.raises(IngestError, match="a.csv: --envelope debezium reads JSON Lines .* and "
                                          "Parquet"):
        read_debezium(file, SourceSchema(key=KEY, order=ORDER, deleted=DELETE_MARKER))



def test_values_exact_at_a_wide_scale_or_with_zero_nanoseconds_are_read() -> None:
    # Review: a Decimal(38, 18) a float64 holds exactly was refused (Python's default
    # 28-digit context); a ZonedTimestamp whose digits past the sixth are zeros is exact.
    fields = [{"field": "id", "type": "int32"},
              {"field": "amount", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
               "parameters": {"scale": "18", "connect.decimal.precision": "38"}},
              {"field": "at", "type": "string", "name": "io.debezium.time.ZonedTimestamp"}]
    unscaled = 12345678901_500000000000000000
    amount = base64.b64encode(unscaled.to_bytes(16, "big", signed=True)).decode()
    payload = _event("c", 1, after={"id": 1, "amount": amount,
                                    "at": "2024-01-01T10:00:00.123456000+02:00"})
    rows, batch = _rows([{"schema": _connect_schema(fields), "payload": payload}])
    assert batch.raw.errors == []
    assert rows[0]["amount"] == 12345678901.5
    assert rows[0]["at"] == dt.datetime(2024, 1, 1, 8, 0, 0, 123456, tzinfo=dt.UTC)


def test_each_line_is_read_with_its_own_schema_when_the_schema_changes() -> None:
    # The wrapper's schema is parsed once and its logical types read once while it
    # stays the same; a line with another schema is read with that one.
    dated = _connect_schema([{"field": "id", "type": "int32"},
                             {"field": "d", "type": "int32", "name": "io.debezium.time.Date"}])
    untyped = _connect_schema([{"field": "id", "type": "int32"}, {"field": "d", "type": "int32"}])
    lines = [json.dumps({"schema": schema, "payload": _event("c", n, after={"id": n, "d": 1})},
                        separators=(",", ":"))  # as Kafka Connect writes it
             for n, schema in enumerate([dated, dated, untyped, untyped, dated], start=1)]
    rows, batch = _rows(lines)
    assert [(r["id"], r["d"]) for r in rows] == [
        (1, dt.date(1970, 1, 2)), (2, dt.date(1970, 1, 2)), (5, dt.date(1970, 1, 2))]
    reason = "column 'd': a value without a logical type where other events give it"
    assert [(e.row, e.reason.startswith(reason)) for e in batch.raw.errors] == [
        (3, True), (4, True)]
