"""A Debezium shard's columns are ``after``'s (CONTRACT.md, "Change data capture"), on
the embedded defaults: ``snapshot`` (JSON Lines, CSV, Parquet; latest, ``--as-of``,
``--as-of-time``), ``changes`` and ``inspect``'s ``columns`` show no order field, and an
update whose ``after`` equals the previous one with a new LSN is no change; the order
stays listed as ``order``, in the late collection, and in what ``check`` verifies. The
Python read API (``open_shard``) shows the same columns."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.e2e.helpers import Cli, write_jsonl

pytestmark = pytest.mark.parametrize("deployment", ["embedded"], indirect=True)

AFTER = {"id": "int64", "name": "string"}
FUTURE = "2999-01-01T00:00:00"


def _e(op: str, lsn: int, **images: Any) -> dict[str, Any]:
    return {"op": op, "ts_ms": 1000 + lsn, "source": {"lsn": lsn, "db": "shop"}, **images}


def _land(cli: Cli, landing: Path) -> Any:
    """ts 0: two keys; ts 1: id 1 re-sent with the same ``after`` and a new LSN, id 2
    renamed, and a replay of id 2 (late); ts 2: id 1 re-sent once more, alone."""
    write_jsonl(landing, "0001.jsonl", [_e("r", 10, after={"id": 1, "name": "ann"}),
                                        _e("r", 11, after={"id": 2, "name": "bob"})])
    write_jsonl(landing, "0002.jsonl", [_e("u", 12, after={"id": 1, "name": "ann"}),
                                        _e("u", 13, after={"id": 2, "name": "bobby"}),
                                        _e("u", 9, after={"id": 2, "name": "old"})])
    write_jsonl(landing, "0003.jsonl", [_e("u", 14, after={"id": 1, "name": "ann"})])
    return cli.ingest(landing, "--envelope", "debezium", "--key", "id", "--order-scope",
                      "global")


def _sorted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Snapshot rows by id; changes by ts, id and diff."""
    return sorted(rows, key=lambda r: (r.get("ts", 0), r.get("row", r)["id"], r.get("diff", 0)))


def test_snapshots_show_the_columns_of_after(cli: Cli, landing: Path) -> None:
    _land(cli, landing)
    latest = [{"id": 1, "name": "ann"}, {"id": 2, "name": "bobby"}]
    assert _sorted(cli.snapshot()) == latest
    assert _sorted(cli.snapshot(as_of=0)) == [{"id": 1, "name": "ann"},
                                              {"id": 2, "name": "bob"}]
    timed = cli.run("snapshot", "--shard", "s", "--as-of-time", FUTURE).jsonl()
    assert _sorted(timed) == latest

    csv = cli.run("snapshot", "--shard", "s", "--format", "csv", "--as-of", "1").out
    assert csv.splitlines()[0] == "id,name"
    assert sorted(csv.splitlines()[1:]) == ["1,ann", "2,bobby"]

    for extra in ([], ["--as-of", "0"]):
        raw = cli.run("snapshot", "--shard", "s", "--format", "parquet", *extra).out_bytes
        table = pq.read_table(io.BytesIO(raw))
        assert table.column_names == ["id", "name"] and table.num_rows == 2


def test_changes_hide_the_order_and_an_lsn_alone_is_no_change(cli: Cli, landing: Path) -> None:
    result = _land(cli, landing)
    # the run's counts are those of the changes below: an LSN alone is no insert and no
    # retraction (ts 1: bob -> bobby; ts 2: nothing)
    assert "0002.jsonl: ts 1, 3 row(s) read, 1 insert(s), 1 retraction(s)" in result.err
    assert "0003.jsonl: ts 2, 1 row(s) read, 0 insert(s), 0 retraction(s)" in result.err
    assert _sorted(cli.changes()) == [
        {"row": {"id": 1, "name": "ann"}, "ts": 0, "diff": 1},
        {"row": {"id": 2, "name": "bob"}, "ts": 0, "diff": 1},
        {"row": {"id": 2, "name": "bob"}, "ts": 1, "diff": -1},
        {"row": {"id": 2, "name": "bobby"}, "ts": 1, "diff": 1},
    ]
    assert cli.changes(since=2) == []  # id 1 re-sent alone: its stored LSN changed, no more
    assert _sorted(cli.changes(since=1, until=2)) == [
        {"row": {"id": 2, "name": "bob"}, "ts": 1, "diff": -1},
        {"row": {"id": 2, "name": "bobby"}, "ts": 1, "diff": 1},
    ]
    # The rows still hold the order (the global scope reads it back): the late replay
    # was judged against it, and check verifies the state against it.
    [late] = cli.late()
    assert (late["key"], late["order"], late["stored_order"]) == ({"id": 2}, 9, 11)
    assert cli.check().rc == 0


