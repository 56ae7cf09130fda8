"""``upsertctl`` reading commands on the embedded stores load no optional heavy module.

SQLAlchemy is for a PostgreSQL consensus, boto3 for S3, pandas for nothing the CLI
reads, and ``importlib.metadata`` only for ``--version``: none of them is imported by
``--help``, ``inspect`` or ``errors`` on the default SQLite consensus and local blobs
(issue 12: these commands start fast).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("sqlalchemy", "boto3", "botocore", "pandas", "importlib.metadata")

_PROBE = """
import json, sys
from orchestration.cli.main import main
try:
    status = main(sys.argv[1:])
except SystemExit as e:  # --help
    status = e.code or 0
heavy = [m for m in {heavy!r} if m in sys.modules]
print(json.dumps({{"status": status, "heavy": heavy}}))
"""


def _run(home: Path, *args: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "UPSERT_HOME": str(home)}
    for name in ("UPSERT_CONSENSUS_URL", "UPSERT_BLOB_URL"):
        env.pop(name, None)
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(heavy=HEAVY), *args],
        capture_output=True, text=True, env=env, check=True, cwd=home,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_help_inspect_and_errors_import_no_optional_heavy_module(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "a.csv").write_text("id,ts,v\n1,1,a\n2,2,b\n1,3,c\n")
    home = tmp_path / "home"
    home.mkdir()
    ingest = _run(home, "ingest", str(landing), "--shard", "s", "--key", "id",
                  "--order", "ts", "--engine", "local", "--no-progress")
    assert ingest["status"] == 0
    for args in (["--help"], ["inspect", "--shard", "s"], ["errors", "--shard", "s"]):
        probe = _run(home, *args)
        assert probe == {"status": 0, "heavy": []}, (args, probe)
