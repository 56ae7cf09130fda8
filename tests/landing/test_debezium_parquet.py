"""Debezium events in Parquet files (``upsert_core.landing.debezium_parquet``): every op,
skipped events, every error-row reason (the JSON Lines path's, same rows), file-level
layout errors naming the file and column, logical types (Arrow's, and Debezium's from
the footer's Avro schema), chunked reading; and generated event files that give, after
validation, what the equivalent JSON Lines file gives."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.debezium_events import (
    avro_envelope,
    event,
    events_table,
    jsonl_bytes,
    parquet_bytes,
    write_events_parquet,
)
from upsert_core.errors import IngestError
from upsert_core.landing import list_landing
from upsert_core.landing.debezium import DELETE_MARKER, DebeziumBatch, translate_jsonl
from upsert_core.landing.debezium_parquet import (
    connect_logical_types,
    debezium_chunks,
    read_debezium,
    translate_parquet,
)
from upsert_core.landing.readers import read_parquet
from upsert_core.landing.rows import decode_row
from upsert_core.landing.schema import LogicalType, SourceSchema
from upsert_core.landing.validate import ValidatedBatch, validate_batch, validate_chunks

KEY = ("id",)
ORDER = "source.lsn"
SCHEMA = SourceSchema(key=KEY, order=ORDER, deleted=DELETE_MARKER)
IMAGE = pa.struct([("id", pa.int32()), ("v", pa.string())])


def _translate(table: pa.Table, order: str = ORDER, key: tuple[str, ...] = KEY) -> DebeziumBatch:
    return translate_parquet(read_parquet("f.parquet", parquet_bytes(table)), key, order)


def _rows(batch: DebeziumBatch) -> list[dict[str, Any]]:
    raw = batch.raw
    cols = {name: col.to_pylist() for name, col in raw.columns.items()}  # type: ignore[union-attr]
    return [{name: values[i] for name, values in cols.items()} for i in range(raw.num_rows)]


def test_create_read_update_make_the_after_row_and_delete_reads_the_key() -> None:
    batch = _translate(events_table([
        event("c", 1, after={"id": 1, "v": "a"}),
        event("r", 2, after={"id": 2, "v": "b"}),
        event("u", 3, before={"id": 1, "v": "a"}, after={"id": 1, "v": "c"}),
        event("d", 4, before={"id": 2, "v": "b"}),
    ], image=IMAGE))
    assert _rows(batch) == [
        {"id": 1, "v": "a", ORDER: 1, DELETE_MARKER: False},
        {"id": 2, "v": "b", ORDER: 2, DELETE_MARKER: False},
        {"id": 1, "v": "c", ORDER: 3, DELETE_MARKER: False},
        {"id": 2, "v": None, ORDER: 4, DELETE_MARKER: True},
    ]
    assert list(batch.raw.positions) == [1, 2, 3, 4]
    assert batch.raw.errors == [] and batch.skipped == 0


def test_a_file_that_starts_with_a_delete_orders_the_key_first() -> None:
    # As JSON Lines names them: the first kept event's row (a delete: the key columns).
    batch = _translate(events_table([
        event("d", 1, before={"v": "x", "id": 1}),
        event("c", 2, after={"v": "y", "id": 2}),
    ], image=pa.struct([("v", pa.string()), ("id", pa.int64())])))
    assert list(batch.raw.columns) == ["id", ORDER, DELETE_MARKER, "v"]
    only_deletes = _translate(events_table([event("d", 1, before={"v": "x", "id": 1})],
                                           image=pa.struct([("v", pa.string()),
                                                            ("id", pa.int64())])))
    assert list(only_deletes.raw.columns) == ["id", ORDER, DELETE_MARKER]


def test_truncate_and_message_are_skipped_and_counted() -> None:
    batch = _translate(events_table([event("t", 1), event("m", 2),
                                     event("c", 3, after={"id": 1, "v": "a"})], image=IMAGE))
    assert batch.skipped == 2 and batch.raw.errors == []
    assert list(batch.raw.positions) == [3]


def test_only_skipped_events_is_an_empty_batch() -> None:
    batch = _translate(events_table([event("t", 1)], image=IMAGE))
    assert batch.raw.num_rows == 0 and batch.raw.columns == {} and batch.skipped == 1


@pytest.mark.parametrize(("bad", "reason"), [
    (event(None, 2, after={"id": 2, "v": "x"}), "Debezium event has no 'op'"),
    (event("x", 2, after={"id": 2, "v": "x"}), "Debezium event has an unknown op 'x'"),
    (event("c", 2), "Debezium event with op 'c' lacks 'after'"),
    (event("u", 2, before={"id": 2, "v": "x"}), "Debezium event with op 'u' lacks 'after'"),
    (event("d", 2, after={"id": 2, "v": "x"}), "Debezium event with op 'd' lacks 'before'"),
])
def test_error_rows_name_the_row_and_match_json_lines(bad: dict[str, Any], reason: str) -> None:
    events = [event("c", 1, after={"id": 1, "v": "a"}), bad, event("c", 3, after={"id": 3})]
    batch = _translate(events_table(events, image=IMAGE))
    assert [(e.file, e.row, e.reason) for e in batch.raw.errors] == [("f.parquet", 2, reason)]
    assert list(batch.raw.positions) == [1, 3]
    same = translate_jsonl("f.parquet", jsonl_bytes(events), KEY, ORDER)
    assert same.raw.errors == batch.raw.errors


def test_a_file_without_op_has_every_row_an_error_row() -> None:
    table = pa.table({"id": [1, 2], ORDER: [1, 2]})
    batch = _translate(table)
    assert [(e.row, e.reason) for e in batch.raw.errors] == [
        (1, "Debezium event has no 'op'"), (2, "Debezium event has no 'op'")]


def test_fields_named_like_the_order_or_marker_are_error_rows_of_row_events() -> None:
    image = pa.struct([("id", pa.int64()), (ORDER, pa.int64())])
    batch = _translate(events_table([event("c", 1, after={"id": 1, ORDER: 5}),
                                     event("d", 2, before={"id": 1, ORDER: 5})], image=image))
    assert [(e.row, e.reason) for e in batch.raw.errors] == [
        (1, f"field {ORDER!r} of 'after' is named like the envelope's order")]
    assert _rows(batch) == [{"id": 1, ORDER: 2, DELETE_MARKER: True}]


def test_a_field_named_like_the_default_marker_is_an_ordinary_column() -> None:
    image = pa.struct([("id", pa.int64()), ("__deleted", pa.bool_())])
    batch = _translate(events_table([event("c", 1, after={"id": 1, "__deleted": True})],
                                    image=image))
    assert _rows(batch)[0]["__deleted"] is True and _rows(batch)[0][DELETE_MARKER] is False


def test_order_reaches_inside_the_event() -> None:
    table = events_table([event("c", 7, after={"id": 1, "v": "a"})], image=IMAGE)
    assert _rows(_translate(table, order="ts_ms"))[0]["ts_ms"] == 1007
    assert _rows(_translate(table, order="source.lsn"))[0]["source.lsn"] == 7
    flat = pa.table({"op": ["c"], "after": pa.array([{"id": 1}]), "source.lsn": [9]})
    assert _rows(_translate(flat))[0]["source.lsn"] == 9  # a column named with the dot first
    nested = _translate(table, order="source")
    assert [e.reason for e in nested.raw.errors] == [
        "order 'source' is not a number or a timestamp: {'lsn': 7, 'db': 'shop'}"]


def test_null_key_or_order_is_an_error_row_from_validation() -> None:
    events = [event("c", 1, after={"id": None, "v": "a"}), event("c", None, after={"id": 2}),
              event("d", 3, before={"v": "x", "id": None})]
    batch = _translate(events_table(events, image=IMAGE))
    out = validate_batch(batch.raw, SCHEMA)
    assert len(out) == 0
    assert [(e.row, e.reason) for e in out.errors] == [
        (1, "null key column 'id'"), (2, "null order column 'source.lsn'"),
        (3, "null key column 'id'")]


def test_a_key_the_before_image_lacks_is_a_null_key() -> None:
    table = pa.table({"op": ["d"], "before": pa.array([{"v": "x"}]),
                      "after": pa.array([None], pa.struct([("id", pa.int64())])),
                      "source": pa.array([{"lsn": 1}])})
    out = validate_batch(_translate(table).raw, SCHEMA)
    assert [(e.row, e.reason) for e in out.errors] == [(1, "null key column 'id'")]


@pytest.mark.parametrize(("columns", "message"), [
    ({"op": pa.array([1]), "after": pa.array([{"id": 1}])},
     "f.parquet: column 'op' has type int64: a Debezium event's op is a string"),
    ({"op": pa.array(["c"]), "after": pa.array(['{"id": 1}'])},
     "f.parquet: column 'after' has type string: Debezium's before and after are structs"),
    ({"op": pa.array(["d"]), "before": pa.array([1])},
     "f.parquet: column 'before' has type int64"),
    ({"op": pa.array(["d"]), "before": pa.array([{"id": "1"}]),
      "after": pa.array([None], pa.struct([("id", pa.int64())]))},
     "f.parquet: key column 'id' has type int64 in 'after' but string in 'before'"),
])
def test_a_wrong_layout_is_a_file_error_naming_the_column(
    columns: dict[str, pa.Array], message: str
) -> None:
    table = pa.table({**columns, "source": pa.array([{"lsn": 1}])})
    with pytest.raises(IngestError) as caught:
        _translate(table)
    assert str(caught.value).startswith(message), str(caught.value)


def test_a_key_typed_alike_in_before_and_after_is_read_as_one_column() -> None:
    table = pa.table({
        "op": ["c", "d"],
        "after": pa.array([{"id": 1}, None], pa.struct([("id", pa.int32())])),
        "before": pa.array([None, {"id": 2}], pa.struct([("id", pa.int64())])),
        "source": pa.array([{"lsn": 1}, {"lsn": 2}]),
    })
    assert [r["id"] for r in _rows(_translate(table))] == [1, 2]


def test_duplicate_fields_in_an_image_are_a_file_error() -> None:
    image = pa.StructArray.from_arrays([pa.array([1]), pa.array([2])], names=["id", "id"])
    table = pa.table({"op": ["c"], "after": image, "source": pa.array([{"lsn": 1}])})
    with pytest.raises(IngestError, match="f.parquet: column 'after' has a duplicate field 'id'"):
        _translate(table)


def test_parquet_logical_types_are_the_column_types() -> None:
    image = pa.struct([("id", pa.int64()), ("at", pa.timestamp("ms", tz="UTC")),
                       ("day", pa.date32()), ("amount", pa.decimal128(10, 2))])
    after = {"id": 1, "at": dt.datetime(2024, 1, 2, 3, 4, 5, 6000, tzinfo=dt.UTC),
             "day": dt.date(2024, 1, 2), "amount": Decimal("12.34")}
    out = validate_batch(_translate(events_table([event("c", 1, after=after)],
                                                 image=image)).raw, SCHEMA)
    assert out.errors == []
    types = dict(out.schema.columns)
    assert types["at"] is LogicalType.TIMESTAMP and types["day"] is LogicalType.DATE
    assert types["amount"] is LogicalType.FLOAT64
    row = decode_row(out.schema, out.rows[0])
    assert row["amount"] == 12.34 and row["day"] == dt.date(2024, 1, 2)


AVRO_FIELDS = [
    {"name": "id", "type": "int"},
    {"name": "ms", "type": ["null", {"type": "long", "connect.version": 1,
                                     "connect.name": "io.debezium.time.Timestamp"}]},
    {"name": "us", "type": ["null", {"type": "long", "connect.version": 1,
                                     "connect.name": "io.debezium.time.MicroTimestamp"}]},
    {"name": "ns", "type": ["null", {"type": "long", "connect.version": 1,
                                     "connect.name": "io.debezium.time.NanoTimestamp"}]},
    {"name": "zoned", "type": ["null", {"type": "string", "connect.version": 1,
                                        "connect.name": "io.debezium.time.ZonedTimestamp"}]},
    {"name": "day", "type": ["null", {"type": "int", "connect.version": 1,
                                      "connect.name": "io.debezium.time.Date"}]},
    {"name": "plain", "type": ["null", "long"]},
]
AVRO_IMAGE = pa.struct([("id", pa.int32()), ("ms", pa.int64()), ("us", pa.int64()),
                        ("ns", pa.int64()), ("zoned", pa.string()), ("day", pa.int32()),
                        ("plain", pa.int64())])
CONNECT_SCHEMA = {"type": "struct", "fields": [
    {"field": side, "type": "struct", "optional": True, "fields": [
        {"field": "id", "type": "int32"},
        {"field": "ms", "type": "int64", "name": "io.debezium.time.Timestamp"},
        {"field": "us", "type": "int64", "name": "io.debezium.time.MicroTimestamp"},
        {"field": "ns", "type": "int64", "name": "io.debezium.time.NanoTimestamp"},
        {"field": "zoned", "type": "string", "name": "io.debezium.time.ZonedTimestamp"},
        {"field": "day", "type": "int32", "name": "io.debezium.time.Date"},
        {"field": "plain", "type": "int64"},
    ]} for side in ("before", "after")]}


def test_the_footer_avro_schema_names_debezium_logical_types() -> None:
    types = connect_logical_types({b"parquet.avro.schema": __import__("json").dumps(
        avro_envelope(AVRO_FIELDS)).encode()})
    assert types["after"]["us"] == ("io.debezium.time.MicroTimestamp", {})
    assert set(types["after"]) == set(types["before"]) == {"ms", "us", "ns", "zoned", "day"}
    assert connect_logical_types({}) == {}
    assert connect_logical_types({b"parquet.avro.schema": b"{not json"}) == {}


def test_debezium_logical_types_read_as_json_lines_reads_them() -> None:
    afters = [
        {"id": 1, "ms": 1_700_000_000_123, "us": 1_700_000_000_123_456,
         "ns": 1_700_000_000_123_456_000, "zoned": "2023-11-14T23:13:20.5+01:00",
         "day": 19_000, "plain": 5},
        {"id": 2, "ms": None, "us": -1, "ns": 1_000, "zoned": "2024-01-01T10:00:00.123456000Z",
         "day": -1, "plain": None},
        # not of their logical type: error rows, as in JSON Lines
        {"id": 3, "ms": 0, "us": 0, "ns": 1_500, "zoned": None, "day": 0, "plain": 0},
        {"id": 4, "ms": 0, "us": 0, "ns": 0, "zoned": "2023-01-01T00:00", "day": 0, "plain": 0},
        {"id": 5, "ms": 10**17, "us": 0, "ns": 0, "zoned": None, "day": 0, "plain": 0},
        {"id": 6, "ms": 0, "us": 0, "ns": 0, "zoned": "2024-01-01T10:00:00.1234567Z", "day": 0,
         "plain": 0},
        {"id": 7, "ms": 0, "us": 0, "ns": 0, "zoned": "2023-01-01 00:00:00+01:00", "day": 0,
         "plain": 0},
    ]
    events = [event("c", i + 1, after=a) for i, a in enumerate(afters)]
    events.append(event("d", 20, before={**afters[0], "id": 9}))
    table = events_table(events, image=AVRO_IMAGE, avro_schema=avro_envelope(AVRO_FIELDS))
    parquet = validate_batch(_translate(table).raw, SCHEMA)
    json_lines = validate_batch(translate_jsonl(
        "f.parquet", jsonl_bytes({"schema": CONNECT_SCHEMA, "payload": e} for e in events),
        KEY, ORDER).raw, SCHEMA)
    _assert_same(parquet, json_lines)
    assert [e.row for e in parquet.errors] == [3, 4, 5, 6]
    types = dict(parquet.schema.columns)
    assert types["ms"] is types["zoned"] is LogicalType.TIMESTAMP
    assert types["day"] is LogicalType.DATE and types["plain"] is LogicalType.INT64
    first = decode_row(parquet.schema, parquet.rows[0])
    assert first["zoned"] == dt.datetime(2023, 11, 14, 22, 13, 20, 500000, tzinfo=dt.UTC)
    assert first["ns"] == first["us"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123456,
                                                     tzinfo=dt.UTC)


def test_read_debezium_reads_parquet_and_refuses_csv(tmp_path: Path) -> None:
    write_events_parquet(tmp_path, "a.parquet", [event("c", 1, after={"id": 1})])
    (tmp_path / "b.csv").write_text("id\n1\n")
    parquet, csv = list_landing(str(tmp_path))
    assert read_debezium(parquet, SCHEMA).raw.num_rows == 1
    with pytest.raises(IngestError, match=r"b.csv: --envelope debezium reads JSON Lines "
                                          r"\(.jsonl\) and Parquet \(.parquet\) files only"):
        read_debezium(csv, SCHEMA)


def test_chunks_give_what_the_whole_file_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = []
    for i in range(1, 60):
        op = "ctrudmx"[i % 7]
        if op == "d":
            events.append(event(op, i, before={"id": i % 5, "v": "gone"}))
        else:
            events.append(event(op, i, after={"id": i % 5, "v": f"v{i}"}))
    write_events_parquet(tmp_path, "f.parquet", events, image=IMAGE)
    [file] = list_landing(str(tmp_path))
    monkeypatch.setenv("UPSERT_STREAM_CHUNK_ROWS", "7")
    chunks = list(debezium_chunks(file, SCHEMA))
    assert len(chunks) == 9
    whole = read_debezium(file, SCHEMA)
    skipped = sum(1 for e in events if e["op"] in ("t", "m"))
    assert sum(c.skipped for c in chunks) == whole.skipped == skipped == 17
    assert [e for c in chunks for e in c.raw.errors] == whole.raw.errors
    assert [int(p) for c in chunks for p in c.raw.positions] == list(whole.raw.positions)
    validated = list(validate_chunks(file, SCHEMA, envelope="debezium"))
    assert sum(b.skipped for b in validated) == skipped
    one = validate_batch(whole.raw, SCHEMA)
    assert [r for b in validated for r in b.rows] == one.rows
    assert [e for b in validated for e in b.errors] == one.errors


# --- generated files: Parquet gives what JSON Lines gives --------------------------------


def _assert_same(parquet: ValidatedBatch, json_lines: ValidatedBatch) -> None:
    """The same rows, keys, orders, deletes, row numbers and errors; rows compared as
    decoded values (a column null in every event is typed by Parquet, not by JSON)."""
    assert parquet.errors == json_lines.errors
    assert parquet.keys == json_lines.keys
    assert list(parquet.positions) == list(json_lines.positions)
    assert list(parquet.orders) == list(json_lines.orders)
    assert list(parquet.deletes) == list(json_lines.deletes)
    names = set(parquet.schema.names) | set(json_lines.schema.names)

    def decoded(batch: ValidatedBatch) -> list[dict[str, Any]]:
        out = []
        for row in batch.rows:
            values = decode_row(batch.schema, row)
            out.append({n: values.get(n) for n in names})
        return out

    assert decoded(parquet) == decoded(json_lines)
    for name, typ in parquet.schema.columns:
        assert json_lines.schema.type_of(name) in (None, typ)


images = st.one_of(st.none(), st.fixed_dictionaries({
    "id": st.one_of(st.none(), st.integers(-3, 3)),
    "v": st.one_of(st.none(), st.text(max_size=3)),
    "w": st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)),
}))


@st.composite
def events_strategy(draw: st.DrawFn) -> dict[str, Any]:
    op = draw(st.sampled_from(["c", "r", "u", "d", "t", "m", "x", None]))
    return event(op, draw(st.one_of(st.none(), st.integers(0, 50))),
                 before=draw(images), after=draw(images))


@settings(max_examples=150, deadline=None)
@given(events=st.lists(events_strategy(), max_size=12))
def test_generated_parquet_files_validate_as_json_lines(events: list[dict[str, Any]]) -> None:
    image = pa.struct([("id", pa.int64()), ("v", pa.string()), ("w", pa.float64())])
    parquet = _translate(events_table(events, image=image,
                                      source=pa.struct([("lsn", pa.int64()),
                                                        ("db", pa.string())])))
    json_lines = translate_jsonl("f.parquet", jsonl_bytes(events), KEY, ORDER)
    assert parquet.skipped == json_lines.skipped
    assert parquet.raw.errors == json_lines.raw.errors
    assert list(parquet.raw.positions) == list(json_lines.raw.positions)
    _assert_same(validate_batch(parquet.raw, SCHEMA), validate_batch(json_lines.raw, SCHEMA))
