"""One JSON Lines row is one line for every line reader.

``json.dumps(ensure_ascii=False)`` escapes the control characters below U+0020 but
leaves U+0085 (NEL), U+2028 and U+2029 raw, and ``str.splitlines`` (the usual way to
read JSON Lines in Python, as this project's own e2e helper does) breaks lines there:
a snapshot row holding one came back as two fragments that are not JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestration.cli.main import main
from orchestration.cli.output import dumps

VALUES = ["a\u2028b", "c\u2029d", "e\x85f", "g\x0bh\x1ci", "plain"]


def test_dumps_is_one_line_by_splitlines() -> None:
    for value in VALUES:
        text = dumps({"v": value, value: 1})
        assert text.splitlines() == [text]
        assert json.loads(text) == {"v": value, value: 1}


def test_snapshot_and_changes_rows_are_one_line_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("UPSERT_HOME", str(tmp_path / "home"))
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "0001.jsonl").write_text("".join(
        json.dumps({"key": i, "offset": 1, "v": v}) + "\n" for i, v in enumerate(VALUES)))
    assert main(["ingest", str(landing), "--shard", "s", "--engine", "local", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["snapshot", "--shard", "s"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sorted(json.loads(x)["v"] for x in lines) == sorted(VALUES)
    assert main(["changes", "--shard", "s"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sorted(json.loads(x)["row"]["v"] for x in lines) == sorted(VALUES)
