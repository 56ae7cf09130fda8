"""CONTRACT.md "Bad input" and "Source batches", as a user of ``upsertctl`` sees them.

Values the shard cannot hold exactly (a string that is not UTF-8, a timestamp beyond
the microsecond range) are error rows, and every read of the shard keeps working;
hidden files are never ingested; a file still being written waits for the next run;
one bad file name stops the run at that file only; strict JSON.

Embedded deployment only (fast, in-process engine): the mechanisms live in the
landing and ingest layers every deployment shares.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from tests.e2e.helpers import Cli, write_jsonl, write_parquet

pytestmark = pytest.mark.parametrize("deployment", ["embedded"], indirect=True)


def _not_utf8_strings(values: list[bytes]) -> pa.Array:
    """A Parquet string column holding exactly these bytes (Arrow does not check)."""
    binary = pa.array(values, pa.binary())
    return pa.Array.from_buffers(pa.string(), len(values), binary.buffers())


def _every_read_works(cli: Cli) -> list[dict[str, object]]:
    """snapshot in every format, changes and check all succeed; the JSONL snapshot."""
    rows = cli.snapshot()
    for fmt in ("csv", "parquet"):
        cli.run("snapshot", "--shard", "s", "--format", fmt)
    cli.changes()
    cli.check()
    return rows


def test_a_string_that_is_not_utf8_is_an_error_row_and_the_shard_stays_readable(
    cli: Cli, landing: Path
) -> None:
    v = _not_utf8_strings([b"ok", b"\xff\xfe", b"fine"])
    key = _not_utf8_strings([b"a", b"b", b"\xc3"])
    write_parquet(landing, "1.parquet", pa.table({"key": key, "offset": [1, 2, 3], "v": v}))
    (landing / "2.csv").write_bytes(b"key,offset,v\nc,4,\xfe\nd,5,yes\n")

    r = cli.ingest(landing)
    assert "3 error row(s)" in r.err

    assert cli.errors() == [
        {"file": "1.parquet", "row": 2,
         "reason": "column 'v': not valid UTF-8: b'\\xff\\xfe'"},
        {"file": "1.parquet", "row": 3,
         "reason": "column 'key': not valid UTF-8: b'\\xc3'"},
        {"file": "2.csv", "row": 1, "reason": "column 'v': not valid UTF-8: b'\\xfe'"},
    ]
    assert sorted(_every_read_works(cli), key=lambda r: str(r["key"])) == [
        {"key": "a", "offset": 1, "v": "ok"},
        {"key": "d", "offset": 5, "v": "yes"},
    ]
    assert cli.check().json()["error_rows"] == 3


def test_a_valid_forever_timestamp_is_an_error_row_not_1969(cli: Cli, landing: Path) -> None:
    until = pa.array([2**63 - 1, 1_700_000_000_000], pa.timestamp("ms"))
    nanos = pa.array([1, 1_000], pa.timestamp("ns"))
    write_parquet(
        landing, "1.parquet",
        pa.table({"key": [1, 2], "offset": [1, 2], "until": until, "at": nanos}),
    )
    cli.ingest(landing)

    [error] = cli.errors()
    assert error["file"] == "1.parquet" and error["row"] == 1
    assert "'until'" in error["reason"] and "'at'" in error["reason"]
    assert _every_read_works(cli) == [
        {"key": 2, "offset": 2, "until": "2023-11-14T22:13:20+00:00",
         "at": "1970-01-01T00:00:00.000001+00:00"}
    ]


def test_hidden_files_are_never_ingested(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "a.jsonl", [{"key": 1, "offset": 1}])
    write_jsonl(landing, ".hidden.jsonl", [{"key": 2, "offset": 1}])
    write_jsonl(landing, "_temporary/0/part-0.jsonl", [{"key": 3, "offset": 1}])
    write_jsonl(landing, "out/_SUCCESS.jsonl", [{"key": 4, "offset": 1}])
    cli.ingest(landing)
    assert cli.snapshot() == [{"key": 1, "offset": 1}]
    assert cli.inspect()["upper"] == 1  # one file, one timestamp


def test_one_bad_name_stops_the_run_at_that_file(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "a.jsonl", [{"key": 1, "offset": 1}])
    write_jsonl(landing, "b\n.jsonl", [{"key": 2, "offset": 1}])
    write_jsonl(landing, "c.jsonl", [{"key": 3, "offset": 1}])
    r = cli.ingest(landing, rc=1)
    line = r.error_line()
    assert "'b\\n.jsonl'" in line and "control character" in line
    assert cli.snapshot() == [{"key": 1, "offset": 1}]  # the file before it went in
    (landing / "b\n.jsonl").unlink()
    cli.ingest(landing)
    assert sorted(r["key"] for r in cli.snapshot()) == [1, 3]


# Grows a landing file right after the ingest lists the landing: a writer not done yet.
_GROW_HOOK = '''
import os
import upsert_core.ingest.pipeline as pipeline

_list = pipeline.list_landing


def _list_then_grow(url, **kwargs):
    files = _list(url, **kwargs)
    with open(os.environ["E2E_GROW_FILE"], "ab") as fh:
        fh.write(b'{"key": 9, "offset": 1}\\n')
    return files


pipeline.list_landing = _list_then_grow
'''


def test_a_file_still_being_written_is_left_pending_with_a_warning(
    cli: Cli, landing: Path, tmp_path: Path
) -> None:
    write_jsonl(landing, "a.jsonl", [{"key": 1, "offset": 1}])
    growing = write_jsonl(landing, "b.jsonl", [{"key": 2, "offset": 1}])
    write_jsonl(landing, "c.jsonl", [{"key": 3, "offset": 1}])
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_GROW_HOOK)
    writing = cli.derive(env={"PYTHONPATH": f"{hook}:{cli.env['PYTHONPATH']}",
                              "E2E_GROW_FILE": str(growing)})
    # Only a.jsonl is committed, b.jsonl (listed, then grown) and c.jsonl wait.
    r = writing.ingest(landing)
    [warning] = [line for line in r.err_lines if line.startswith("warning:")]
    assert "b.jsonl: changed while being ingested" in warning and "next run" in warning
    assert cli.snapshot() == [{"key": 1, "offset": 1}]
    cli.ingest(landing)
    assert sorted(r["key"] for r in cli.snapshot()) == [1, 2, 3, 9]
    assert cli.errors() == []


def test_json_lines_are_strict(cli: Cli, landing: Path) -> None:
    (landing / "a.jsonl").write_bytes(
        b'{"key": 1, "offset": 1, "v": 1.5}\n'
        b'{"key": 2, "offset": 1, "v": NaN}\n'
        b'{"key": 3, "offset": 1, "v": -Infinity}\n'
        b'{"key": 4, "key": 5, "offset": 1}\n'
    )
    r = cli.ingest(landing)
    assert "3 error row(s)" in r.err
    assert [(e["row"], e["reason"]) for e in cli.errors()] == [
        (2, "malformed JSON line: NaN is not a JSON value"),
        (3, "malformed JSON line: -Infinity is not a JSON value"),
        (4, "malformed JSON line: duplicate key 'key'"),
    ]
    assert cli.snapshot() == [{"key": 1, "offset": 1, "v": 1.5}]


def test_bytes_that_are_not_utf8_in_json_or_csv_are_error_rows_and_reads_keep_working(
    cli: Cli, landing: Path
) -> None:
    # CONTRACT.md, bad input: a string that is not valid UTF-8 and a value the column
    # cannot represent are row errors; the good rows are committed and exit 0. Before:
    # CESU-8 surrogate bytes in a JSON name entered the schema and broke every later
    # snapshot; a CSV year-0000 timestamp crashed the ingest ("unexpected OverflowError").
    (landing / "1.jsonl").write_bytes(
        b'{"key": 1, "offset": 1, "t": "x"}\n{"key": 2, "offset": 2, "v\xed\xa0\x80": 5}\n'
    )
    (landing / "2.csv").write_bytes(b"key,offset,at\n3,3,2024-01-01T00:00:00\n")  # a timestamp
    (landing / "3.csv").write_bytes(
        b"key,offset,at\n4,4,0000-01-01T00:00:00\n5,5,2024-01-02T00:00:00\n"
    )
    r = cli.ingest(landing)
    assert "2 error row(s)" in r.err
    assert [(e["file"], e["row"]) for e in cli.errors()] == [("1.jsonl", 2), ("3.csv", 1)]
    assert sorted(_every_read_works(cli), key=lambda row: str(row["key"])) == [
        {"key": 1, "offset": 1, "t": "x", "at": None},
        {"key": 3, "offset": 3, "t": None, "at": "2024-01-01T00:00:00+00:00"},
        {"key": 5, "offset": 5, "t": None, "at": "2024-01-02T00:00:00+00:00"},
    ]
