"""CONTRACT.md "Command line": global options, stores, output formats, exit statuses."""

from __future__ import annotations

import base64
import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.e2e.deployment import Deployment
from tests.e2e.helpers import Cli, write_jsonl, write_parquet


def _one_file(landing: Path) -> None:
    write_jsonl(landing, "a.jsonl", [{"key": 1, "offset": 1, "v": "x"}])


def test_global_options_before_and_after_the_command_and_from_the_environment(
    cli: Cli, deployment: Deployment, tmp_path: Path, landing: Path
) -> None:
    _one_file(landing)
    consensus, blob = deployment.fresh_stores(tmp_path)
    # After the subcommand.
    cli.ingest(landing, "--consensus", consensus, "--blob", blob)
    # Before the subcommand.
    before = cli.derive(global_args=["--consensus", consensus, "--blob", blob])
    assert before.snapshot() == [{"key": 1, "offset": 1, "v": "x"}]
    # From the environment.
    from_env = cli.derive(env={"UPSERT_CONSENSUS_URL": consensus, "UPSERT_BLOB_URL": blob})
    assert from_env.inspect()["upper"] == 1
    # A flag after the subcommand wins over one before it and over the environment.
    other, _ = deployment.fresh_stores(tmp_path)
    r = from_env.run("--consensus", other, "snapshot", "--shard", "s", "--consensus", consensus)
    assert r.jsonl() == [{"key": 1, "offset": 1, "v": "x"}]
    # The deployment's own stores (embedded: the UPSERT_HOME defaults) hold no such shard.
    r = cli.run("snapshot", "--shard", "s", rc=1)
    assert "'s'" in r.error_line() and "not been initialised" in r.error_line()
    assert r.out == ""


def test_defaults_live_under_dot_upsert_in_the_working_directory(
    tmp_path: Path, landing: Path
) -> None:
    # The embedded defaults only: every other deployment sets its stores explicitly.
    _one_file(landing)
    work = tmp_path / "work"
    work.mkdir()
    cli = Cli(tmp_path / "unused", cwd=work)
    del cli.env["UPSERT_HOME"]
    cli.ingest(landing)
    assert (work / ".upsert" / "consensus.db").is_file()
    assert (work / ".upsert" / "blob").is_dir()
    assert cli.snapshot() == [{"key": 1, "offset": 1, "v": "x"}]


def test_failures_are_one_line_on_stderr_with_a_non_zero_exit(cli: Cli, landing: Path) -> None:
    usage = cli.run("snapshot", rc=2)  # --shard missing
    assert usage.err_lines == [usage.error_line()]
    assert "--shard" in usage.error_line()
    unknown = cli.run("snapshot", "--shard", "s", "--bogus", rc=2)
    assert unknown.err_lines == [unknown.error_line()] and "--bogus" in unknown.err
    bad_url = cli.run("--consensus", "ftp://nowhere/x", "inspect", "--shard", "s", rc=1)
    assert bad_url.err_lines == [bad_url.error_line()] and "ftp://nowhere/x" in bad_url.err
    bad_name = cli.run("inspect", "--shard", "../evil", rc=1)
    assert bad_name.err_lines == [bad_name.error_line()]
    missing_landing = cli.ingest(landing / "nope", rc=1)
    assert missing_landing.error_line()
    # Tracebacks only on request.
    assert "Traceback" not in bad_url.err
    debug = cli.run("--debug", "inspect", "--shard", "s", "--consensus", "ftp://x/y", rc=1)
    assert "Traceback" in debug.err and debug.err_lines[-1] == debug.error_line()
    env_debug = cli.derive(env={"UPSERT_DEBUG": "1"})
    r = env_debug.run("inspect", "--shard", "s", "--consensus", "ftp://x/y", rc=1)
    assert "Traceback" in r.err


