"""The warm local Spark (``resources.local_spark``, ``UPSERT_SPARK_SERVER=auto``): the
first Spark ingest starts one Spark Connect server for its ``UPSERT_HOME``, later
commands attach to the same server, ``upsertctl spark status|stop`` report and stop it,
and a server idle past ``UPSERT_SPARK_IDLE_S`` stops by itself. Real processes: each
test starts (and always stops) its own server."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.helpers import Cli, spark_noise, write_jsonl

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _cli(tmp_path: Path, idle_s: str) -> Cli:
    env = {"UPSERT_SPARK_SERVER": "auto", "UPSERT_SPARK_IDLE_S": idle_s,
           "SPARK_REMOTE": "", "SPARK_MASTER": ""}
    return Cli(tmp_path / "home", env=env, engine="spark")


def test_one_server_is_started_reused_and_stopped(tmp_path: Path) -> None:
    cli = _cli(tmp_path, "600")
    landing = tmp_path / "landing"
    landing.mkdir()
    assert cli.run("spark", "status").json()["running"] is False  # status starts nothing
    write_jsonl(landing, "1.jsonl", [{"key": k, "offset": 1, "v": "a"} for k in range(20)])
    try:
        started = cli.ingest(landing)
        first = cli.run("spark", "status").json()
        assert first["running"] and first["url"].startswith("sc://127.0.0.1:")
        write_jsonl(landing, "2.jsonl", [{"key": 1, "offset": 2, "v": "b"}])
        attached = cli.ingest(landing)
        # The server's JVM output is its log's, never the commands' stderr (issue 23).
        assert spark_noise(started.err + attached.err) == [], started.err + attached.err
        assert "log4j" in (cli.home / "spark" / "connect-server.log").read_text()
        second = cli.run("spark", "status").json()
        assert second["pid"] == first["pid"]  # the same server, attached to again
        rows = {r["key"]: r["v"] for r in cli.snapshot()}
        assert len(rows) == 20 and rows[1] == "b"
    finally:
        stopped = cli.run("spark", "stop")
    assert stopped.json()["running"] is False and "stopped" in stopped.err
    deadline = time.monotonic() + 30
    while _alive(int(first["pid"])) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(int(first["pid"]))
    again = cli.run("spark", "stop")
    assert "no local Spark Connect server was running" in again.err


def test_an_idle_server_stops_by_itself(tmp_path: Path) -> None:
    cli = _cli(tmp_path, "4")
    landing = tmp_path / "landing"
    landing.mkdir()
    write_jsonl(landing, "1.jsonl", [{"key": 1, "offset": 1}])
    try:
        cli.ingest(landing)
        pid = int(cli.run("spark", "status").json()["pid"])
        # A command still using the server keeps it, however long it runs (a job past
        # the idle time once had the server stopped under it).
        user = subprocess.Popen(["sleep", "30"])
        (cli.home / "spark" / "users" / str(user.pid)).touch()
        time.sleep(8)
        assert cli.run("spark", "status").json()["running"] is True
        user.kill()
        user.wait()
        deadline = time.monotonic() + 60
        while cli.run("spark", "status").json()["running"] and time.monotonic() < deadline:
            time.sleep(1)
        assert cli.run("spark", "status").json()["running"] is False
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(pid)
    finally:
        cli.run("spark", "stop")


def test_a_bad_setting_is_refused(tmp_path: Path) -> None:
    cli = Cli(tmp_path / "home", env={"UPSERT_SPARK_SERVER": "always"}, engine="spark")
    landing = tmp_path / "landing"
    landing.mkdir()
    write_jsonl(landing, "1.jsonl", [{"key": 1, "offset": 1}])
    failed = cli.ingest(landing, rc=1)
    assert "UPSERT_SPARK_SERVER='always'" in failed.error_line()
