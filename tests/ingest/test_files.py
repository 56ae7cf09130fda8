"""File-level errors, row errors, idempotent re-runs and ingest options."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from upsert_core.errors import ConfigError, IngestError
from upsert_core.ingest import FileOutcome, FileTask, IngestRequest, ProgressEvent, ingest
from upsert_core.ingest.engine import InProcessEngine
from upsert_core.ingest.shard_api import IngestShard
from upsert_core.persist.testing import unreferenced_blobs

from .helpers import memory_shard, snapshot_rows, write_jsonl, write_parquet


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
    assert unreferenced_blobs(shard) == set()
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


# --- landing hygiene: hidden files, bad names, files still being written -------------


def test_hidden_files_are_never_ingested(tmp_path: Path) -> None:
    shard = memory_shard()
    _good(tmp_path, "a.jsonl", 1, 1)
    _good(tmp_path, ".hidden.jsonl", 2, 1)
    (tmp_path / "_temporary" / "0").mkdir(parents=True)
    _good(tmp_path, "_temporary/0/part-0.jsonl", 3, 1)  # an aborted Spark task attempt
    (tmp_path / "out").mkdir()
    _good(tmp_path, "out/_SUCCESS.jsonl", 4, 1)
    ingest(shard, str(tmp_path), IngestRequest())
    assert dict(shard.state().ingested_files) == {"a.jsonl": 0}


def test_a_bad_name_stops_the_run_at_that_file_only(tmp_path: Path) -> None:
    shard = memory_shard()
    _good(tmp_path, "a.jsonl", 1, 1)
    _good(tmp_path, "b\x01.jsonl", 2, 1)
    _good(tmp_path, "c.jsonl", 3, 1)
    with pytest.raises(IngestError) as info:
        ingest(shard, str(tmp_path), IngestRequest())
    message = str(info.value)
    assert message.startswith("'b\\x01.jsonl': ") and "control character" in message
    assert "\n" not in message
    assert dict(shard.state().ingested_files) == {"a.jsonl": 0}  # the file before it went in
    (tmp_path / "b\x01.jsonl").rename(tmp_path / "b.jsonl")
    ingest(shard, str(tmp_path), IngestRequest())
    assert list(shard.state().ingested_files) == ["a.jsonl", "b.jsonl", "c.jsonl"]


class _WriterStillWriting:
    """The in-process engine, with a writer appending to ``name`` after the listing and
    before the engine reads it (once)."""

    def __init__(self, root: Path, name: str) -> None:
        self.path = root / name
        self.inner = InProcessEngine()
        self.done = False

    def run_file(self, task: FileTask, shard: IngestShard) -> FileOutcome:
        if task.file.name == self.path.name and not self.done:
            self.done = True
            with self.path.open("ab") as fh:
                fh.write(b'{"key": 7, "offset": 1, "v": "late"}\n')
        return self.inner.run_file(task, shard)


def test_a_file_still_being_written_waits_with_the_files_after_it(tmp_path: Path) -> None:
    shard = memory_shard()
    for name, key in [("a.jsonl", 1), ("b.jsonl", 2), ("c.jsonl", 3)]:
        _good(tmp_path, name, key, 1)
    engine = _WriterStillWriting(tmp_path, "b.jsonl")

    report = ingest(shard, str(tmp_path), IngestRequest(), engine=engine)

    assert [f.name for f in report.files] == ["a.jsonl"] and report.upper == 1
    assert report.pending == ["b.jsonl", "c.jsonl"]
    [warning] = report.warnings
    assert warning.startswith("b.jsonl: changed while being ingested")
    assert "left pending for the next run, with the 1 file(s) after it" in warning
    assert dict(shard.state().ingested_files) == {"a.jsonl": 0}
    assert unreferenced_blobs(shard) == set()
    # The next run reads the whole file, as it is then.
    report = ingest(shard, str(tmp_path), IngestRequest(), engine=engine)
    assert [f.name for f in report.files] == ["b.jsonl", "c.jsonl"] and not report.warnings
    assert {dict(r)["key"] for r in snapshot_rows(shard, 2)} == {1, 2, 3, 7}
