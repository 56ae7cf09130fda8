"""``upsertctl ingest --missing keep`` on the embedded defaults (CONTRACT.md, "Change data
capture"): JSON Lines rows without a field, Parquet files without a column, Debezium
events with the TOAST placeholder (JSON Lines with a logical type, and Parquet); the
changelog's retraction carries the old full row and the insertion the merged one; the
setting is fixed for the shard (``inspect`` shows it, a conflicting one is refused
naming the shard); a placeholder in a key or order column is an error row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.debezium_events import event, write_events_parquet
from tests.e2e.helpers import Cli, write_jsonl, write_parquet

pytestmark = pytest.mark.parametrize("deployment", ["embedded"], indirect=True)

PH = "__debezium_unavailable_value"


def _by_key(rows: list[dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    return {r["key"]: r for r in rows}


def test_jsonl_rows_without_a_field_keep_the_previous_value(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "0001.jsonl", [
        {"key": 1, "offset": 1, "name": "ann", "amount": 0.1, "vip": True},
        {"key": 2, "offset": 1, "name": "bob", "amount": 2.5, "vip": False},
    ])
    cli.ingest(landing, "--missing", "keep")
    assert cli.inspect()["missing"] == "keep"
    assert cli.inspect()["unavailable"] == PH
    write_jsonl(landing, "0002.jsonl", [
        {"key": 1, "offset": 3, "vip": None},  # explicit null sets null
        {"key": 1, "offset": 2, "name": "anne"},  # applied before offset 3
        {"key": 2, "offset": 2, "amount": PH, "name": "bobby"},
        {"key": 3, "offset": 1, "name": "cy"},  # a new key: left-out values are null
    ])
    cli.ingest(landing)  # later runs may omit it
    assert _by_key(cli.snapshot()) == {
        1: {"key": 1, "offset": 3, "name": "anne", "amount": 0.1, "vip": None},
        2: {"key": 2, "offset": 2, "name": "bobby", "amount": 2.5, "vip": False},
        3: {"key": 3, "offset": 1, "name": "cy", "amount": None, "vip": None},
    }
    changes = cli.changes(since=1)
    retracted = [c["row"] for c in changes if c["diff"] == -1]
    inserted = [c["row"] for c in changes if c["diff"] == 1]
    # the retraction is the old full row, the insertion the merged one
    assert {"key": 2, "offset": 1, "name": "bob", "amount": 2.5, "vip": False} in retracted
    assert {"key": 2, "offset": 2, "name": "bobby", "amount": 2.5, "vip": False} in inserted
    assert len(retracted) == 2 and len(inserted) == 3
    assert cli.check().rc == 0


def test_a_delete_in_the_batch_leaves_nothing_to_keep(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "0001.jsonl", [{"key": 1, "offset": 1, "name": "ann", "n": 7}])
    cli.ingest(landing, "--missing", "keep", "--order-scope", "global")
    write_jsonl(landing, "0002.jsonl", [
        {"key": 1, "offset": 4, "n": 8},
        {"key": 1, "offset": 2, "__deleted": True},
        {"key": 1, "offset": 0, "name": "late"},  # late: skipped first
    ])
    cli.ingest(landing)
    assert cli.snapshot() == [{"key": 1, "offset": 4, "name": None, "n": 8}]


def test_parquet_files_without_a_column(cli: Cli, landing: Path) -> None:
    ts = pa.array([1_700_000_000_123_456], pa.timestamp("us", tz="UTC"))
    write_parquet(landing, "0001.parquet", pa.table({
        "key": [1], "offset": [1], "name": ["ann"], "amount": [-0.5], "seen": ts}))
    cli.ingest(landing, "--missing", "keep")
    write_parquet(landing, "0002.parquet", pa.table({
        "key": [1, 2], "offset": [2, 1], "name": [None, "bob"]}))  # amount, seen left out
    write_parquet(landing, "0003.parquet", pa.table({
        "key": [1], "offset": [3], "amount": [1.25], "extra": [True]}))  # a column added
    cli.ingest(landing)
    assert _by_key(cli.snapshot()) == {
        1: {"key": 1, "offset": 3, "name": None, "amount": 1.25,
            "seen": "2023-11-14T22:13:20.123456+00:00", "extra": True},
        2: {"key": 2, "offset": 1, "name": "bob", "amount": None, "seen": None, "extra": None},
    }
    assert cli.check().rc == 0


SCHEMA = {"type": "struct", "fields": [
    {"field": "after", "type": "struct", "optional": True, "fields": [
        {"field": "id", "type": "int32"},
        {"field": "body", "type": "string", "optional": True},
        {"field": "updated", "type": "int64", "name": "io.debezium.time.MicroTimestamp"},
    ]},
]}


def _dbz(op: str, lsn: int, **images: Any) -> dict[str, Any]:
    return {"schema": SCHEMA, "payload": {"op": op, "source": {"lsn": lsn}, **images}}


def test_debezium_toast_placeholder_keeps_the_stored_value(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "0001.jsonl", [
        _dbz("r", 10, after={"id": 1, "body": "a long text", "updated": 5}),
        _dbz("r", 11, after={"id": 2, "body": "other", "updated": 6}),
    ])
    cli.ingest(landing, "--envelope", "debezium", "--key", "id", "--missing", "keep")
    write_jsonl(landing, "0002.jsonl", [
        # an update that did not touch the TOASTed column (nor, here, the timestamp)
        _dbz("u", 12, after={"id": 1, "body": PH, "updated": PH}),
        _dbz("u", 13, after={"id": 2, "body": "new", "updated": 9}),
        _dbz("u", 14, after={"id": PH, "body": "x", "updated": 1}),  # placeholder key
    ])
    result = cli.ingest(landing)
    assert "1 error row(s)" in result.err
    rows = {r["id"]: r for r in cli.snapshot()}
    assert rows[1]["body"] == "a long text" and "source.lsn" not in rows[1]
    assert rows[1]["updated"] == "1970-01-01T00:00:00.000005+00:00"  # the stored timestamp
    assert rows[2]["body"] == "new"
    [error] = [e for e in cli.errors() if e["file"] == "0002.jsonl"]
    assert error["row"] == 3 and "placeholder" in error["reason"] and "'id'" in error["reason"]


def test_debezium_parquet_with_the_placeholder(cli: Cli, landing: Path) -> None:
    write_events_parquet(landing, "0001.parquet", [
        event("c", 1, after={"id": 1, "body": "kept", "n": 1})])
    cli.ingest(landing, "--envelope", "debezium", "--key", "id", "--missing", "keep")
    write_events_parquet(landing, "0002.parquet", [
        event("u", 2, after={"id": 1, "body": PH, "n": 2})])
    cli.ingest(landing)
    assert cli.snapshot() == [{"id": 1, "body": "kept", "n": 2}]


def test_debezium_binary_columns_keep_their_bytes(cli: Cli, landing: Path) -> None:
    """A ``bytea`` column Debezium could not read carries the placeholder's bytes: raw in
    Parquet, base64 in JSON Lines under a schema typing the field ``bytes``. Both keep the
    stored value; a new value still replaces it."""
    image = pa.struct([("id", pa.int64()), ("blob", pa.binary()), ("n", pa.int64())])
    write_events_parquet(landing, "0001.parquet", [
        event("c", 1, after={"id": 1, "blob": b"\x00kept", "n": 1}),
        event("c", 2, after={"id": 2, "blob": b"\x01kept", "n": 1})], image=image)
    cli.ingest(landing, "--envelope", "debezium", "--key", "id", "--missing", "keep")
    write_events_parquet(landing, "0002.parquet", [
        event("u", 3, after={"id": 1, "blob": PH.encode(), "n": 2}),
        event("u", 4, after={"id": 2, "blob": b"new", "n": 2})], image=image)
    cli.ingest(landing)
    rows = {r["id"]: r for r in cli.snapshot()}
    assert rows == {1: {"id": 1, "blob": "AGtlcHQ=", "n": 2},  # base64 of b"\x00kept"
                    2: {"id": 2, "blob": "bmV3", "n": 2}}

    connect = {"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": [
        {"field": "id", "type": "int64"}, {"field": "data", "type": "bytes", "optional": True}]}]}
    write_jsonl(landing, "0003.jsonl", [
        {"schema": connect, "payload": event("r", 5, after={"id": 7, "data": "AQI="})}])
    write_jsonl(landing, "0004.jsonl", [
        {"schema": connect, "payload": event("u", 6, after={
            "id": 7, "data": "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="})}])
    cli.ingest(landing)
    assert {r["id"]: r["data"] for r in cli.snapshot()}[7] == "AQI="
    assert cli.errors() == []


def test_another_placeholder_and_the_setting_is_fixed(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "0001.jsonl", [{"key": 1, "offset": 1, "v": "a", "w": "b"}])
    refused = cli.ingest(landing, "--unavailable", "?", rc=None)
    assert refused.rc != 0 and "--unavailable ? is refused with --missing null" in (
        refused.error_line())
    cli.ingest(landing, "--missing", "keep", "--unavailable", "?")
    write_jsonl(landing, "0002.jsonl", [{"key": 1, "offset": 2, "v": "?", "w": PH}])
    for option, wanted in ((["--missing", "null"], "--missing null (shard has keep)"),
                           (["--unavailable", "!"], "--unavailable ! (shard has ?)")):
        refused = cli.ingest(landing, *option, rc=None)
        assert refused.rc != 0
        line = refused.error_line()
        assert wanted in line and "shard 's'" in line, line
    assert cli.inspect()["upper"] == 1
    cli.ingest(landing, "--missing", "keep")  # the same setting: fine
    # "?" is this shard's placeholder; Debezium's is an ordinary string here
    assert cli.snapshot() == [{"key": 1, "offset": 2, "v": "a", "w": PH}]


def test_placeholder_in_a_key_or_order_column_is_an_error_row(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "0001.jsonl", [
        {"k": PH, "o": "x", "v": 1},
        {"k": "b", "o": PH, "v": 2},
        {"k": "c", "o": "y", "v": 3},
    ])
    cli.ingest(landing, "--key", "k", "--order", "o,v", "--missing", "keep")
    assert [e["row"] for e in cli.errors()] == [1, 2]
    assert all("unavailable-value placeholder" in e["reason"] for e in cli.errors())
    assert cli.snapshot() == [{"k": "c", "o": "y", "v": 3}]


def test_missing_null_is_unchanged(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "0001.jsonl", [{"key": 1, "offset": 1, "v": "a", "w": 2}])
    cli.ingest(landing)
    write_jsonl(landing, "0002.jsonl", [{"key": 1, "offset": 2, "v": PH}])
    cli.ingest(landing)
    assert cli.inspect()["missing"] == "null" and cli.inspect()["unavailable"] is None
    assert cli.snapshot() == [{"key": 1, "offset": 2, "v": PH, "w": None}]
