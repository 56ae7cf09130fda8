"""A Debezium order field and a column of ``after`` with the same name
(``--order ts_ms`` where the table has a ``ts_ms`` column): a shard created now stores
the order under its reserved name (``ENVELOPE_ORDER_PREFIX``), so the column is an
ordinary value column in JSON Lines and Parquet alike; a shard created before keeps
its stored layout, where such a field is an error row as it always was. Messages name
the order as ``--order`` does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.debezium_events import write_events_jsonl, write_events_parquet
from upsert_core.landing import LandingFile, list_landing, validate_file
from upsert_core.landing.debezium import DELETE_MARKER
from upsert_core.landing.schema import ENVELOPE_ORDER_PREFIX, LogicalType, SourceSchema

P = ENVELOPE_ORDER_PREFIX
IMAGE = pa.struct([("id", pa.int64()), ("name", pa.string()), ("ts_ms", pa.int64())])


def _schema(order: str | tuple[str, ...], reserved: bool) -> SourceSchema:
    return SourceSchema(key=("id",), order=order, deleted=DELETE_MARKER, envelope_order=reserved)


def _e(op: str, lsn: int | None, ts_ms: int | None, **images: Any) -> dict[str, Any]:
    return {"op": op, "source": {"lsn": lsn}, "ts_ms": ts_ms, **images}


EVENTS = [
    _e("c", 1, 1001, after={"id": 1, "name": "a", "ts_ms": 5}),  # the table's own ts_ms
    _e("u", 2, 1002, after={"id": 2, "name": "b", "ts_ms": None}),
    _e("d", 3, 1003, before={"id": 1, "name": "a", "ts_ms": 5}),
]


def _write(root: Path, fmt: str, events: list[dict[str, Any]]) -> LandingFile:
    if fmt == "jsonl":
        write_events_jsonl(root, "f.jsonl", events)
    else:
        write_events_parquet(root, "f.parquet", events, image=IMAGE)
    [file] = list_landing(str(root))
    return file


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_field_of_after_named_like_the_order_is_a_value_column(tmp_path: Path, fmt: str) -> None:
    batch = validate_file(_write(tmp_path, fmt, EVENTS), _schema("ts_ms", True),
                          envelope="debezium")
    assert batch.errors == []
    columns = dict(batch.schema.columns)
    assert columns[P + "ts_ms"] is LogicalType.INT64 and columns["ts_ms"] is LogicalType.INT64
    assert batch.schema.role(P + "ts_ms") == "order" and batch.schema.role("ts_ms") == "value"
    assert batch.values is not None
    assert batch.values.column(P + "ts_ms").to_pylist() == [1001, 1002, 1003]
    assert batch.values.column("ts_ms").to_pylist() == [5, None, None]  # a delete: key only


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_several_order_fields_each_get_a_reserved_column(tmp_path: Path, fmt: str) -> None:
    schema = _schema(("ts_ms", "source.lsn"), True)
    batch = validate_file(_write(tmp_path, fmt, EVENTS), schema, envelope="debezium")
    assert batch.errors == [] and batch.values is not None
    assert batch.values.column(P + "ts_ms").to_pylist() == [1001, 1002, 1003]
    assert batch.values.column(P + "source.lsn").to_pylist() == [1, 2, 3]
    assert batch.values.column("ts_ms").to_pylist() == [5, None, None]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_shard_created_before_keeps_its_layout_and_its_error_rows(
    tmp_path: Path, fmt: str
) -> None:
    """Its rows store the order under the field's name, so a field of ``after`` of that
    name is still an error row (what it was), and the other events apply as before."""
    batch = validate_file(_write(tmp_path, fmt, EVENTS), _schema("ts_ms", False),
                          envelope="debezium")
    reasons = {e.row: e.reason for e in batch.errors}
    assert set(reasons) == {1, 2}  # both carry the field (row 2 as null)
    assert "field 'ts_ms' of 'after' is named like the envelope's order" in reasons[1]
    assert batch.values is not None
    assert batch.values.column("ts_ms").to_pylist() == [1003]  # the delete's order
    assert P + "ts_ms" not in batch.schema.names


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_field_with_the_reserved_name_is_an_error_row(tmp_path: Path, fmt: str) -> None:
    image = pa.struct([("id", pa.int64()), (P + "ts_ms", pa.int64())])
    events = [_e("c", 1, 1001, after={"id": 1, P + "ts_ms": 7}),
              _e("c", 2, 1002, after={"id": 2})]
    if fmt == "jsonl":
        write_events_jsonl(tmp_path, "f.jsonl", events)
    else:
        write_events_parquet(tmp_path, "f.parquet", events, image=image)
    [file] = list_landing(str(tmp_path))
    batch = validate_file(file, _schema("ts_ms", True), envelope="debezium")
    # Parquet: the field is in every row event's struct (null in the second one)
    assert [e.row for e in batch.errors] == ([1] if fmt == "jsonl" else [1, 2])
    assert {e.reason for e in batch.errors} == {
        f"field {P + 'ts_ms'!r} of 'after' is named like the envelope's order"}


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_null_order_is_named_as_the_order_names_it(tmp_path: Path, fmt: str) -> None:
    events = [_e("c", 1, None, after={"id": 1, "name": "a", "ts_ms": 5})]
    batch = validate_file(_write(tmp_path, fmt, events), _schema("ts_ms", True),
                          envelope="debezium")
    [error] = batch.errors
    assert error.reason == "null order column 'ts_ms'"
