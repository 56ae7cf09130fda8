"""Time travel by time (CONTRACT.md, "Time travel by time"): ``--as-of-time``,
``--since-time`` and ``--until-time`` read at the ts committed around a wall-clock time;
``inspect`` shows ``since_time`` and ``last_commit_time``; a time outside the readable
range, a ts option with its time option, and a time that is not ISO-8601 are refused.

Embedded deployment only: the times are resolved from the shard state the same way on
every store, and each ingest here is its own process, so its commit time is its own.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.e2e.helpers import Cli, write_jsonl

pytestmark = pytest.mark.parametrize("deployment", ["embedded"], indirect=True)


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _iso(moment: datetime, *, zone: bool = True) -> str:
    moment = moment.astimezone(UTC)
    return moment.isoformat() if zone else moment.replace(tzinfo=None).isoformat()


def _three_commits(cli: Cli, landing: Path) -> list[datetime]:
    """Ingest three files in three runs (ts 0, 1, 2); their commit times, from inspect."""
    times = []
    for i in range(3):
        write_jsonl(landing, f"{i:02}.jsonl", [{"key": i % 2, "offset": i, "v": f"v{i}"}])
        cli.ingest(landing)
        info = cli.inspect()
        assert info["upper"] == i + 1
        times.append(_at(info["last_commit_time"]))
    assert times[0] < times[1] < times[2]  # separate processes, milliseconds apart at least
    return times


def _snapshot_at(cli: Cli, moment: str, *extra: str) -> list[dict[str, object]]:
    return cli.run("snapshot", "--shard", "s", "--as-of-time", moment, *extra).jsonl()


def _changes(cli: Cli, *args: str) -> list[dict[str, object]]:
    return cli.run("changes", "--shard", "s", *args).jsonl()


def test_inspect_shows_since_time_and_last_commit_time(cli: Cli, landing: Path) -> None:
    write_jsonl(landing, "00.jsonl", [])  # an empty batch still takes a ts and a time
    before = datetime.now(UTC)
    cli.ingest(landing)
    after = datetime.now(UTC)
    info = cli.inspect()
    assert info["since_time"] == info["last_commit_time"]
    committed = _at(info["last_commit_time"])
    assert committed.utcoffset() == timedelta(0)
    assert before - timedelta(milliseconds=1) <= committed <= after


def test_snapshot_as_of_time_reads_the_last_ts_committed_by_then(
    cli: Cli, landing: Path
) -> None:
    t = _three_commits(cli, landing)
    by_ts = [cli.snapshot(as_of=ts) for ts in range(3)]
    assert _snapshot_at(cli, _iso(t[0])) == by_ts[0]  # at the commit itself
    assert _snapshot_at(cli, _iso(t[1] - timedelta(microseconds=1))) == by_ts[0]
    assert _snapshot_at(cli, _iso(t[1], zone=False)) == by_ts[1]  # no zone: UTC
    plus_two = t[1].astimezone(timezone(timedelta(hours=2))).isoformat()  # the same instant
    assert _snapshot_at(cli, plus_two) == by_ts[1]
    assert _snapshot_at(cli, _iso(t[2] + timedelta(days=1))) == by_ts[2]
    csv = cli.run("snapshot", "--shard", "s", "--as-of-time", _iso(t[1]), "--format", "csv")
    assert csv.out == cli.run("snapshot", "--shard", "s", "--as-of", "1", "--format",
                              "csv").out


def test_changes_since_time_and_until_time_read_from_the_first_ts_committed_then(
    cli: Cli, landing: Path
) -> None:
    t = _three_commits(cli, landing)
    assert _changes(cli, "--since-time", _iso(t[1])) == cli.changes(since=1)
    assert _changes(cli, "--since-time", _iso(t[0] + timedelta(microseconds=1))) == \
        cli.changes(since=1)
    assert _changes(cli, "--until-time", _iso(t[2])) == cli.changes(until=2)
    assert _changes(cli, "--since-time", _iso(t[1]), "--until-time",
                    _iso(t[2], zone=False)) == cli.changes(since=1, until=2)
    later = _iso(t[2] + timedelta(seconds=1))
    # No ts committed at or after it: the upper.
    assert _changes(cli, "--since-time", later) == []
    assert _changes(cli, "--until-time", later) == cli.changes()
    mixed = _changes(cli, "--since", "1", "--until-time", _iso(t[2]))
    assert mixed == cli.changes(since=1, until=2)


def test_a_time_before_the_earliest_readable_commit_is_refused(
    cli: Cli, landing: Path
) -> None:
    t = _three_commits(cli, landing)
    early = _iso(t[0] - timedelta(milliseconds=1))
    for args in (["snapshot", "--as-of-time", early], ["changes", "--since-time", early],
                 ["changes", "--until-time", early]):
        r = cli.run(*args, "--shard", "s", rc=1)
        assert "readable commit times are" in r.error_line(), r
        assert r.out == ""
    # After gc --retain 1 only ts 2 is readable: t[1] is before its commit.
    cli.run("gc", "--shard", "s", "--retain", "1")
    assert cli.inspect()["since"] == 2
    assert _at(cli.inspect()["since_time"]) == t[2]
    r = cli.run("snapshot", "--shard", "s", "--as-of-time", _iso(t[1]), rc=1)
    assert f"readable commit times are {t[2].isoformat(timespec='milliseconds')}" in \
        r.error_line()
    assert _snapshot_at(cli, _iso(t[2])) == cli.snapshot(as_of=2)


@pytest.mark.parametrize(("ts_option", "time_option", "command"), [
    ("--as-of", "--as-of-time", "snapshot"),
    ("--since", "--since-time", "changes"),
    ("--until", "--until-time", "changes"),
])
def test_a_ts_option_with_its_time_option_is_refused(
    cli: Cli, landing: Path, ts_option: str, time_option: str, command: str
) -> None:
    write_jsonl(landing, "00.jsonl", [{"key": 1, "offset": 1}])
    cli.ingest(landing)
    r = cli.run(command, "--shard", "s", ts_option, "0", time_option, "2030-01-01T00:00:00",
                rc=2)
    assert "not allowed with argument" in r.error_line()
    assert ts_option in r.error_line() and time_option in r.error_line()
    assert r.out == ""


@pytest.mark.parametrize("text", ["yesterday", "2030-13-01", "1700000000"])
def test_a_time_that_is_not_iso_8601_is_refused(cli: Cli, text: str) -> None:
    for args in (["snapshot", "--as-of-time", text], ["changes", "--since-time", text],
                 ["changes", "--until-time", text]):
        r = cli.run(*args, "--shard", "s", rc=2)
        assert "not an ISO-8601 time" in r.error_line()


def test_a_time_needing_a_ts_committed_before_times_were_recorded_is_refused(
    cli: Cli, landing: Path
) -> None:
    """An old shard (its ts 0 and 1 committed by a version that recorded no times) reads by
    time only from its first recorded commit on."""
    write_jsonl(landing, "00.jsonl", [{"key": 1, "offset": 1}])
    write_jsonl(landing, "01.jsonl", [{"key": 2, "offset": 2}])
    cli.ingest(landing)
    _forget_commit_times(cli)  # what the shard looks like when an older version wrote it
    info = cli.inspect()
    assert info["since_time"] is None and info["last_commit_time"] is None
    r = cli.run("snapshot", "--shard", "s", "--as-of-time", "2999-01-01", rc=1)
    assert "no commit time is recorded" in r.error_line()
    write_jsonl(landing, "02.jsonl", [{"key": 3, "offset": 3}])
    cli.ingest(landing)
    info = cli.inspect()
    assert info["since_time"] is None  # ts 0 still has none
    t2 = _at(info["last_commit_time"])
    r = cli.run("changes", "--shard", "s", "--since-time",
                _iso(t2 - timedelta(milliseconds=1)), rc=1)
    assert "ts 0 to 1 were committed before the shard recorded times" in r.error_line()
    assert _snapshot_at(cli, _iso(t2)) == cli.snapshot(as_of=2)
    assert _changes(cli, "--since-time", _iso(t2)) == cli.changes(since=2)


def _forget_commit_times(cli: Cli) -> None:
    """Drop the shard's commit time entries, as a build before them left its states."""
    from upsert_core.persist.location.urls import open_blob, open_consensus
    from upsert_core.persist.shard import Shard
    from upsert_core.persist.state.state import COMMIT_TIME_PREFIX, ShardState

    consensus, blob = open_consensus(cli.stores[0]), open_blob(cli.stores[1])
    shard = Shard.open(consensus, blob, "s", create=False)

    def forget(state: ShardState) -> ShardState:
        return state.evolve(config={k: v for k, v in state.config.items()
                                    if not k.startswith(COMMIT_TIME_PREFIX)})

    shard.machine.apply(forget)
    consensus.close()
