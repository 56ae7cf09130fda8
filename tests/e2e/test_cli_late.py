"""``upsertctl late`` (CONTRACT.md, "Change data capture", late rows): with
``--order-scope global`` a row whose order is not past its key's stored order is kept
in the late collection with its file, row number, key, order and stored order, and
changes nothing. On the embedded defaults and on the cluster (PostgreSQL consensus, S3
blobs and landing, the Spark engine); Debezium and GC retention on the embedded
defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.helpers import Cli, write_jsonl


def test_late_rows_are_kept_printed_and_change_nothing(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "0001.jsonl", [
        {"key": 1, "offset": 10, "v": "a"},
        {"key": 2, "offset": 10, "v": "b"},
        {"key": 3, "offset": 10, "__deleted": True},  # a tombstone with order 10
    ])
    first = cli.ingest(landing, "--order-scope", "global")
    assert "late" not in first.err  # nothing stored before the first batch
    assert cli.late() == []
    write_jsonl(landing, "0002.jsonl", [
        {"key": 1, "offset": 9, "v": "too old"},       # late: 9 <= 10
        {"key": 2, "offset": 12, "v": "newer"},        # applied
        {"key": 2, "offset": 11, "v": "lost in batch"},  # loses in its batch: not late
        {"key": 3, "offset": 10, "v": "tie with delete"},  # late: equal to the tombstone's
        {"key": None, "offset": 1},                    # an error row, never late
        {"key": 4, "offset": 1, "v": "new key"},       # never seen: never late
        {"key": 1, "offset": 10, "__deleted": True},   # a late delete
    ])
    second = cli.ingest(landing, "--json")
    assert "3 late row(s)" in second.err
    assert second.json()["late_rows"] == 3
    assert [f["late_rows"] for f in second.json()["files"]] == [3]
    assert cli.late() == [
        {"file": "0002.jsonl", "row": 1, "key": {"key": 1}, "order": 9, "stored_order": 10},
        {"file": "0002.jsonl", "row": 4, "key": {"key": 3}, "order": 10, "stored_order": 10},
        {"file": "0002.jsonl", "row": 7, "key": {"key": 1}, "order": 10, "stored_order": 10},
    ]
    assert [(e["file"], e["row"]) for e in cli.errors()] == [("0002.jsonl", 5)]
    rows = {r["key"]: r["v"] for r in cli.snapshot()}
    assert rows == {1: "a", 2: "newer", 4: "new key"}

    # A late row does not change the stored order: 9 < 10 stays late, 11 applies.
    write_jsonl(landing, "0003.jsonl", [{"key": 1, "offset": 9, "v": "again"},
                                        {"key": 1, "offset": 11, "v": "now"}])
    cli.ingest(landing)
    cli.ingest(landing)  # nothing pending: nothing recorded twice
    assert cli.late()[3:] == [
        {"file": "0003.jsonl", "row": 1, "key": {"key": 1}, "order": 9, "stored_order": 10}]
    assert len(cli.late()) == 4
    assert cli.check().rc == 0


def test_an_order_of_several_columns_prints_lists(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "0001.jsonl", [
        {"id": "a", "file": "bin.2", "at": "2026-01-01T00:00:05Z", "v": 1}])
    cli.ingest(landing, "--key", "id", "--order", "file,at", "--order-scope", "global")
    write_jsonl(landing, "0002.jsonl", [
        {"id": "a", "file": "bin.10", "at": "2026-01-01T00:00:09Z", "v": 2},  # "bin.10" < "bin.2"
        {"id": "a", "file": "bin.2", "at": "2026-01-01T00:00:06Z", "v": 3}])
    cli.ingest(landing)
    assert cli.late() == [{
        "file": "0002.jsonl", "row": 1, "key": {"id": "a"},
        "order": ["bin.10", "2026-01-01T00:00:09+00:00"],
        "stored_order": ["bin.2", "2026-01-01T00:00:05+00:00"],
    }]
    assert [r["v"] for r in cli.snapshot()] == [3]


@pytest.mark.parametrize("deployment", ["embedded"], indirect=True)
def test_a_batch_scope_shard_has_no_late_rows(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "0001.jsonl", [{"key": 1, "offset": 10, "v": "a"}])
    write_jsonl(landing, "0002.jsonl", [{"key": 1, "offset": 1, "v": "b"}])
    cli.ingest(landing)
    assert cli.late() == []
    assert cli.snapshot()[0]["v"] == "b"
    refused = cli.run("late", "--shard", "nope", rc=None)
    assert refused.rc != 0 and "nope" in refused.error_line()


@pytest.mark.parametrize("deployment", ["embedded"], indirect=True)
def test_a_late_debezium_delete_takes_its_key_from_before(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "0001.jsonl", [
        {"op": "c", "source": {"lsn": 20}, "after": {"id": 7, "name": "x"}}])
    cli.ingest(landing, "--envelope", "debezium", "--key", "id", "--order-scope", "global")
    write_jsonl(landing, "0002.jsonl", [
        {"op": "d", "source": {"lsn": 15}, "before": {"id": 7, "name": "x"}, "after": None},
        {"op": "u", "source": {"lsn": 20}, "before": {"id": 7}, "after": {"id": 7, "name": "y"}},
    ])
    cli.ingest(landing)
    assert cli.late() == [
        {"file": "0002.jsonl", "row": 1, "key": {"id": 7}, "order": 15, "stored_order": 20},
        {"file": "0002.jsonl", "row": 2, "key": {"id": 7}, "order": 20, "stored_order": 20},
    ]
    assert [r["name"] for r in cli.snapshot()] == ["x"]


@pytest.mark.parametrize("deployment", ["embedded"], indirect=True)
def test_late_rows_at_or_after_since_stay_readable_after_gc(cli: Cli, landing: Path) -> None:
    for i in range(5):  # each file after the first: one late row (offset 0)
        write_jsonl(landing, f"{i:04d}.jsonl", [{"key": 1, "offset": 10 + i, "v": f"v{i}"},
                                                {"key": 2, "offset": 0, "v": f"late{i}"}])
    cli.ingest(landing, "--order-scope", "global")
    assert [r["file"] for r in cli.late()] == [f"{i:04d}.jsonl" for i in range(1, 5)]
    cli.run("gc", "--shard", "s", "--retain", "2")
    since = cli.inspect()["since"]
    assert since == 3
    assert [r["file"] for r in cli.late()] == ["0003.jsonl", "0004.jsonl"]
    assert cli.check().rc == 0
