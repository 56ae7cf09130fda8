"""``upsertctl`` started with stdout or stderr closed (``>&-``, ``2>&-``): Python leaves
``sys.stdout`` / ``sys.stderr`` None. A command that writes no data runs as usual; one
that writes data fails with its one error line; nothing ends in a traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.e2e.helpers import Cli, write_jsonl


def _closed(cli: Cli, fd: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", f'exec "$@" {fd}>&-', "sh", *cli.command(*args)],
                          env=cli.env, cwd=cli.cwd, capture_output=True, text=True,
                          timeout=120)


def test_closed_stdout_or_stderr(tmp_path: Path) -> None:
    cli = Cli(tmp_path / "home")
    landing = tmp_path / "landing"
    write_jsonl(landing, "1.jsonl", [{"key": 1, "offset": 1, "v": "a"}])
    ingested = _closed(cli, 1, *cli.ingest_args(landing))
    assert ingested.returncode == 0, ingested.stderr
    assert "Traceback" not in ingested.stderr and "ingested 1 file(s)" in ingested.stderr

    write_jsonl(landing, "2.jsonl", [{"key": 2, "offset": 1, "v": "b"}])
    quiet = _closed(cli, 2, *cli.ingest_args(landing))
    assert quiet.returncode == 0 and quiet.stdout == ""
    assert sorted(r["key"] for r in cli.snapshot()) == [1, 2]

    data = _closed(cli, 1, "snapshot", "--shard", "s")
    assert data.returncode == 1
    assert data.stderr.splitlines() == [
        "upsertctl: error: standard output is closed: nothing was written; give the command"
        " an open stdout, or --out PATH where it takes one"]
    out = tmp_path / "rows.jsonl"
    to_file = _closed(cli, 1, "snapshot", "--shard", "s", "--out", str(out))
    assert to_file.returncode == 0, to_file.stderr
    assert len(out.read_text().splitlines()) == 2
