"""The CSV writer behind ``upsertctl snapshot --format csv``: every value reads back as
written, one output row per shard row, whatever characters a string holds.

Python's ``csv`` module quotes only the characters of its ``lineterminator``: with
``"\\n"`` a value holding a lone carriage return was written bare, and every CSV reader
(pyarrow, pandas, Python's own ``csv``, and this project's landing reader) takes a bare
``"\\r"`` for the end of a line, so such a row came back split in two, its values
shifted into the wrong columns.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv

from orchestration.cli.main import main
from orchestration.cli.output import row_writer

AWKWARD = ["a\rb", "c\r\nd", "e\nf", 'g,"h"', "\r", "plain", " lead", ""]


def _read_back(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline="")))


def test_values_with_carriage_returns_stay_in_their_row(tmp_path: Path) -> None:
    out = tmp_path / "s.csv"
    columns = [("key", pa.int64()), ("v", pa.string()), ("w", pa.string())]
    rows = [{"key": i, "v": v, "w": "x"} for i, v in enumerate(AWKWARD)]
    with row_writer("csv", columns, str(out)) as w:
        w.write(rows)
    text = out.read_bytes().decode()
    expected = [[str(i), v, "x"] for i, v in enumerate(AWKWARD)]
    assert _read_back(text) == [["key", "v", "w"], *expected]
    table = pacsv.read_csv(
        pa.BufferReader(text.encode()),
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
        convert_options=pacsv.ConvertOptions(
            column_types={"v": pa.string()},
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
        ),
    )
    assert table.column("v").to_pylist() == AWKWARD
    # Rows without such values are written exactly as before: "\n" line ends, minimal
    # quoting, null as empty.
    assert text.startswith("key,v,w\n0,")
    assert text.endswith('\n7,,x\n')
    assert '\n5,plain,x\n' in text


def test_snapshot_csv_of_a_value_with_a_carriage_return(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("UPSERT_HOME", str(tmp_path / "home"))
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "0001.jsonl").write_text(
        "".join(json.dumps({"key": i, "offset": 1, "v": v}) + "\n" for i, v in enumerate(AWKWARD))
    )
    assert main(["ingest", str(landing), "--shard", "s", "--engine", "local", "--no-progress"]) == 0
    out = tmp_path / "snap.csv"
    assert main(["snapshot", "--shard", "s", "--format", "csv", "--out", str(out)]) == 0
    back = _read_back(out.read_bytes().decode())
    assert back[0] == ["key", "offset", "v"]
    assert sorted(back[1:]) == sorted([str(i), "1", v] for i, v in enumerate(AWKWARD))
