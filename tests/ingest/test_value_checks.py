"""Value checks through the ingest (in-process engine): failures land in the error
collection once, are not applied, and later files still go in."""

from __future__ import annotations

from pathlib import Path

import pytest

from upsert_core.errors import IngestError
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.landing import parse_value_checks

from .helpers import memory_shard, snapshot_rows, write_jsonl

CHECKS = parse_value_checks({
    "amount": {"min": 0, "max": 1000},
    "status": {"isin": ["new", "paid"]},
})


def test_value_check_failures_are_error_rows_and_not_applied(tmp_path: Path) -> None:
    shard = memory_shard()
    write_jsonl(tmp_path, "a.jsonl", [
        {"key": 1, "offset": 1, "amount": 10, "status": "new"},
        {"key": 2, "offset": 1, "amount": 5000, "status": "new"},   # range
        {"key": None, "offset": 1, "amount": -1},                   # contract error only
        {"key": 3, "offset": 1, "amount": 7, "status": "lost"},     # isin
    ])
    write_jsonl(tmp_path, "b.jsonl", [
        {"key": 1, "offset": 2, "amount": -3, "status": "paid"},    # update refused
        {"key": 4, "offset": 2, "amount": 1000, "status": "paid"},
    ])
    request = IngestRequest(value_checks=CHECKS)
    first = ingest(shard, str(tmp_path), request)
    again = ingest(shard, str(tmp_path), request)
    assert [f.name for f in first.files] == ["a.jsonl", "b.jsonl"] and again.files == []
    assert [f.errors for f in first.files] == [3, 1]
    errors = [(e["file"], e["row"], e["reason"]) for e in shard.errors()]
    assert errors == [
        ("a.jsonl", 2, "value check amount in_range(0, 1000) failed"),
        ("a.jsonl", 3, "null key column 'key'"),
        ("a.jsonl", 4, "value check status isin(['new', 'paid']) failed"),
        ("b.jsonl", 1, "value check amount in_range(0, 1000) failed"),
    ]
    live = snapshot_rows(shard, shard.state().upper - 1)
    assert sorted(dict(r)["key"] for r in live) == [1, 4]
    assert {dict(r)["key"]: dict(r)["amount"] for r in live} == {1: 10, 4: 1000}


def test_checks_are_per_request_and_not_stored(tmp_path: Path) -> None:
    shard = memory_shard()
    write_jsonl(tmp_path, "a.jsonl", [{"key": 1, "offset": 1, "amount": 5000}])
    ingest(shard, str(tmp_path), IngestRequest(value_checks=CHECKS[:1]))
    write_jsonl(tmp_path, "b.jsonl", [{"key": 2, "offset": 1, "amount": 5000}])
    ingest(shard, str(tmp_path), IngestRequest())  # no checks: 5000 goes in
    assert [e["file"] for e in shard.errors()] == ["a.jsonl"]
    assert not any("value" in k for k in shard.state().config)


def test_a_check_on_an_unknown_column_stops_at_the_file(tmp_path: Path) -> None:
    shard = memory_shard()
    write_jsonl(tmp_path, "a.jsonl", [{"key": 1, "offset": 1, "amount": 5}])
    request = IngestRequest(value_checks=parse_value_checks({"amont": {"max": 1}}))
    with pytest.raises(IngestError, match=r"^a\.jsonl: value check amont max\(1\): no column"):
        ingest(shard, str(tmp_path), request)
    assert shard.state().upper == 0
