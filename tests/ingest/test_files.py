"""File-level errors, row errors, idempotent re-runs and ingest options."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from upsert_core.errors import ConfigError, IngestError
from upsert_core.ingest import IngestRequest, ProgressEvent, ingest

from .helpers import leaked_blobs, memory_shard, snapshot_rows, write_jsonl, write_parquet


def _good(root: Path, name: str, key: int, offset: int) -> None:
    write_jsonl(root, name, [{"key": key, "offset": offset, "v": name}])


def _truncated_parquet(root: Path, name: str) -> None:
    path = write_parquet(root, name, pa.table({"key": [9], "offset": [1], "v": ["p"]}))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _missing_order(root: Path, name: str) -> None:
    write_jsonl(root, name, [{"key": 9, "v": "no order"}])


def _type_change(root: Path, name: str) -> None:
    write_jsonl(root, name, [{"key": "nine", "offset": 1, "v": "string key"}])


@pytest.mark.parametrize(
    ("breaker", "problem"),
    [
        (_truncated_parquet, "b.parquet"),
        (_missing_order, "missing order column 'offset'"),
        (_type_change, "changed type"),
    ],
)
def test_file_error_stops_at_the_file_and_a_rerun_continues(
    tmp_path: Path, breaker: object, problem: str
) -> None:
    shard = memory_shard()
    _good(tmp_path, "a.jsonl", 1, 1)
    bad = "b.parquet" if breaker is _truncated_parquet else "b.jsonl"
    breaker(tmp_path, bad)  # type: ignore[operator]
    _good(tmp_path, "c.jsonl", 2, 1)
    with pytest.raises(IngestError) as info:
        ingest(shard, str(tmp_path), IngestRequest())
    message = str(info.value)
    assert message.startswith(f"{bad}: ") and problem in message and "\n" not in message
    state = shard.state()
    assert state.upper == 1 and dict(state.ingested_files) == {"a.jsonl": 0}
    assert snapshot_rows(shard, 0) == snapshot_rows(shard, 0)  # still readable
    assert leaked_blobs(shard) == set()
    # Fix the file, re-run: it and the files after it are ingested, in order.
    (tmp_path / bad).unlink()
    if bad.endswith(".parquet"):
        write_parquet(tmp_path, bad, pa.table({"key": [3], "offset": [1], "v": ["p"]}))
    else:
        _good(tmp_path, bad, 3, 1)
    report = ingest(shard, str(tmp_path), IngestRequest())
    assert [f.name for f in report.files] == [bad, "c.jsonl"]
    assert dict(shard.state().ingested_files) == {"a.jsonl": 0, bad: 1, "c.jsonl": 2}
    assert sum(snapshot_rows(shard, 2).values()) == 3


def test_row_errors_are_recorded_exactly_once(tmp_path: Path) -> None:
    shard = memory_shard()
    write_jsonl(
        tmp_path,
        "a.jsonl",
        [
            {"key": 1, "offset": 1, "v": "ok"},
            {"key": None, "offset": 1},
            "{not json",
            {"key": 2, "offset": None},
            {"key": 3, "offset": 1, "__deleted": "maybe"},
            {"key": 4, "offset": 2, "v": "fine"},
        ],
    )
    first = ingest(shard, str(tmp_path), IngestRequest())
    again = ingest(shard, str(tmp_path), IngestRequest())
    assert first.errors == 4 and first.rows_read == 6 and again.files == []
    errors = list(shard.errors())
    assert [(e["file"], e["row"]) for e in errors] == [("a.jsonl", r) for r in (2, 3, 4, 5)]
    assert "null key" in str(errors[0]["reason"]) and "delete marker" in str(errors[3]["reason"])
    assert sum(snapshot_rows(shard, 0).values()) == 2


def test_nothing_pending_leaves_the_shard_untouched(tmp_path: Path) -> None:
    shard = memory_shard()
    empty_run = ingest(shard, str(tmp_path), IngestRequest())
    assert empty_run.upper == 0 and shard.state().upper == 0
    _good(tmp_path, "a.jsonl", 1, 1)
    (tmp_path / "b.jsonl").touch()  # an empty batch still takes a timestamp
    ingest(shard, str(tmp_path), IngestRequest())
    before = shard.state()
    assert before.upper == 2
    (tmp_path / "a.jsonl").touch()  # touching an ingested file changes nothing
    events: list[ProgressEvent] = []
    report = ingest(shard, str(tmp_path), IngestRequest(), progress=events.append)
    after = shard.state()
    assert (after.upper, after.seqno) == (before.upper, before.seqno)
    assert report.files == [] and report.upper == 2
    assert [e.kind for e in events] == ["start", "done"]


def test_late_file_with_an_earlier_name_is_simply_pending(tmp_path: Path) -> None:
    shard = memory_shard()
    _good(tmp_path, "b.jsonl", 1, 5)
    ingest(shard, str(tmp_path), IngestRequest())
    _good(tmp_path, "a.jsonl", 1, 1)  # late, earlier name, lower order
    report = ingest(shard, str(tmp_path), IngestRequest())
    assert [(f.name, f.ts) for f in report.files] == [("a.jsonl", 1)]
    # batch scope: a later batch overrides whatever its order
    assert snapshot_rows(shard, 1) == {(("key", 1), ("offset", 1), ("v", "a.jsonl")): 1}


def test_options_are_fixed_by_the_first_ingest(tmp_path: Path) -> None:
    shard = memory_shard()
    write_jsonl(tmp_path, "a.jsonl", [{"id": 1, "seq": 1, "del": False, "v": "x"}])
    ingest(shard, str(tmp_path), IngestRequest(key=("id",), order="seq", deleted_col="del",
                                               order_scope="global"))
    seqno = shard.state().seqno
    write_jsonl(tmp_path, "b.jsonl", [{"id": 1, "seq": 0, "v": "late"}])
    cases = [
        (IngestRequest(key=("key",)), "--key key (shard has id)"),
        (IngestRequest(order="offset"), "--order offset (shard has seq)"),
        (IngestRequest(deleted_col="__deleted"), "--deleted-col __deleted (shard has del)"),
        (IngestRequest(order_scope="batch"), "--order-scope batch (shard has global)"),
        (IngestRequest(buckets=7), "--buckets 7 (shard has 4)"),
    ]
    for request, expected in cases:
        with pytest.raises(ConfigError, match="conflicting ingest options") as info:
            ingest(shard, str(tmp_path), request)
        assert expected in str(info.value)
    assert shard.state().seqno == seqno  # nothing was written
    report = ingest(shard, str(tmp_path), IngestRequest(key=["id"]))  # same value: fine
    assert [f.name for f in report.files] == ["b.jsonl"]
    # global scope: the late row (seq 0 < 1) is ignored
    assert snapshot_rows(shard, 1) == {(("id", 1), ("seq", 1), ("v", "x")): 1}


def test_bad_option_values_are_config_errors(tmp_path: Path) -> None:
    shard = memory_shard()
    with pytest.raises(ConfigError, match="order-scope"):
        ingest(shard, str(tmp_path), IngestRequest(order_scope="sometimes"))
    with pytest.raises(ConfigError, match="bucket count"):
        ingest(shard, str(tmp_path), IngestRequest(buckets=0))


def test_through_stops_before_later_names_without_reading_them(tmp_path: Path) -> None:
    shard = memory_shard()
    _good(tmp_path, "a.jsonl", 1, 1)
    _good(tmp_path, "b.jsonl", 2, 1)
    _truncated_parquet(tmp_path, "c.parquet")  # after `through`: never read, no error
    events: list[ProgressEvent] = []
    report = ingest(shard, str(tmp_path), IngestRequest(), progress=events.append,
                    through="b.jsonl")
    assert [f.name for f in report.files] == ["a.jsonl", "b.jsonl"]
    assert shard.state().ingested_files == {"a.jsonl": 0, "b.jsonl": 1}
    assert events[0].kind == "start" and events[0].total == 2
    assert all(e.file != "c.parquet" for e in events)
    # A late file sorting before `through` is pending and applied; c still waits.
    _good(tmp_path, "0.jsonl", 3, 1)
    again = ingest(shard, str(tmp_path), IngestRequest(), through="b.jsonl")
    assert [f.name for f in again.files] == ["0.jsonl"] and again.upper == 3
    with pytest.raises(IngestError, match="c.parquet"):
        ingest(shard, str(tmp_path), IngestRequest())
    assert shard.state().upper == 3
