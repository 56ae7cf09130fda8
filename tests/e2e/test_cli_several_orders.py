"""``upsertctl ingest --order a,b`` (CONTRACT.md, "Change data capture": an order of
several columns) on the embedded defaults: plain Parquet, JSON Lines and CSV files
ordered by (binlog file, position), Debezium events ordered by
``source.file,source.pos,source.row`` in JSON Lines and Parquet; the order fixed for the
shard (``inspect`` shows it, a conflicting one is refused); and the bad inputs, each with
its clear error: a float or boolean order column, a null in any order column, a string
order column alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.debezium_events import write_events_jsonl, write_events_parquet
from tests.e2e.helpers import Cli, write_csv, write_jsonl, write_parquet

pytestmark = pytest.mark.parametrize("deployment", ["embedded"], indirect=True)


def _r(key: int, file: str | None, pos: int | None, v: str, **extra: Any) -> dict[str, Any]:
    return {"key": key, "file": file, "pos": pos, "v": v, **extra}


def _plain_files(landing: Path, fmt: str) -> None:
    """Two batches: file order decides before position; a tie goes to the later row."""
    first = [_r(1, "mysql-bin.000002", 4, "newer file"), _r(1, "mysql-bin.000001", 900, "older"),
             _r(2, "mysql-bin.000001", 7, "first"), _r(2, "mysql-bin.000001", 7, "tie: later"),
             _r(3, None, 7, "null file"), _r(4, "mysql-bin.000001", None, "null pos")]
    second = [_r(1, "mysql-bin.000001", 10**6, "late"),
              _r(2, "mysql-bin.000002", 1, "gone", __deleted=True),
              _r(5, "mysql-bin.000002", 2, "new")]
    for name, rows in (("0001", first), ("0002", second)):
        if fmt == "jsonl":
            write_jsonl(landing, f"{name}.jsonl", rows)
        elif fmt == "parquet":
            write_parquet(landing, f"{name}.parquet", pa.table({
                "key": [r["key"] for r in rows], "file": pa.array([r["file"] for r in rows],
                                                                   pa.string()),
                "pos": pa.array([r["pos"] for r in rows], pa.int64()),
                "v": [r["v"] for r in rows],
                "__deleted": pa.array([r.get("__deleted", False) for r in rows]),
            }))
        else:
            lines = ["key,file,pos,v,__deleted"] + [
                f"{r['key']},{r['file'] or ''},{'' if r['pos'] is None else r['pos']},{r['v']},"
                f"{str(r.get('__deleted', False)).lower()}" for r in rows]
            write_csv(landing, f"{name}.csv", "\n".join(lines) + "\n")


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "csv"])
@pytest.mark.parametrize("scope", ["batch", "global"])
def test_plain_files_ordered_by_two_columns(cli: Cli, landing: Path, fmt: str,
                                            scope: str) -> None:
    _plain_files(landing, fmt)
    cli.ingest(landing, "--order", "file,pos", "--order-scope", scope)
    assert cli.inspect()["order"] == ["file", "pos"]
    assert cli.inspect()["columns"]["file"] == "string"
    first = {r["key"]: r["v"] for r in cli.snapshot(as_of=0)}
    assert first == {1: "newer file", 2: "tie: later"}
    assert sorted((e["file"], e["row"]) for e in cli.errors()) == [
        (f"0001.{fmt}", 5), (f"0001.{fmt}", 6)]
    assert all("null order column" in e["reason"] for e in cli.errors())
    latest = {r["key"]: r["v"] for r in cli.snapshot()}
    if scope == "global":  # (bin.000001, 1000000) is not greater than (bin.000002, 4)
        assert latest == {1: "newer file", 5: "new"}
    else:  # a later batch always overrides
        assert latest == {1: "late", 5: "new"}
    assert cli.check().rc == 0


def test_global_scope_tombstone_keeps_a_tuple_order(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "0001.jsonl", [
        {"key": 1, "file": "b", "pos": 1, "__deleted": True}])  # a key never seen
    write_jsonl(landing, "0002.jsonl", [_r(1, "a", 99, "older than the delete")])
    write_jsonl(landing, "0003.jsonl", [_r(1, "b", 2, "newer")])
    cli.ingest(landing, "--order", "file,pos", "--order-scope", "global")
    assert cli.snapshot(as_of=1) == []
    assert [r["v"] for r in cli.snapshot()] == ["newer"]
    assert cli.check().rc == 0


def test_order_is_fixed_and_a_conflicting_one_refused(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "0001.jsonl", [_r(1, "a", 1, "x")])
    cli.ingest(landing, "--order", "file,pos")
    write_jsonl(landing, "0002.jsonl", [_r(1, "a", 2, "y")])
    for wanted in ("file", "pos,file", "file,pos,v"):
        refused = cli.ingest(landing, "--order", wanted, rc=None)
        assert refused.rc != 0
        assert f"--order {wanted} (shard has file,pos)" in refused.error_line()
    assert cli.inspect()["upper"] == 1
    cli.ingest(landing, "--order", "file, pos")  # the same order, spaces around names
    cli.ingest(landing)  # or none at all
    assert [r["v"] for r in cli.snapshot()] == ["y"]


def _no_shard(cli: Cli) -> None:
    assert "has not been initialised" in cli.run("inspect", "--shard", "s", rc=1).error_line()


@pytest.mark.parametrize("values, problem", [
    ([1.5, 2.5], "order column 'pos' has type float64"),
    ([True, False], "order column 'pos' has type bool"),
])
def test_a_float_or_boolean_order_column_stops_the_file(
    cli: Cli, landing: Path, values: list[Any], problem: str
) -> None:
    write_jsonl(landing, "0001.jsonl", [_r(k, "a", v, "x") for k, v in enumerate(values)])
    failed = cli.ingest(landing, "--order", "file,pos", rc=None)
    assert failed.rc != 0
    line = failed.error_line()
    assert "0001.jsonl" in line and problem in line
    assert "an integer, a timestamp or a string" in line
    _no_shard(cli)  # a first file refused whole creates nothing
    # Once the column is an integer, a file of floats is a changed type, as for any order.
    write_jsonl(landing, "0001.jsonl", [_r(1, "a", 1, "kept")])
    cli.ingest(landing, "--order", "file,pos")
    write_jsonl(landing, "0002.jsonl", [_r(k, "a", v, "x") for k, v in enumerate(values)])
    changed = cli.ingest(landing, rc=None)
    assert changed.rc != 0
    assert "0002.jsonl: column 'pos' changed type from int64" in changed.error_line()
    assert cli.inspect()["upper"] == 1  # the file before it stays committed


def test_a_float_order_column_in_parquet_is_refused_before_anything_is_applied(
    cli: Cli, landing: Path
) -> None:
    write_parquet(landing, "0001.parquet", pa.table({
        "key": [1], "file": ["a"], "pos": pa.array([1.0]), "v": ["x"]}))
    failed = cli.ingest(landing, "--order", "file,pos", rc=None)
    assert failed.rc != 0
    assert "0001.parquet: order column 'pos' has type float64" in failed.error_line()
    _no_shard(cli)  # a first file refused whole creates nothing


def test_a_string_order_column_alone_is_refused(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "0001.jsonl", [_r(1, "mysql-bin.000001", 1, "x")])
    failed = cli.ingest(landing, "--order", "file", rc=None)
    assert failed.rc != 0
    line = failed.error_line()
    assert "0001.jsonl: order column 'file' has type string" in line
    assert "a string only in an order of several columns" in line
    _no_shard(cli)  # a first file refused whole creates nothing


def test_a_boolean_in_an_integer_order_column_is_an_error_row(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "0001.jsonl", [_r(1, "a", 1, "x"), _r(2, "a", True, "y")])
    cli.ingest(landing, "--order", "file,pos")
    assert [r["key"] for r in cli.snapshot()] == [1]
    [error] = cli.errors()
    assert error["row"] == 2 and "column 'pos'" in error["reason"]


def test_bad_order_option_text_is_refused(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "0001.jsonl", [_r(1, "a", 1, "x")])
    for text, problem in (("file,", "give column names separated by commas"),
                          ("file,file", "a column is named twice"),
                          ("key,pos", "must be distinct")):
        refused = cli.ingest(landing, "--order", text, rc=None)
        assert refused.rc != 0 and problem in refused.error_line(), refused


# --- Debezium: MySQL's binlog coordinates ---------------------------------------------


def _mysql(op: str, file: str | None, pos: int, row: int, **images: Any) -> dict[str, Any]:
    source = {"file": file, "pos": pos, "row": row, "db": "shop"}
    return {"op": op, "source": source, "ts_ms": 1000 + pos, **images}


ORDER = "source.file,source.pos,source.row"


def _events() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    first = [
        _mysql("c", "mysql-bin.000003", 4, 0, after={"id": 1, "name": "ann"}),
        _mysql("u", "mysql-bin.000003", 4, 1, after={"id": 1, "name": "anne"}),  # same event
        _mysql("c", "mysql-bin.000003", 120, 0, after={"id": 2, "name": "bob"}),
        _mysql("c", None, 130, 0, after={"id": 3, "name": "no file"}),
    ]
    second = [
        _mysql("u", "mysql-bin.000002", 9999, 0, after={"id": 1, "name": "replayed"}),
        _mysql("d", "mysql-bin.000004", 4, 0, before={"id": 2, "name": "bob"}),
        _mysql("c", "mysql-bin.000004", 8, 0, after={"id": 4, "name": "dee"}),
    ]
    return first, second


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_debezium_binlog_coordinates_order_events(cli: Cli, landing: Path, fmt: str) -> None:
    first, second = _events()
    if fmt == "jsonl":
        write_events_jsonl(landing, "0001.jsonl", first)
        write_events_jsonl(landing, "0002.jsonl", second)
    else:
        image = pa.struct([("id", pa.int32()), ("name", pa.string())])
        source = pa.struct([("file", pa.string()), ("pos", pa.int64()), ("row", pa.int32()),
                            ("db", pa.string())])
        write_events_parquet(landing, "0001.parquet", first, image=image, source=source)
        write_events_parquet(landing, "0002.parquet", second, image=image, source=source)
    cli.ingest(landing, "--envelope", "debezium", "--key", "id", "--order", ORDER,
               "--order-scope", "global")
    summary = cli.inspect()
    assert summary["order"] == ["source.file", "source.pos", "source.row"]
    assert summary["envelope"] == "debezium"
    [error] = cli.errors()
    assert error["row"] == 4 and "null order column 'source.file'" in error["reason"]
    rows = sorted(cli.snapshot(), key=lambda r: r["id"])
    # id 1: (000003, 4, 1) beat (000003, 4, 0); the replay from 000002 is late
    assert [(r["id"], r["name"]) for r in rows] == [(1, "anne"), (4, "dee")]
    # the order fields are the envelope's, not columns of the shard (only after's are)
    assert all(set(r) == {"id", "name"} for r in rows)
    assert list(summary["columns"]) == ["id", "name"]
    assert cli.late()[0]["stored_order"] == ["mysql-bin.000003", 4, 1]  # still kept
    assert cli.check().rc == 0
