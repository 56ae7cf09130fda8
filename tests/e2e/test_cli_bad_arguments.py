"""CONTRACT.md "Command line": a bad argument is a one-line error naming what is wrong
and what to do next; it is never silently replaced by a default, and a failed command
leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.helpers import Cli, write_jsonl
from upsert_core.redact import redact_url


def _one_file(landing: Path) -> None:
    write_jsonl(landing, "a.jsonl", [{"key": 1, "offset": 1, "v": "x", "__deleted": False}])


@pytest.mark.parametrize("option", ["--order", "--deleted-col"])
def test_an_empty_column_option_is_refused_not_replaced_by_the_default(
    cli: Cli, landing: Path, option: str
) -> None:
    # `--order "$ORDER_COL"` with the variable unset: the user named a column (none);
    # taking the default instead would fix the wrong column in the shard for good.
    _one_file(landing)
    r = cli.ingest(landing, f"{option}=", rc=1)
    assert option in r.error_line() and "column name" in r.error_line()
    r = cli.run("inspect", "--shard", "s", rc=1)  # nothing was created
    assert "not been initialised" in r.error_line()


def test_ingest_from_a_missing_landing_creates_no_shard(
    cli: Cli, tmp_path: Path
) -> None:
    # A typo in the landing path must not leave an empty shard behind (with a typo'd
    # name it would stay in the stores, and `inspect` would show it as real).
    r = cli.ingest(tmp_path / "no-such-landing", shard="typo", rc=1)
    # (the cluster deployment maps the path to a bucket that does not exist)
    assert "no-such-landing" in r.error_line() or "no-such-bucket" in r.error_line()
    r = cli.run("inspect", "--shard", "typo", rc=1)
    assert "not been initialised" in r.error_line()


def test_a_first_file_refused_whole_creates_no_shard(cli: Cli, landing: Path) -> None:
    # Issue 23: a first ingest whose first file lacks its key column left an empty shard
    # behind, which `shards` listed and reads found.
    write_jsonl(landing, "a.jsonl", [{"id": 1, "offset": 1, "v": "x"}])
    r = cli.ingest(landing, shard="orders", rc=1)
    assert r.error_line() == "upsertctl: error: a.jsonl: missing key column 'key'"
    assert cli.run("shards").out == ""
    assert "not been initialised" in cli.run("inspect", "--shard", "orders", rc=1).error_line()
    # Fixed, the same command creates the shard and applies the file at ts 0.
    write_jsonl(landing, "a.jsonl", [{"key": 1, "offset": 1, "v": "x"}])
    cli.ingest(landing, shard="orders")
    assert cli.run("shards").out.splitlines() == ["orders"]
    assert cli.inspect("orders")["ingested_files"] == {"a.jsonl": 0}


@pytest.mark.parametrize("command", ["snapshot", "changes", "errors", "late", "inspect", "gc",
                                     "check"])
def test_a_missing_shard_says_what_to_do(cli: Cli, command: str) -> None:
    r = cli.run(command, "--shard", "nope", rc=1)
    line = r.error_line()
    assert "'nope'" in line and "not been initialised" in line
    # the next step: ingest into it, or point at the stores that hold it
    assert "upsertctl ingest" in line and "--consensus" in line
    assert r.out == ""


@pytest.mark.parametrize(
    ("command", "option", "text"),
    [("snapshot", "--as-of", "1.5"), ("snapshot", "--as-of", "1_0"),
     ("changes", "--since", "\u0661"), ("changes", "--until", "True"),
     ("gc", "--retain", "1e1")],
)
def test_a_time_that_is_not_an_ascii_integer_is_refused(
    cli: Cli, command: str, option: str, text: str
) -> None:
    # Python's int() reads "1_0" as 10 and "\u0661" as 1: never a time here.
    r = cli.run(command, "--shard", "s", option, text, rc=2)
    assert f"not an integer: {text!r}" in r.err, r.err


@pytest.mark.parametrize("deployment", ["embedded"], indirect=True)
@pytest.mark.parametrize("command", ["snapshot", "changes", "errors", "late", "inspect", "gc",
                                     "check", "retention"])
def test_a_read_of_a_missing_shard_creates_no_store(cli: Cli, command: str) -> None:
    # Issue 23: a read in an empty directory created the embedded stores.
    r = cli.run(command, "--shard", "x", rc=1)
    assert "'x'" in r.error_line() and "not been initialised" in r.error_line()
    assert not cli.home.exists()


def test_a_wrong_shard_name_lists_the_shards_there(cli: Cli, landing: Path) -> None:
    _one_file(landing)
    cli.ingest(landing, shard="orders")
    cli.ingest(landing, shard="customers")
    r = cli.run("inspect", "--shard", "ordres", rc=1)
    # ... and names the stores it looked in (a password redacted)
    where = redact_url(cli.stores[0])
    assert f"(shards in {where}: customers, orders)" in r.error_line(), r.error_line()
    assert cli.run("shards").out.splitlines() == ["customers", "orders"]


@pytest.mark.parametrize("deployment", ["embedded"], indirect=True)
@pytest.mark.parametrize("text", ["7", "7x", "1.5d", "0d", "-1h", "d"])
def test_a_retention_duration_without_a_whole_number_and_unit_is_refused(
    cli: Cli, landing: Path, text: str
) -> None:
    _one_file(landing)
    cli.ingest(landing, shard="s")
    r = cli.run("retention", "--shard", "s", f"--keep-for={text}", rc=2)
    assert "a whole number (ASCII digits, at most 12) and a unit (s, m, h, d or w)" in r.err, r.err
    assert '"retention_keep_for":null' in cli.run("retention", "--shard", "s").out.replace(" ", "")