def test_output_formats_types_nulls_and_files(cli: Cli, landing: Path, tmp_path: Path) -> None:
    when = dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.UTC)
    table = pa.table(
        {
            "key": pa.array(["a", "b"]),
            "offset": pa.array([1, 2], pa.int64()),
            "n": pa.array([7, None], pa.int64()),
            "x": pa.array([1.5, None], pa.float64()),
            "flag": pa.array([True, None]),
            "at": pa.array([when, None], pa.timestamp("us", tz="UTC")),
            "day": pa.array([dt.date(2024, 1, 2), None], pa.date32()),
            "raw": pa.array([b"\x00\xff", None], pa.binary()),
            "text": pa.array(['comma, "quote"', None]),
        }
    )
    write_parquet(landing, "0001.parquet", table)
    cli.ingest(landing)
    rows = {r["key"]: r for r in cli.snapshot()}
    assert rows["a"] == {
        "key": "a", "offset": 1, "n": 7, "x": 1.5, "flag": True,
        "at": "2024-05-06T07:08:09.123456+00:00", "day": "2024-01-02",
        "raw": base64.b64encode(b"\x00\xff").decode(), "text": 'comma, "quote"',
    }
    assert rows["b"] == {"key": "b", "offset": 2, **dict.fromkeys(
        ["n", "x", "flag", "at", "day", "raw", "text"])}
    # CSV: header, ISO timestamps, empty for null.
    csv_text = cli.run("snapshot", "--shard", "s", "--format", "csv").out
    lines = csv_text.splitlines()
    assert lines[0] == "key,offset,n,x,flag,at,day,raw,text"
    assert sorted(lines[1:]) == [
        'a,1,7,1.5,true,2024-05-06T07:08:09.123456+00:00,2024-01-02,AP8=,"comma, ""quote"""',
        "b,2,,,,,,,",
    ]
    # Parquet to a file and to stdout keeps native types.
    out = tmp_path / "snap.parquet"
    r = cli.run("snapshot", "--shard", "s", "--format", "parquet", "--out", str(out))
    assert r.out == ""
    back = pq.read_table(out).sort_by("key")
    assert back.schema.field("at").type == pa.timestamp("us", tz="UTC")
    assert back.schema.field("day").type == pa.date32()
    assert back.to_pylist()[0]["at"] == when and back.column("n").to_pylist() == [7, None]
    piped = cli.run("snapshot", "--shard", "s", "--format", "parquet")
    assert pq.read_table(pa.BufferReader(piped.out_bytes)).sort_by("key").equals(back)
    # JSONL to a file; changes lines have the contract's shape.
    jl = tmp_path / "snap.jsonl"
    cli.run("snapshot", "--shard", "s", "--out", str(jl))
    assert sorted(json.loads(x)["key"] for x in jl.read_text().splitlines()) == ["a", "b"]
    changes = cli.changes()
    assert {tuple(sorted(c)) for c in changes} == {("diff", "row", "ts")}
    assert sorted((c["row"]["key"], c["ts"], c["diff"]) for c in changes) == [
        ("a", 0, 1), ("b", 0, 1)
    ]


def test_empty_csv_snapshot_still_has_a_header(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "1.jsonl", [{"key": 1, "offset": 1, "v": "x"}])
    write_jsonl(landing, "2.jsonl", [{"key": 1, "offset": 2, "__deleted": True}])
    cli.ingest(landing)
    assert cli.run("snapshot", "--shard", "s", "--format", "csv").out == "key,offset,v\n"
    assert cli.snapshot() == []
    assert cli.snapshot(as_of=0) == [{"key": 1, "offset": 1, "v": "x"}]


def test_inspect_check_and_errors(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "1.jsonl", [{"key": 1, "offset": 1}, {"key": None, "offset": 2}])
    cli.ingest(landing, "--order-scope", "global")
    info = cli.inspect()
    for field in ("seqno", "since", "upper", "batches", "rollups", "live_diffs", "blob_bytes"):
        assert isinstance(info[field], int), field
    assert info["upper"] == 1 and info["since"] == 0
    assert info["live_rows"] == 1  # the error row is not a live row
    assert info["ingested_files"] == {"1.jsonl": 0}
    assert info["order_scope"] == "global" and info["key"] == ["key"]
    check = cli.check()
    assert check.json()["ok"] is True and check.json()["error_rows"] == 1
    assert "1 error row" in check.err
    errors = cli.errors()
    assert errors == [{"file": "1.jsonl", "row": 2, "reason": errors[0]["reason"]}]
    assert "key" in errors[0]["reason"]


