"""Data written to stdout is UTF-8, as with ``--out``, whatever the locale's encoding.

JSON Lines is UTF-8 by definition and ``--out PATH`` always wrote UTF-8, but stdout used
the locale's encoding: under a legacy locale (``LANG=de_DE.ISO-8859-1``; here
``PYTHONIOENCODING`` stands in for it) ``snapshot`` wrote ``é`` as the latin-1 byte
``0xE9`` (not UTF-8: a JSON Lines or CSV reader gets garbage or fails) and stopped
half-way, exit 1, at the first character latin-1 lacks (``€``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestration.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
VALUES = ["é", "€", "日本", "plain"]


@pytest.mark.parametrize("encoding", ["latin-1", "ascii"])
def test_stdout_data_is_utf8_whatever_the_locale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, encoding: str
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("UPSERT_HOME", str(home))
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "0001.jsonl").write_text("".join(
        json.dumps({"key": i, "offset": 1, "v": v}) + "\n" for i, v in enumerate(VALUES)))
    assert main(["ingest", str(landing), "--shard", "s", "--engine", "local", "--no-progress"]) == 0
    env = {**os.environ, "UPSERT_HOME": str(home), "PYTHONIOENCODING": encoding,
           "PYTHONPATH": str(ROOT)}

    def run(*args: str) -> bytes:
        done = subprocess.run([sys.executable, "-m", "orchestration.cli", *args],
                              env=env, cwd=ROOT, capture_output=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr.decode(errors="replace")
        return done.stdout

    lines = run("snapshot", "--shard", "s").decode("utf-8").splitlines()
    assert sorted(json.loads(x)["v"] for x in lines) == sorted(VALUES)
    csv_text = run("snapshot", "--shard", "s", "--format", "csv").decode("utf-8")
    assert all(v in csv_text for v in VALUES)
    changes = run("changes", "--shard", "s").decode("utf-8").splitlines()
    assert sorted(json.loads(x)["row"]["v"] for x in changes) == sorted(VALUES)
