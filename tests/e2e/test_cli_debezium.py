"""``upsertctl ingest --envelope debezium`` on the embedded defaults: Kafka Connect S3
sink output (JSON Lines, with and without the schema/payload wrapper) -> a snapshot of
the ``after`` rows; skipped t/m events on stderr and in ``--json``; error rows with their
line numbers; the envelope fixed for the shard; ``--deleted-col`` refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import Cli, write_jsonl

pytestmark = pytest.mark.parametrize("deployment", ["embedded"], indirect=True)

SCHEMA = {"type": "struct", "fields": [
    {"field": "after", "type": "struct", "optional": True, "fields": [
        {"field": "id", "type": "int32"},
        {"field": "name", "type": "string", "optional": True},
        {"field": "updated", "type": "int64", "name": "io.debezium.time.MicroTimestamp"},
    ]},
]}


def _e(op: str, lsn: int, **images: Any) -> dict[str, Any]:
    return {"op": op, "ts_ms": 1000 + lsn, "source": {"lsn": lsn, "db": "shop"}, **images}


def test_debezium_landing_to_snapshot(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "0001.jsonl", [
        {"schema": SCHEMA, "payload": _e("r", 10, after={"id": 1, "name": "ann", "updated": 0})},
        {"schema": SCHEMA, "payload": _e("r", 11, after={"id": 2, "name": "bob", "updated": 0})},
        _e("t", 12),
        "null",
        [1, 2],
    ])
    first = cli.ingest(landing, "--envelope", "debezium", "--key", "id", "--json")
    assert "1 Debezium event(s) skipped (op t/m)" in first.err
    assert "1 error row(s)" in first.err
    assert first.json()["skipped"] == 1
    assert cli.errors() == [
        {"file": "0001.jsonl", "row": 5, "reason": "Debezium event is not an object (got list)"}]

    write_jsonl(landing, "0002.jsonl", [
        _e("u", 13, before={"id": 1}, after={"id": 1, "name": "anne", "__deleted": True}),
        _e("d", 14, before={"id": 2, "name": "bob"}, after=None),
        {"op": "x", "after": {"id": 3}},
    ])
    second = cli.ingest(landing)  # later runs may omit the options
    assert "skipped" not in second.err
    rows = cli.snapshot()
    assert rows == [{"id": 1, "name": "anne", "updated": None, "__deleted": True}]
    assert cli.errors()[-1] == {"file": "0002.jsonl", "row": 3,
                                "reason": "Debezium event has an unknown op 'x'"}
    first_rows = cli.snapshot(as_of=0)
    assert sorted(r["id"] for r in first_rows) == [1, 2]
    # MicroTimestamp (the wrapper's schema) made a timestamp column, not an integer one
    assert all(r["updated"].startswith("1970-01-01T00:00:00") for r in first_rows)
    assert cli.check().rc == 0


def test_envelope_is_fixed_and_deleted_col_refused(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "0001.jsonl", [_e("c", 1, after={"id": 1})])
    refused = cli.ingest(landing, "--envelope", "debezium", "--deleted-col", "gone", rc=None)
    assert refused.rc != 0
    assert "--deleted-col gone is refused with --envelope debezium" in refused.error_line()
    cli.ingest(landing, "--envelope", "debezium", "--key", "id")
    write_jsonl(landing, "0002.jsonl", [{"id": 2, "source.lsn": 2}])
    conflict = cli.ingest(landing, "--envelope", "plain", rc=None)
    assert conflict.rc != 0
    assert "--envelope plain (shard has debezium)" in conflict.error_line()


def test_debezium_parquet_landing_to_snapshot(cli: Cli, landing: Path) -> None:
    """Parquet as the sink's ParquetFormat writes it: envelope columns, the Avro schema in
    the footer naming Debezium's logical types; JSON Lines files may sit beside it."""
    import pyarrow as pa

    from tests.debezium_events import avro_envelope, write_events_parquet

    image = pa.struct([("id", pa.int32()), ("name", pa.string()), ("updated", pa.int64())])
    avro = avro_envelope([
        {"name": "id", "type": "int"},
        {"name": "name", "type": ["null", "string"]},
        {"name": "updated", "type": ["null", {"type": "long", "connect.version": 1,
                                              "connect.name": "io.debezium.time.MicroTimestamp"}]},
    ])
    write_events_parquet(landing, "0001.parquet", [
        _e("r", 10, after={"id": 1, "name": "ann", "updated": 1_000_000}),
        _e("r", 11, after={"id": 2, "name": "bob", "updated": 0}),
        _e("t", 12),
        {"op": "x", "after": {"id": 3, "name": None, "updated": None}, "source": {"lsn": 13}},
    ], image=image, avro_schema=avro)
    first = cli.ingest(landing, "--envelope", "debezium", "--key", "id", "--json")
    assert "1 Debezium event(s) skipped (op t/m)" in first.err
    assert first.json()["skipped"] == 1
    assert cli.errors() == [
        {"file": "0001.parquet", "row": 4, "reason": "Debezium event has an unknown op 'x'"}]
    rows = {r["id"]: r for r in cli.snapshot()}
    assert rows[1]["updated"].startswith("1970-01-01T00:00:01")  # MicroTimestamp: a timestamp
    assert set(rows[1]) == {"id", "name", "updated"}  # after's columns, no source.lsn

    write_events_parquet(landing, "0002.parquet", [
        _e("u", 14, before={"id": 1, "name": "ann", "updated": 1_000_000},
           after={"id": 1, "name": "anne", "updated": 2_000_000}),
        _e("d", 15, before={"id": 2, "name": "bob", "updated": 0}),
    ], image=image, avro_schema=avro)
    write_jsonl(landing, "0003.jsonl", [_e("c", 16, after={"id": 4, "name": "dee"})])
    cli.ingest(landing)
    assert sorted((r["id"], r["name"]) for r in cli.snapshot()) == [(1, "anne"), (4, "dee")]
    assert cli.check().rc == 0


def test_a_debezium_parquet_file_with_a_wrong_layout_names_file_and_column(
    cli: Cli, landing: Path
) -> None:
    import pyarrow as pa

    from tests.e2e.helpers import write_parquet

    write_jsonl(landing, "0001.jsonl", [_e("c", 1, after={"id": 1})])
    write_parquet(landing, "0002.parquet", pa.table({
        "op": ["c"], "after": ['{"id": 2}'], "source": pa.array([{"lsn": 2}])}))
    failed = cli.ingest(landing, "--envelope", "debezium", "--key", "id", rc=None)
    assert failed.rc != 0
    assert "0002.parquet: column 'after' has type string" in failed.error_line()
    assert cli.inspect()["upper"] == 1  # the file before it stays committed
