"""The review's data-loss reproductions, through fresh ``upsertctl`` processes.

Each test is the sequence a user ran when the defect was found; it fails on the code
before the fix (a203bdf) and passes after. They run on the embedded deployment only:
the mechanisms are in ``upsert_core`` and the cluster half is covered elsewhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.helpers import Cli, write_jsonl

EMBEDDED = pytest.mark.parametrize("deployment", ["embedded"], indirect=True)


@EMBEDDED
@pytest.mark.parametrize("scope", ["batch", "global"])
def test_gc_retain_then_reinsert_keeps_the_row(cli: Cli, landing: Path, scope: str) -> None:
    """Insert, delete, ``gc --retain 1``, insert the same row again: the row is live."""
    row = {"key": 1, "offset": 1, "v": "V"}
    write_jsonl(landing, "f0.jsonl", [row])
    cli.ingest(landing, "--order-scope", scope)
    write_jsonl(landing, "f1.jsonl", [{"key": 1, "offset": 2, "__deleted": True}])
    cli.ingest(landing)
    cli.run("gc", "--shard", "s", "--retain", "1")
    write_jsonl(landing, "f2.jsonl", [{**row, "offset": 3}])
    cli.ingest(landing)
    assert cli.snapshot() == [{"key": 1, "offset": 3, "v": "V"}]
    assert cli.check().json()["ok"] is True
    write_jsonl(landing, "f3.jsonl", [{"key": 1, "offset": 4, "v": "W"}])
    cli.ingest(landing)
    assert cli.snapshot() == [{"key": 1, "offset": 4, "v": "W"}]
    assert cli.check().json()["ok"] is True
