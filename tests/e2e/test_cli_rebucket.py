"""``upsertctl rebucket --shard S --buckets N``: the bucket count changes, up and down,
and every read at every time stays what the model says, as do the error and late
collections, ``check`` and later ingests (on the cluster: Spark ingests on PostgreSQL and
S3, rebucket 4 -> 16 -> 4)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from pathlib import Path
from typing import Any

from tests.e2e.helpers import Cli, write_jsonl
from tests.model import UpsertModel, canonical


def _batch(n: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for k in range(40):
        if (k + n) % 5 == 0:
            rows.append({"key": k, "offset": 10 * n + 5, "__deleted": True})
        elif (k * (n + 1)) % 3:
            rows.append({"key": k, "offset": 10 * n + k % 4, "v": f"{n}-{k}"})
    rows.append({"key": 2, "offset": 0, "v": "late"})  # late from the second file on
    return rows


class History:
    def __init__(self, cli: Cli, landing: Path) -> None:
        self.cli, self.landing = cli, landing
        self.model = UpsertModel("global")
        self.files = 0
        self.errors = 0

    def ingest(self, rows: list[dict[str, Any]], *options: str) -> None:
        write_jsonl(self.landing, f"f{self.files:03d}.jsonl", [*rows, {"key": None, "offset": 1}])
        self.model.apply(rows)  # (its null key is an error row, not applied)
        self.files += 1
        self.errors += 1
        self.cli.ingest(self.landing, "--order-scope", "global", *options)

    def assert_reads(self) -> None:
        """Every readable time's snapshot and changes, the error and late collections
        and ``check``, against the model."""
        summary = self.cli.inspect()
        since, upper = summary["since"], summary["upper"]
        assert upper == self.model.upper
        for ts in range(since, upper):
            got = Counter(canonical(r) for r in self.cli.snapshot(as_of=ts))
            assert got == self.model.rows(ts), f"snapshot as of {ts}"
        changes: Counter[tuple[int, Hashable]] = Counter()
        for c in self.cli.changes():
            changes[(c["ts"], canonical(c["row"]))] += c["diff"]
        # (At since, after gc --retain, the history before it is folded into it.)
        first = since + 1 if since else 0
        got_changes = Counter({k: d for k, d in changes.items() if k[0] >= first})
        want = Counter({(ts, row): d for ts in range(first, upper)
                        for row, d in self.model.row_changes(ts).items()})
        assert got_changes == want, "changes"
        if since == 0:
            assert len(self.cli.errors()) == self.errors  # each error row once
            late = [(r["file"], r["row"]) for r in self.cli.late()]
            assert len(late) == len(set(late)) == len(self.model.late)
        self.cli.check()

def test_rebucket_up_and_down_keeps_every_read(cli: Cli, landing: Path) -> None:
    history = History(cli, landing)
    for n in range(3):
        history.ingest(_batch(n), "--buckets", "4")
    assert cli.inspect()["buckets"] == 4

    up = cli.run("rebucket", "--shard", "s", "--buckets", "16")
    report = up.json()
    assert report["changed"] and (report["buckets_before"], report["buckets"]) == (4, 16)
    assert report["upper"] == 3 and report["parts_read"] > 0
    assert "4 -> 16 buckets at upper 3" in up.err
    assert cli.inspect()["buckets"] == 16
    history.assert_reads()

    # Ingests go on with the new count, named or not; the old one is refused, naming
    # the command that changes it.
    history.ingest([{"key": k, "offset": 1, "v": "old"} for k in range(40)])
    history.ingest(_batch(3), "--buckets", "16")
    write_jsonl(landing, "g.jsonl", [{"key": 1, "offset": 99, "v": "x"}])
    refused = cli.ingest(landing, "--buckets", "4", rc=1)
    assert "--buckets 4 (shard has 16)" in refused.error_line()
    assert "upsertctl rebucket --buckets 4" in refused.error_line()
    (landing / "g.jsonl").unlink()
    history.assert_reads()

    down = cli.run("rebucket", "--shard", "s", "--buckets", "4").json()
    assert down["changed"] and (down["buckets_before"], down["buckets"]) == (16, 4)
    history.ingest(_batch(4))
    history.assert_reads()

    same = cli.run("rebucket", "--shard", "s", "--buckets", "4")
    assert not same.json()["changed"] and "nothing changed" in same.err
    cli.run("gc", "--shard", "s", "--retain", "2", "--leak-grace", "0")
    history.assert_reads()
    assert cli.run("rebucket", "--shard", "s", "--buckets", "2").json()["changed"]
    history.ingest(_batch(5))
    history.assert_reads()


def test_rebucket_refuses_what_it_cannot_do(cli: Cli, landing: Path) -> None:
    missing = cli.run("rebucket", "--shard", "nope", "--buckets", "8", rc=1)
    assert "nope" in missing.error_line()
    for bad in ("0", "x"):  # usage errors, before any store is opened
        assert "--buckets" in cli.run("rebucket", "--shard", "s", "--buckets", bad,
                                      rc=2).error_line()
    write_jsonl(landing, "a.jsonl", [{"key": 1, "offset": 1, "v": "x"}])
    cli.ingest(landing)
    too_many = cli.run("rebucket", "--shard", "s", "--buckets", "4097", rc=1)
    assert "4096" in too_many.error_line()
