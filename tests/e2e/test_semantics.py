"""CONTRACT.md "Source batches" and "Upsert semantics", through ``upsertctl`` processes."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa

from tests.e2e.helpers import (
    Cli,
    apply_changes,
    bag,
    by_key,
    write_csv,
    write_jsonl,
    write_parquet,
)


def test_name_order_late_names_touch_and_nothing_pending(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "b.jsonl", [{"key": 1, "offset": 1, "v": "b"}])
    write_jsonl(landing, "a.jsonl", [{"key": 1, "offset": 9, "v": "a"}])
    (landing / "c.jsonl").write_bytes(b"")  # an empty batch still takes a timestamp
    write_jsonl(landing, "sub/d.jsonl", [{"key": 2, "offset": 1, "v": "d"}])
    (landing / "notes.txt").write_text("not a batch file")
    first = cli.ingest(landing)
    assert "4 file(s)" in first.err and "0 error row(s)" in first.err
    # Name order, not arrival or order values: b (ts 1) overrides a (ts 0).
    assert cli.inspect()["ingested_files"] == {"a.jsonl": 0, "b.jsonl": 1, "c.jsonl": 2,
                                               "sub/d.jsonl": 3}
    assert by_key(cli.snapshot())[1]["v"] == "b"
    # Touching (even rewriting) an ingested file changes nothing; a late file whose name
    # sorts before ingested ones is simply pending and gets the next timestamp.
    write_jsonl(landing, "a.jsonl", [{"key": 1, "offset": 99, "v": "rewritten"}])
    os.utime(landing / "b.jsonl", (time.time() + 60, time.time() + 60))
    write_jsonl(landing, "0-late.jsonl", [{"key": 3, "offset": 1, "v": "late"}])
    cli.ingest(landing)
    info = cli.inspect()
    assert info["upper"] == 5 and info["ingested_files"]["0-late.jsonl"] == 4
    rows = by_key(cli.snapshot())
    assert rows[1]["v"] == "b" and rows[3]["v"] == "late"
    # Nothing pending: the upper and seqno do not move.
    again = cli.ingest(landing)
    assert "nothing new" in again.err
    after = cli.inspect()
    assert (after["upper"], after["seqno"]) == (5, info["seqno"])


def test_options_are_fixed_by_the_first_ingest(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "1.jsonl", [{"id": 1, "region": "eu", "seq": 5, "gone": False,
                                      "v": "x"}])
    cli.ingest(landing, "--key", "id,region", "--order", "seq", "--deleted-col", "gone",
               "--order-scope", "global")
    # Later runs may omit the options ...
    write_jsonl(landing, "2.jsonl", [{"id": 1, "region": "eu", "seq": 4, "v": "older"},
                                     {"id": 1, "region": "us", "seq": 1, "v": "other"},
                                     {"id": 2, "region": "eu", "seq": 1, "gone": "TRUE"}])
    cli.ingest(landing)
    rows = sorted(cli.snapshot(), key=lambda r: r["region"])
    assert rows == [{"id": 1, "region": "eu", "seq": 5, "v": "x"},
                    {"id": 1, "region": "us", "seq": 1, "v": "other"}]
    # ... or repeat them; conflicting ones are an error naming the option and both values.
    write_jsonl(landing, "3.jsonl", [{"id": 3, "region": "eu", "seq": 1}])
    for option, given, stored in (
        (["--key", "id"], "--key id", "id,region"),
        (["--order", "offset"], "--order offset", "seq"),
        (["--deleted-col", "__deleted"], "--deleted-col __deleted", "gone"),
        (["--order-scope", "batch"], "--order-scope batch", "global"),
    ):
        r = cli.ingest(landing, *option, rc=1)
        assert given in r.error_line() and stored in r.error_line()
    assert cli.inspect()["upper"] == 2
    cli.ingest(landing, "--key", "id,region", "--order", "seq", "--order-scope", "global")
    info = cli.inspect()
    assert info["upper"] == 3
    assert (info["key"], info["order"], info["deleted_col"], info["order_scope"]) == (
        ["id", "region"], "seq", "gone", "global")


def test_upsert_rules_typing_columns_and_history(cli: Cli, landing: Path) -> None:
    # ts 0: duplicates (the greatest order wins even when first), a tie (the later row
    # wins), a delete of a key never seen, integers in a float column.
    write_jsonl(landing, "01.jsonl", [
        {"key": 1, "offset": 10, "x": 1.5, "s": "dup-high"},
        {"key": 1, "offset": 3, "x": 2.5, "s": "dup-low"},
        {"key": 2, "offset": 5, "x": 1.0, "s": "tie-first"},
        {"key": 2, "offset": 5, "x": 2.0, "s": "tie-second"},
        {"key": 3, "offset": 1, "__deleted": True},
        {"key": 4, "offset": 1, "x": 4.0, "s": "four"},
    ])
    # ts 1 (Parquet): an identical row for key 4 (no change), an int into the float
    # column, a delete with a string marker, a new column "extra".
    write_parquet(landing, "02.parquet", pa.table({
        "key": pa.array([4, 1, 2], pa.int64()),
        "offset": pa.array([1, 11, 6], pa.int64()),
        "x": pa.array([4.0, 7.0, None], pa.float64()),
        "s": pa.array(["four", "updated", None]),
        "__deleted": pa.array(["false", None, "True"]),
        "extra": pa.array([None, 42, None], pa.int64()),
    }))
    # ts 2 (CSV): the same value with a new order value IS a change; a missing column
    # reads as null; re-inserting a deleted key.
    write_csv(landing, "03.csv", "key,offset,x,s,__deleted\n4,2,4.0,four,false\n2,7,3,back,\n")
    # ts 3 (JSONL): an integer for the float column converts.
    write_jsonl(landing, "04.jsonl", [{"key": 1, "offset": 12, "x": 8, "s": "int-to-float"}])
    cli.ingest(landing)
    cols = ["key", "offset", "x", "s", "extra"]
    snaps = [cli.snapshot(as_of=ts) for ts in range(4)]
    for snap in snaps:
        assert all(list(r) == cols for r in snap)
    s0, s1, s2, s3 = (by_key(s) for s in snaps)
    assert s0 == {
        1: {"key": 1, "offset": 10, "x": 1.5, "s": "dup-high", "extra": None},
        2: {"key": 2, "offset": 5, "x": 2.0, "s": "tie-second", "extra": None},
        4: {"key": 4, "offset": 1, "x": 4.0, "s": "four", "extra": None},
    }
    assert s1 == {
        1: {"key": 1, "offset": 11, "x": 7.0, "s": "updated", "extra": 42},
        4: s0[4],
    }
    assert s2[4]["offset"] == 2 and s2[2] == {"key": 2, "offset": 7, "x": 3.0, "s": "back",
                                                 "extra": None}
    assert s3[1] == {"key": 1, "offset": 12, "x": 8.0, "s": "int-to-float", "extra": None}
    changes = cli.changes()
    # Setting key 4 to its identical row produced no change at ts 1.
    assert [c for c in changes if c["ts"] == 1 and c["row"]["key"] == 4] == []
    # Consolidated: no (row, ts) twice, no zero diff.
    seen = Counter((repr(sorted(c["row"].items())), c["ts"]) for c in changes)
    assert max(seen.values()) == 1 and all(c["diff"] in (1, -1) for c in changes)
    # snapshot(ts) = snapshot(ts - 1) + changes(ts) at every readable ts.
    previous: Counter[str] = Counter()
    for ts, snap in enumerate(snaps):
        previous = apply_changes(previous, changes, ts)
        assert previous == bag(snap), ts
    assert cli.check().json()["ok"] is True


def test_both_order_scopes_on_late_data(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "1.jsonl", [{"key": "a", "offset": 10, "v": "new"},
                                     {"key": "t", "offset": 10, "__deleted": True}])
    write_jsonl(landing, "2.jsonl", [{"key": "a", "offset": 5, "v": "late"},
                                     {"key": "t", "offset": 7, "v": "late-after-delete"},
                                     {"key": "a", "offset": 4, "v": "later-in-file"}])
    cli.ingest(landing, shard="batch")
    cli.ingest(landing, "--order-scope", "global", shard="global")
    # batch scope: a later batch always overrides.
    assert by_key(cli.snapshot("batch")) == {
        "a": {"key": "a", "offset": 5, "v": "late"},
        "t": {"key": "t", "offset": 7, "v": "late-after-delete"},
    }
    # global scope: late data never overwrites newer data, tombstones included.
    assert cli.snapshot("global") == [{"key": "a", "offset": 10, "v": "new"}]
    assert [c["ts"] for c in cli.changes("global")] == [0]
    # GC keeping only the latest time (the least it may keep) keeps tombstones and
    # stored orders.
    cli.run("gc", "--shard", "global", "--retain", "1")
    write_jsonl(landing, "3.jsonl", [{"key": "t", "offset": 9, "v": "still-late"},
                                     {"key": "a", "offset": 11, "v": "newest"}])
    cli.ingest(landing, shard="global")
    assert cli.snapshot("global") == [{"key": "a", "offset": 11, "v": "newest"}]


def test_row_errors_are_kept_once_and_the_ingest_succeeds(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "1.jsonl", [
        {"key": 1, "offset": 1, "n": 5},
        {"key": None, "offset": 2, "n": 6},
        '{"key": 2, "offset": 3, "n": ',
        {"key": 3, "offset": 4, "__deleted": "maybe"},
        {"key": 4, "offset": None},
        {"key": 5, "offset": 5, "n": "not a number"},
        {"key": 6, "offset": 6, "n": 7},
    ])
    r = cli.ingest(landing)
    assert "5 error row(s)" in r.err and r.out == ""
    errors = cli.errors()
    assert [(e["file"], e["row"]) for e in errors] == [("1.jsonl", n) for n in (2, 3, 4, 5, 6)]
    reasons = " | ".join(e["reason"] for e in errors)
    for word in ("key", "JSON", "__deleted", "offset", "n"):
        assert word in reasons, word
    assert sorted(r["key"] for r in cli.snapshot()) == [1, 6]
    # A re-run, and a later file, never repeat them.
    write_jsonl(landing, "2.jsonl", [{"key": 7, "offset": 1, "n": 1}, {"offset": 2}])
    cli.ingest(landing)
    cli.ingest(landing)
    errors = cli.errors()
    assert len(errors) == 6 and errors[-1]["file"] == "2.jsonl" and errors[-1]["row"] == 2
    check = cli.check()
    assert check.json()["error_rows"] == 6 and "6 error row(s)" in check.err


def test_file_errors_stop_at_the_file_and_a_rerun_after_fixing_continues(
    cli: Cli, landing: Path
) -> None:
    write_jsonl(landing, "1.jsonl", [{"key": 1, "offset": 1, "n": 1}])
    good = pa.table({"key": [2], "offset": [1], "n": [2]})
    write_parquet(landing, "2.parquet", good)
    data = (landing / "2.parquet").read_bytes()
    (landing / "2.parquet").write_bytes(data[: len(data) // 2])  # truncated
    write_jsonl(landing, "3.jsonl", [{"key": 3, "n": 3}])  # no order column
    # A key column of another type (a value column's stray values are error rows).
    write_jsonl(landing, "4.jsonl", [{"key": "four", "offset": 1, "n": 4}])
    r = cli.ingest(landing, rc=1)
    line = r.error_line()
    assert "2.parquet" in line and r.err_lines[-1] == line
    assert cli.inspect()["upper"] == 1 and cli.snapshot() == [{"key": 1, "offset": 1, "n": 1}]
    write_parquet(landing, "2.parquet", good)
    r = cli.ingest(landing, rc=1)
    assert "3.jsonl" in r.error_line() and "offset" in r.error_line()
    assert cli.inspect()["upper"] == 2
    write_jsonl(landing, "3.jsonl", [{"key": 3, "offset": 1, "n": 3}])
    r = cli.ingest(landing, rc=1)
    assert "4.jsonl" in r.error_line() and "'key'" in r.error_line()
    assert cli.inspect()["upper"] == 3
    (landing / "4.jsonl").unlink()  # removing the bad file lets later ones through
    write_jsonl(landing, "5.jsonl", [{"key": 5, "offset": 1, "n": 5}])
    cli.ingest(landing)
    info = cli.inspect()
    assert info["upper"] == 4 and sorted(info["ingested_files"]) == [
        "1.jsonl", "2.parquet", "3.jsonl", "5.jsonl"]
    assert sorted(r["n"] for r in cli.snapshot()) == [1, 2, 3, 5]
    assert cli.errors() == []
    assert cli.check().json()["ok"] is True


def test_a_boolean_never_becomes_a_number_in_json_or_csv(cli: Cli, landing: Path) -> None:
    # Issue 21's reproduction: `true` after a float was folded into key 1.0 (0 error rows).
    write_jsonl(landing, "a.jsonl", [{"key": 1.5, "offset": 1, "v": "a"},
                                     {"key": True, "offset": 1, "v": "from-true"},
                                     {"key": 1.0, "offset": 2, "v": "from-1.0"},
                                     {"key": 2.5, "offset": 1, "f": 0.5},
                                     {"key": 3.5, "offset": 1, "f": False}])
    first = cli.ingest(landing)
    assert "2 error row(s)" in first.err, first.err
    assert [(e["file"], e["row"]) for e in cli.errors()] == [("a.jsonl", 2), ("a.jsonl", 5)]
    write_csv(landing, "b.csv", "key,offset,f\ntrue,1,1\n4.5,1,TRUE\n6.5,1,2.5\n")
    cli.ingest(landing)
    assert [(e["file"], e["row"]) for e in cli.errors()][2:] == [("b.csv", 1), ("b.csv", 2)]
    assert by_key(cli.snapshot()) == {
        1.5: {"key": 1.5, "offset": 1, "v": "a", "f": None},
        1.0: {"key": 1.0, "offset": 2, "v": "from-1.0", "f": None},
        2.5: {"key": 2.5, "offset": 1, "v": None, "f": 0.5},
        6.5: {"key": 6.5, "offset": 1, "v": None, "f": 2.5},
    }


def test_floats_compare_as_numbers(cli: Cli, landing: Path) -> None:
    # CONTRACT.md: -0.0 is 0.0 and every NaN is one NaN; a row changing only so is no change.
    nan_a = np.array([0x7FF8000000000001], dtype=np.uint64).view(np.float64)[0]
    nan_b = np.array([0xFFF8000000000000], dtype=np.uint64).view(np.float64)[0]
    write_parquet(landing, "1.parquet", pa.table({"key": [0.0, 1.0], "offset": [1, 1],
                                                  "f": [float("nan"), -0.0]}))
    write_parquet(landing, "2.parquet", pa.table({"key": [-0.0, 1.0], "offset": [1, 1],
                                                  "f": [nan_a, 0.0]}))
    write_csv(landing, "3.csv", "key,offset,f\n-0.0,1,NaN\n1,1,-0\n")
    cli.ingest(landing, "--order-scope", "batch")
    assert cli.inspect()["upper"] == 3
    assert [c["ts"] for c in cli.changes()] == [0, 0], "later files changed nothing"
    rows = cli.snapshot()
    assert len(rows) == 2 and sorted(r["key"] for r in rows) == [0.0, 1.0]
    by = {r["key"]: r["f"] for r in rows}
    assert by[1.0] == 0.0 and (by[0.0] is None or by[0.0] != by[0.0] or by[0.0] == "NaN")
    write_parquet(landing, "4.parquet", pa.table({"key": [0.0], "offset": [1], "f": [nan_b]}))
    cli.ingest(landing)
    assert [c["ts"] for c in cli.changes(since=3)] == []
