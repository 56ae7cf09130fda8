"""``--missing keep`` in the landing layer (``landing.missing``): the bitmaps, and which
values each reader and validation mark as left out (absent JSON fields, columns a file
does not have, placeholders of value columns; never key or order columns), with
``--missing null`` changing nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from tests.debezium_events import event, write_events_parquet
from tests.ingest.helpers import write_jsonl, write_parquet
from upsert_core.landing import LandingFile, SourceSchema, list_landing, validate_file
from upsert_core.landing.missing import MissingPolicy, pack, unpack
from upsert_core.landing.schema import LogicalType as T

PH = "__debezium_unavailable_value"
KEEP = MissingPolicy()


@given(arrays(np.bool_, st.tuples(st.integers(0, 20), st.integers(0, 20))), st.integers(0, 24))
def test_bitmaps_round_trip(marks: np.ndarray, wider: int) -> None:
    width = marks.shape[1]
    bitmaps = pack(marks)
    assert len(bitmaps) == marks.shape[0]
    assert np.array_equal(unpack(bitmaps, width), marks)
    # columns past a row's bitmap are not missing (module docstring)
    got = unpack(bitmaps, width + wider)
    assert np.array_equal(got[:, :width], marks) and not got[:, width:].any()


def test_bitmaps_of_different_widths_in_one_column() -> None:
    a = np.array([[True, False, True]])
    b = np.array([[False] * 9 + [True], [True] + [False] * 9])
    joined = pa.chunked_array([pack(a), pack(b)])
    assert unpack(joined, 10).tolist() == [
        [True, False, True] + [False] * 7, [False] * 9 + [True], [True] + [False] * 9]
    sliced = pa.concat_arrays([pack(a), pack(b)]).slice(1)
    assert unpack(sliced, 10).tolist() == b.tolist()


def _file(root: Path, name: str) -> LandingFile:
    [found] = [f for f in list_landing(str(root)) if f.name == name]
    return found


def _marks(batch: object) -> dict[str, list[bool]]:
    assert batch.missing is not None  # type: ignore[attr-defined]
    names = batch.schema.names  # type: ignore[attr-defined]
    return {n: batch.missing[:, j].tolist() for j, n in enumerate(names)}  # type: ignore


def test_jsonl_absent_fields_placeholders_and_shard_columns(tmp_path: Path) -> None:
    schema = SourceSchema(columns=(("key", T.INT64), ("offset", T.INT64), ("old", T.STRING)))
    write_jsonl(tmp_path, "a.jsonl", [
        {"key": 1, "offset": 1, "v": "x", "n": 1},
        {"key": 2, "offset": 1, "v": None, "n": PH},  # explicit null; a placeholder
        {"key": 3, "offset": 1},
        {"key": PH, "offset": 1, "v": "y"},  # placeholder key: error row
    ])
    batch = validate_file(_file(tmp_path, "a.jsonl"), schema, missing=KEEP)
    assert batch.schema.names == ("key", "offset", "old", "v", "n")
    assert _marks(batch) == {
        "key": [False] * 3, "offset": [False] * 3,
        "old": [True] * 3,  # a shard column the file does not have
        "v": [False, False, True], "n": [False, True, True],
    }
    [error] = batch.errors
    assert error.row == 4 and "key column 'key' holds the unavailable-value placeholder" in (
        error.reason)
    assert batch.values is not None and batch.values.column("n").to_pylist() == [1, None, None]

    plain = validate_file(_file(tmp_path, "a.jsonl"), schema)
    assert plain.missing is None  # "n": PH and the key PH do not convert
    assert [(e.row, "cannot convert" in e.reason) for e in plain.errors] == [(2, True),
                                                                             (4, True)]


def test_csv_and_parquet_placeholders_and_absent_columns(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text(f"key,offset,v,w\n1,1,{PH},2\n2,1,,\n3,1,x,\n")
    schema = SourceSchema()
    batch = validate_file(_file(tmp_path, "a.csv"), schema, missing=KEEP)
    assert _marks(batch)["v"] == [True, False, False]
    assert _marks(batch)["w"] == [False, False, False]
    write_parquet(tmp_path, "b.parquet", pa.table({
        "key": [1, 2], "offset": [1, 1], "v": ["x", PH]}))
    shard = SourceSchema(columns=(("key", T.INT64), ("offset", T.INT64), ("w", T.INT64)))
    batch = validate_file(_file(tmp_path, "b.parquet"), shard, missing=KEEP)
    assert _marks(batch) == {"key": [False, False], "offset": [False, False],
                             "w": [True, True], "v": [False, True]}


def test_debezium_placeholder_in_a_logical_type_and_a_key(tmp_path: Path) -> None:
    schema_json = {"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": [
        {"field": "id", "type": "int32"},
        {"field": "at", "type": "int64", "name": "io.debezium.time.MicroTimestamp"}]}]}
    write_jsonl(tmp_path, "a.jsonl", [
        {"schema": schema_json, "payload": event("u", 1, after={"id": 1, "at": PH})},
        {"schema": schema_json, "payload": event("u", 2, after={"id": 2, "at": 5})},
        {"schema": schema_json, "payload": event("u", 3, after={"id": 3})},
        event("u", 4, after={"id": PH, "at": 1}),
    ])
    schema = SourceSchema(key=("id",), order="source.lsn", deleted="(debezium delete)")
    batch = validate_file(_file(tmp_path, "a.jsonl"), schema, envelope="debezium",
                          missing=KEEP)
    assert dict(batch.schema.columns)["at"] is T.TIMESTAMP
    assert _marks(batch)["at"] == [True, False, True]
    assert [e.row for e in batch.errors] == [4]
    plain = validate_file(_file(tmp_path, "a.jsonl"), schema, envelope="debezium")
    assert plain.missing is None
    assert [e.row for e in plain.errors] == [1, 4]  # the placeholder is no timestamp

    write_events_parquet(tmp_path, "b.parquet", [
        event("c", 1, after={"id": 1, "body": PH}), event("c", 2, after={"id": 2, "body": "x"})])
    batch = validate_file(_file(tmp_path, "b.parquet"), schema, envelope="debezium",
                          missing=KEEP)
    assert _marks(batch)["body"] == [True, False]
    assert batch.values is not None and batch.values.column("body").to_pylist() == [None, "x"]


@pytest.mark.parametrize("placeholder", [PH, "N/A"])
def test_another_placeholder(tmp_path: Path, placeholder: str) -> None:
    write_jsonl(tmp_path, "a.jsonl", [{"key": 1, "offset": 1, "v": "N/A", "w": PH},
                                      {"key": 2, "offset": 1, "v": "a", "w": "b"}])
    batch = validate_file(_file(tmp_path, "a.jsonl"), SourceSchema(),
                          missing=MissingPolicy(placeholder))
    marks = _marks(batch)
    assert (marks["v"], marks["w"]) == (([False, False], [True, False]) if placeholder == PH
                                        else ([True, False], [False, False]))


def _bytes_schema(*fields: dict[str, object]) -> dict[str, object]:
    """A Connect schema whose ``after`` has ``id`` (int32) and ``fields``."""
    return {"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": [
        {"field": "id", "type": "int32"}, *fields]}]}


B64 = "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="  # base64 of the placeholder's bytes


def test_debezium_jsonl_binary_placeholder_is_its_base64(tmp_path: Path) -> None:
    """Debezium puts the placeholder into a binary column as its bytes, and JsonConverter
    writes Connect ``bytes`` as base64: in a field the wrapper's schema types ``bytes``,
    that base64 is the placeholder (marked, made null); in a ``string`` field the same
    text is a value; in a key it is an error row, as the string placeholder is."""
    schema_json = _bytes_schema({"field": "blob", "type": "bytes", "optional": True},
                                {"field": "text", "type": "string", "optional": True})
    keyed = {"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": [
        {"field": "id", "type": "bytes"}]}]}
    write_jsonl(tmp_path, "a.jsonl", [
        {"schema": schema_json, "payload": event("u", 1, after={"id": 1, "blob": B64,
                                                                 "text": B64})},
        {"schema": schema_json, "payload": event("u", 2, after={"id": 2, "blob": "AAE=",
                                                                 "text": PH})},
        {"schema": schema_json, "payload": event("u", 3, after={"id": 3, "blob": PH})},
        {"schema": keyed, "payload": event("u", 4, after={"id": B64})},
    ])
    schema = SourceSchema(key=("id",), order="source.lsn", deleted="(debezium delete)")
    batch = validate_file(_file(tmp_path, "a.jsonl"), schema, envelope="debezium",
                          missing=KEEP)
    marks = _marks(batch)
    assert marks["blob"] == [True, False, True]
    assert marks["text"] == [False, True, True]  # row 3 leaves it out
    assert batch.values is not None
    assert batch.values.column("blob").to_pylist() == [None, "AAE=", None]
    assert batch.values.column("text").to_pylist() == [B64, None, None]
    [error] = batch.errors
    assert error.row == 4 and "placeholder" in error.reason and "'id'" in error.reason

    plain = validate_file(_file(tmp_path, "a.jsonl"), schema, envelope="debezium")
    assert plain.missing is None and plain.values is not None
    assert plain.values.column("blob").to_pylist()[:2] == [B64, "AAE="]  # --missing null


def test_debezium_jsonl_binary_placeholder_follows_unavailable(tmp_path: Path) -> None:
    schema_json = _bytes_schema({"field": "blob", "type": "bytes", "optional": True})
    write_jsonl(tmp_path, "a.jsonl", [
        {"schema": schema_json, "payload": event("u", 1, after={"id": 1, "blob": B64})},
        {"schema": schema_json, "payload": event("u", 2, after={"id": 2, "blob": "Pz8/"})},
    ])
    schema = SourceSchema(key=("id",), order="source.lsn", deleted="(debezium delete)")
    batch = validate_file(_file(tmp_path, "a.jsonl"), schema, envelope="debezium",
                          missing=MissingPolicy("???"))  # "Pz8/" is base64 of b"???"
    assert _marks(batch)["blob"] == [False, True]


def test_binary_columns_hold_the_placeholder_as_its_bytes(tmp_path: Path) -> None:
    """Parquet of Debezium events (Kafka Connect's S3 sink writes a binary column's
    placeholder as raw bytes), and any binary value column of a plain Parquet file."""
    raw = PH.encode()
    write_events_parquet(tmp_path, "a.parquet", [
        event("c", 1, after={"id": 1, "blob": raw}), event("c", 2, after={"id": 2, "blob": b"x"}),
        event("c", 3, after={"id": 3, "blob": None})])
    schema = SourceSchema(key=("id",), order="source.lsn", deleted="(debezium delete)")
    batch = validate_file(_file(tmp_path, "a.parquet"), schema, envelope="debezium",
                          missing=KEEP)
    assert dict(batch.schema.columns)["blob"] is T.BINARY
    assert _marks(batch)["blob"] == [True, False, False]  # an explicit null is not missing
    assert batch.values is not None
    assert batch.values.column("blob").to_pylist() == [None, b"x", None]

    write_parquet(tmp_path, "b.parquet", pa.table({
        "key": [1, 2], "offset": [1, 1],
        "v": pa.array([raw, b"y"], pa.large_binary()), "w": pa.array([raw[:3], raw])}))
    batch = validate_file(_file(tmp_path, "b.parquet"), SourceSchema(), missing=KEEP)
    assert (_marks(batch)["v"], _marks(batch)["w"]) == ([True, False], [False, True])
    write_parquet(tmp_path, "c.parquet", pa.table({
        "key": pa.array([raw, b"k"]), "offset": [1, 1], "v": ["a", "b"]}))
    batch = validate_file(_file(tmp_path, "c.parquet"), SourceSchema(), missing=KEEP)
    [error] = batch.errors
    assert error.row == 1 and "placeholder" in error.reason and "'key'" in error.reason
