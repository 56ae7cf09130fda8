"""The warm local Spark (``resources.local_spark``), the default on the embedded defaults
(the suite itself runs with ``UPSERT_SPARK_SERVER=off``; these tests unset it): the
first Spark ingest starts one Spark Connect server for its ``UPSERT_HOME``, later
commands attach to the same server, only with its token (kept where only its user reads
it), a command whose code differs never runs on it, ``upsertctl spark status|stop``
report and stop it, and a server idle past ``UPSERT_SPARK_IDLE_S`` stops by itself.
Real processes: each test starts (and always stops) its own server."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.helpers import REPO, Cli, base_env, spark_noise, write_jsonl

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _cli(tmp_path: Path, idle_s: str) -> Cli:
    env = {"UPSERT_SPARK_SERVER": "", "UPSERT_SPARK_IDLE_S": idle_s,  # the default
           "SPARK_REMOTE": "", "SPARK_MASTER": ""}
    return Cli(tmp_path / "home", env=env, engine="spark")


def _unauthenticated_count(port: int) -> subprocess.CompletedProcess[bytes]:
    """A client that knows the port but not the token (another local user)."""
    code = ("from pyspark.sql import SparkSession\n"
            f"s = SparkSession.builder.remote('sc://127.0.0.1:{port}').getOrCreate()\n"
            "print(s.range(3).count())\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120,
                          env={k: v for k, v in os.environ.items()
                               if k != "SPARK_CONNECT_AUTHENTICATE_TOKEN"})


def test_one_server_is_started_reused_and_stopped(tmp_path: Path) -> None:
    cli = _cli(tmp_path, "600")
    landing = tmp_path / "landing"
    landing.mkdir()
    assert cli.run("spark", "status").json()["running"] is False  # status starts nothing
    assert not (cli.home / "spark").exists()
    write_jsonl(landing, "1.jsonl", [{"key": k, "offset": 1, "v": "a"} for k in range(20)])
    state = cli.home / "spark"
    pids: list[int] = []
    try:
        started = cli.ingest(landing)
        first = cli.run("spark", "status").json()
        pids.append(int(first["pid"]))
        assert first["running"] and first["url"].startswith("sc://127.0.0.1:")
        assert first["runs_this_code"] is True and first["enabled"] is True
        write_jsonl(landing, "2.jsonl", [{"key": 1, "offset": 2, "v": "b"}])
        attached = cli.ingest(landing)
        # The server's JVM output is its log's, never the commands' stderr (issue 23).
        assert spark_noise(started.err + attached.err) == [], started.err + attached.err
        assert "log4j" in (state / "connect-server.log").read_text()
        second = cli.run("spark", "status").json()
        assert second["pid"] == first["pid"]  # the same server, attached to again
        rows = {r["key"]: r["v"] for r in cli.snapshot()}
        assert len(rows) == 20 and rows[1] == "b"

        # Only its user can use it: the token is in a file only its owner reads, never
        # printed, and a client without it is refused.
        record = json.loads((state / "server.json").read_text())
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        assert stat.S_IMODE((state / "server.json").stat().st_mode) == 0o600
        printed = started.out + started.err + attached.out + attached.err + json.dumps(second)
        assert len(record["token"]) >= 32 and record["token"] not in printed
        intruder = _unauthenticated_count(int(record["port"]))
        assert intruder.returncode != 0 and b"UNAUTHENTICATED" in intruder.stderr, intruder

        # A command whose code differs from the server's (the checkout changed since it
        # started) never runs on it: while another command uses the server it runs on a
        # JVM of its own; once nothing does, it replaces the server.
        (state / "server.json").write_text(json.dumps({**record, "code": "older"}))
        user = subprocess.Popen(["sleep", "300"])
        try:
            (state / "users" / str(user.pid)).touch()
            write_jsonl(landing, "3.jsonl", [{"key": 2, "offset": 3, "v": "c"}])
            own_jvm = cli.ingest(landing)
            assert "starts a Spark JVM of its own" in own_jvm.err, own_jvm.err
            assert cli.run("spark", "status").json()["runs_this_code"] is False
        finally:
            user.kill()
            user.wait()
        write_jsonl(landing, "4.jsonl", [{"key": 3, "offset": 4, "v": "d"}])
        cli.ingest(landing)
        replaced = cli.run("spark", "status").json()
        pids.append(int(replaced["pid"]))
        pids.append(int(json.loads((state / "server.json").read_text())["watchdog"]))
        assert replaced["pid"] != first["pid"] and replaced["runs_this_code"] is True
        assert not _alive(int(first["pid"]))
        rows = {r["key"]: r["v"] for r in cli.snapshot()}
        assert (rows[1], rows[2], rows[3]) == ("b", "c", "d")
    finally:
        stopped = cli.run("spark", "stop")
    assert stopped.json()["running"] is False and "stopped" in stopped.err
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids)  # the servers, and the watchdog with its server
    again = cli.run("spark", "stop")
    assert "no local Spark Connect server was running" in again.err


def test_dagster_runs_attach_to_the_server_the_cli_uses(tmp_path: Path) -> None:
    """A Dagster run on the embedded defaults (here ``python -m orchestration.backfill``,
    a run in its own process as ``dagster dev`` makes one) starts the warm server; the
    next run and ``upsertctl`` attach to the same one."""
    cli = _cli(tmp_path, "600")
    landing = tmp_path / "landing"
    (tmp_path / "dagster").mkdir()
    env = base_env({**cli.extra_env, "UPSERT_HOME": str(cli.home), "UPSERT_ENGINE": "spark",
                    "UPSERT_LANDING": str(landing), "UPSERT_SHARD": "feed",
                    "UPSERT_KEY": "key", "UPSERT_ORDER": "offset",
                    "DAGSTER_HOME": str(tmp_path / "dagster")})

    def backfill() -> str:
        done = subprocess.run([sys.executable, "-m", "orchestration.backfill", "feed"],
                              env=env, cwd=REPO, capture_output=True, timeout=600)
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
        return done.stdout.decode()

    pids: list[int] = []
    try:
        write_jsonl(landing, "1.jsonl", [{"key": k, "offset": 1, "v": "a"} for k in range(5)])
        assert backfill() == "1.jsonl: applied at ts 0\n"
        first = cli.run("spark", "status").json()
        pids.append(int(first["pid"]))
        assert first["running"] and first["runs_this_code"]
        write_jsonl(landing, "2.jsonl", [{"key": 1, "offset": 2, "v": "b"}])
        assert backfill() == "2.jsonl: applied at ts 1\n"
        write_jsonl(landing, "3.jsonl", [{"key": 2, "offset": 3, "v": "c"}])
        cli.run("ingest", "--shard", "feed", "--no-progress", str(landing))
        assert cli.run("spark", "status").json()["pid"] == first["pid"]
        rows = {r["key"]: r["v"] for r in cli.snapshot("feed")}
        assert len(rows) == 5 and (rows[1], rows[2]) == ("b", "c")
    finally:
        cli.run("spark", "stop")
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids)


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
