"""``gc --retain N`` needs N >= 1 (CONTRACT.md, "History and GC").

``--retain 0`` used to set since to the upper: nothing stayed readable, and every later
ingest and ``check`` failed ("cannot rehydrate ... before since") for good. Now 0 and
negative values are refused with one line on stderr before the shard is touched, and
``--retain 1`` (the least history there is) keeps the shard readable and ingestible.

Embedded deployment only: the refusal happens in argument parsing, before any store is
opened, so the cluster half would test nothing more.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.helpers import Cli, write_jsonl

STATE_FIELDS = ("seqno", "since", "upper", "batches", "rollups", "live_diffs", "blob_bytes",
                "ingested_files")


def _fill(cli: Cli, landing: Path, files: range) -> None:
    for i in files:
        write_jsonl(landing, f"{i:02}.jsonl", [{"key": i % 3, "offset": i, "v": f"v{i}"}])
    cli.ingest(landing)


@pytest.mark.parametrize("deployment", ["embedded"], indirect=True)
@pytest.mark.parametrize("retain", ["0", "-1", "-5"])
def test_gc_retain_below_one_is_refused_and_changes_nothing(
    cli: Cli, landing: Path, retain: str
) -> None:
    _fill(cli, landing, range(4))
    before = cli.inspect()
    snapshot, changes = cli.snapshot(), cli.changes()

    for args in (["--retain", retain], [f"--retain={retain}"]):
        r = cli.run("gc", "--shard", "s", *args, rc=2)
        assert r.err_lines == [r.error_line()], r.err  # exactly one line on stderr
        assert ">= 1" in r.error_line() and "--retain" in r.error_line()
        assert r.out == ""

    after = cli.inspect()
    assert {k: after[k] for k in STATE_FIELDS} == {k: before[k] for k in STATE_FIELDS}
    assert cli.snapshot() == snapshot and cli.changes() == changes
    cli.check()
    # Later ingests still work, and so does the smallest valid retain.
    _fill(cli, landing, range(4, 6))
    assert cli.inspect()["upper"] == 6
    cli.check()


@pytest.mark.parametrize("deployment", ["embedded"], indirect=True)
def test_gc_retain_one_keeps_the_latest_time_and_ingests_continue(
    cli: Cli, landing: Path
) -> None:
    _fill(cli, landing, range(4))
    latest = cli.snapshot()
    report = cli.run("gc", "--shard", "s", "--retain", "1").json()
    assert (report["since_before"], report["since_after"]) == (0, 3)
    assert cli.snapshot() == latest == cli.snapshot(as_of=3)
    cli.check()
    _fill(cli, landing, range(4, 7))
    info = cli.inspect()
    assert (info["since"], info["upper"]) == (3, 7)
    assert sorted(r["key"] for r in cli.snapshot()) == [0, 1, 2]
    assert cli.run("gc", "--shard", "s", "--retain", "1").json()["since_after"] == 6
    _fill(cli, landing, range(7, 8))
    cli.check()
    assert {r["key"]: r["v"] for r in cli.snapshot()} == {0: "v6", 1: "v7", 2: "v5"}


def test_a_stored_retention_is_applied_by_ingests_and_gc(cli: Cli, landing: Path) -> None:
    """``upsertctl retention`` stores how many timestamps stay readable; the ingest's
    maintenance and ``gc`` without ``--retain`` apply it; ``--keep-all`` clears it."""
    _fill(cli, landing, range(3))
    shown = cli.run("retention", "--shard", "s").json()
    assert shown == {"shard": "s", "retention": None, "retention_keep_for": None, "since": 0,
                     "upper": 3}
    assert cli.run("retention", "--shard", "s", "--keep", "2").json()["retention"] == 2
    assert cli.inspect()["retention"] == 2
    _fill(cli, landing, range(3, 6))  # one run of three files: maintenance after it
    info = cli.inspect()
    assert info["upper"] == 6 and 0 < info["since"] <= 4
    latest = cli.snapshot()
    cli.run("gc", "--shard", "s")  # the stored retention, never further than asked
    assert 0 < cli.inspect()["since"] <= 4 and cli.snapshot() == latest
    kept_for = cli.run("retention", "--shard", "s", "--keep-for", "12h").json()
    # Everything readable was committed within the 12 hours: all of it is kept.
    assert kept_for["retention_keep_for"] == "12h"
    assert kept_for["retention"] == kept_for["upper"] - kept_for["since"]
    assert cli.inspect()["retention_keep_for"] == "12h"
    assert cli.run("retention", "--shard", "s", "--keep-all").json()["retention"] is None
    assert cli.inspect()["retention_keep_for"] is None
    for bad in (["--keep", "0"], ["--keep", "1.5"], ["--keep", "2", "--keep-all"],
                ["--keep", "2", "--keep-for", "1d"]):
        cli.run("retention", "--shard", "s", *bad, rc=2)
    assert cli.check().json()["ok"] is True
    cli.run("retention", "--shard", "missing", rc=1)  # a missing shard is not created
