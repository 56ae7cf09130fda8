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

from tests.e2e.helpers import Cli, write_parquet

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