def test_inspect_lists_after_columns_and_the_order_under_its_own_key(
    cli: Cli, landing: Path
) -> None:
    _land(cli, landing)
    summary = cli.inspect()
    assert summary["columns"] == AFTER
    assert (summary["order"], summary["envelope"]) == ("source.lsn", "debezium")
    assert summary["live_rows"] == 2


def test_the_python_read_api_shows_the_same_columns(cli: Cli, landing: Path) -> None:
    from upsert_core import open_shard

    _land(cli, landing)
    table = open_shard("s", *cli.stores)
    assert table.schema.names == ["id", "name"]
    assert table.inspect()["columns"] == AFTER
    for snapshot in (table.snapshot(), table.snapshot(as_of=0), table.snapshot(as_of_time=FUTURE),
                     table.to_batches().read_all()):
        assert snapshot.column_names == ["id", "name"] and snapshot.num_rows == 2
    assert list(table.snapshot().to_pandas().columns) == ["id", "name"]
    changes = table.changes()
    assert changes.column_names == ["id", "name", "__ts", "__diff"]
    assert sorted(zip(changes.column("__ts").to_pylist(), changes.column("name").to_pylist(),
                      changes.column("__diff").to_pylist(), strict=True)) == [
        (0, "ann", 1), (0, "bob", 1), (1, "bob", -1), (1, "bobby", 1)]
    assert table.changes(since=2).num_rows == 0
    # ... though the stored rows changed there: id 1's retraction and insertion (LSN 12
    # -> 14), which differ only in the hidden order, cancel once projected
    assert sum(b.num_rows for b in table.shard.changes(2, 3)) == 2
    assert table.late().column("order").to_pylist() == [9]


def test_a_column_of_after_named_like_the_order_is_the_tables_own(
    cli: Cli, landing: Path
) -> None:
    """``--order ts_ms`` (the envelope's top-level field) on a table with its own
    ``ts_ms`` column: the shard stores the envelope's order under a reserved name, so
    the table's column is ingested and read like any other (no error rows), the order
    still decides (a replay with an older envelope ``ts_ms`` is late, whatever the
    table's column says), and reads show the table's ``ts_ms``, never the envelope's."""
    def e(op: str, ts_ms: int, **images: Any) -> dict[str, Any]:
        return {"op": op, "ts_ms": ts_ms, "source": {"lsn": ts_ms, "db": "shop"}, **images}

    write_jsonl(landing, "0001.jsonl", [e("r", 100, after={"id": 1, "ts_ms": 7}),
                                        e("r", 101, after={"id": 2, "ts_ms": 8})])
    write_jsonl(landing, "0002.jsonl", [e("u", 102, after={"id": 1, "ts_ms": 9}),
                                        e("u", 99, after={"id": 2, "ts_ms": 1000})])  # late
    result = cli.ingest(landing, "--envelope", "debezium", "--key", "id", "--order", "ts_ms",
                        "--order-scope", "global")
    assert "4 row(s) read, 3 insert(s), 1 retraction(s), 0 error row(s)" in result.err
    assert cli.errors() == []
    assert _sorted(cli.snapshot()) == [{"id": 1, "ts_ms": 9}, {"id": 2, "ts_ms": 8}]
    assert _sorted(cli.changes(since=1)) == [{"row": {"id": 1, "ts_ms": 7}, "ts": 1, "diff": -1},
                                             {"row": {"id": 1, "ts_ms": 9}, "ts": 1, "diff": 1}]
    [late] = cli.late()
    assert (late["key"], late["order"], late["stored_order"]) == ({"id": 2}, 99, 101)
    summary = cli.inspect()
    assert summary["columns"] == {"id": "int64", "ts_ms": "int64"} and summary["order"] == "ts_ms"
    assert cli.check().rc == 0
    # the order is fixed as given; a later run may repeat it
    write_jsonl(landing, "0003.jsonl", [e("d", 103, before={"id": 1, "ts_ms": 9})])
    cli.ingest(landing, "--order", "ts_ms")
    assert cli.snapshot() == [{"id": 2, "ts_ms": 8}]