def test_reads_outside_since_upper_say_what_is_readable(cli: Cli, landing: Path) -> None:
    cli.ingest(landing)  # empty landing
    r = cli.run("snapshot", "--shard", "s", rc=1)
    assert "nothing is readable" in r.error_line()
    for i in range(4):
        write_jsonl(landing, f"{i}.jsonl", [{"key": i, "offset": i}, {"key": None, "offset": 0}])
    cli.ingest(landing)
    r = cli.run("snapshot", "--shard", "s", "--as-of", "4", rc=1)
    assert "[0, 4)" in r.error_line() and r.out == ""
    r = cli.run("changes", "--shard", "s", "--until", "9", rc=1)
    assert "4" in r.error_line()
    gc = cli.run("gc", "--shard", "s", "--retain", "2").json()
    assert gc["since_after"] == 2
    r = cli.run("snapshot", "--shard", "s", "--as-of", "1", rc=1)
    assert "[2, 4)" in r.error_line()
    r = cli.run("changes", "--shard", "s", "--since", "1", rc=1)
    assert "since 2" in r.error_line()
    # What is readable still reads, and history before since is reported at since.
    assert sorted(r["key"] for r in cli.snapshot(as_of=2)) == [0, 1, 2]
    changes = cli.changes()
    assert sorted((c["row"]["key"], c["ts"]) for c in changes) == [(0, 2), (1, 2), (2, 2), (3, 3)]
    # Ingest continues from the upper after GC; error rows survive it.
    write_jsonl(landing, "9.jsonl", [{"key": 9, "offset": 9}])
    cli.ingest(landing)
    assert sorted(r["key"] for r in cli.snapshot()) == [0, 1, 2, 3, 9]
    assert [e["file"] for e in cli.errors()] == ["0.jsonl", "1.jsonl", "2.jsonl", "3.jsonl"]
    assert cli.check().json()["ok"] is True


@pytest.mark.parametrize("deployment", ["embedded"], indirect=True)
def test_version_names_the_installed_distribution(cli: Cli) -> None:
    from importlib.metadata import version

    result = cli.run("--version")
    assert result.out.strip() == f"upsertctl {version('upsert-platform')}"


def test_buckets_are_chosen_when_the_shard_is_created_and_fixed_after(
    cli: Cli, landing: Path
) -> None:
    write_jsonl(landing, "a.jsonl", [{"key": k, "offset": 1, "v": f"{k}"} for k in range(50)])
    cli.ingest(landing, "--buckets", "8")
    rows = sorted(cli.snapshot(), key=lambda r: r["key"])
    assert rows == [{"key": k, "offset": 1, "v": f"{k}"} for k in range(50)]
    assert cli.inspect()["buckets"] == 8
    write_jsonl(landing, "b.jsonl", [{"key": 1, "offset": 2, "v": "y"}])
    conflict = cli.ingest(landing, "--buckets", "4", rc=1)
    assert "--buckets 4 (shard has 8)" in conflict.error_line()
    bad = cli.derive(env={"UPSERT_BUCKETS": "many"}).ingest(landing, rc=1)
    assert "UPSERT_BUCKETS" in bad.error_line()
    out_of_range = cli.ingest(landing, "--buckets", "0", rc=1)
    assert "bucket count" in out_of_range.error_line()
    cli.derive(env={"UPSERT_BUCKETS": "8"}).ingest(landing)  # agrees with the shard
    assert {"key": 1, "offset": 2, "v": "y"} in cli.snapshot()
    cli.check()


def test_ingest_json_prints_the_report_on_stdout(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "a.jsonl", [{"key": 1, "offset": 1, "v": "x"}, {"key": 2, "v": "y"}])
    write_jsonl(landing, "b.jsonl", [{"key": 1, "offset": 2, "__deleted": True}])
    report = cli.ingest(landing, "--json").json()
    assert report["shard"] == "s" and report["start_upper"] == 0 and report["upper"] == 2
    assert [f["name"] for f in report["files"]] == ["a.jsonl", "b.jsonl"]
    first, second = report["files"]
    assert (first["ts"], first["rows_read"], first["inserts"], first["errors"]) == (0, 2, 1, 1)
    assert (second["ts"], second["retractions"], second["inserts"]) == (1, 1, 0)
    assert report["files"] and report["rows_read"] == 3 and report["errors"] == 1
    assert report["seqno"] == cli.inspect()["seqno"]
    sizes = [(landing / f["name"]).stat().st_size for f in report["files"]]
    assert [f["size"] for f in report["files"]] == sizes
    if cli.engine == "local":  # read once, whole, in the driver: its digest is remembered
        assert [(f["landing_bytes_read"], f["digest_bytes_read"])
                for f in report["files"]] == [(n, 0) for n in sizes]
    else:  # each Spark task reads a small file whole, and digests it as it reads: the
        # ledger reads nothing again
        assert all(f["landing_bytes_read"] >= 2 * n and f["digest_bytes_read"] == 0
                   for f, n in zip(report["files"], sizes, strict=True)), report["files"]
    assert report["landing_bytes_read"] == sum(f["landing_bytes_read"] for f in report["files"])
    again = cli.ingest(landing, "--json").json()
    assert again["files"] == [] and again["start_upper"] == again["upper"] == 2
    assert cli.ingest(landing).out == ""  # without --json, stdout stays empty
