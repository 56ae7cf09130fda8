"""The warm local Spark (``resources.local_spark``), the default on the embedded defaults
(the suite itself runs with ``UPSERT_SPARK_SERVER=off``; these tests unset it): the
first Spark ingest starts one Spark Connect server for its ``UPSERT_HOME``, later
commands attach to the same server, only with its token (kept where only its user reads
it), a command whose code differs never runs on it, ``upsertctl spark status|stop``
report and stop it, a server idle past ``UPSERT_SPARK_IDLE_S`` stops by itself, and an
ingest whose server is killed or stopped under it fails at once with one line and a rerun
ingests its file exactly once.
Real processes: each test starts (and always stops) its own server."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.helpers import REPO, Cli, Result, base_env, spark_noise, write_jsonl

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
        assert first["stopping"] is False
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


BIG_ROWS = 200_000  # a Spark job of a few seconds at least, however idle the machine


def _ingest_while_the_server_goes(cli: Cli, landing: Path, end: str) -> tuple[Result, float]:
    """Start an ingest, and once its Spark job runs on the server (the server's log says
    it got a job), end the server: ``kill`` (SIGKILL of its JVM) or ``stop`` (``upsertctl
    spark stop`` from another shell). The ingest's result, and how long it ran on after."""
    log = cli.home / "spark" / "connect-server.log"
    pid = int(cli.run("spark", "status").json()["pid"])
    jobs = log.read_text().count("Got job")
    proc = cli.popen(*cli.ingest_args(landing))
    try:
        deadline = time.monotonic() + 300
        while log.read_text().count("Got job") == jobs:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the ingest's job never started"
            time.sleep(0.05)
        ended = time.monotonic()
        if end == "kill":
            os.kill(pid, signal.SIGKILL)
        else:
            stopped = cli.run("spark", "stop")
            assert f"in use by pid {proc.pid}" in stopped.err, stopped.err
        out, err = proc.communicate(timeout=120)
        took = time.monotonic() - ended
    finally:
        if proc.poll() is None:  # it hung: the failure is the assertion below, not a leak
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return Result(["ingest"], proc.returncode, out, err), took


def test_a_server_gone_mid_run_fails_the_file_at_once_and_a_rerun_ingests_it_once(
    tmp_path: Path,
) -> None:
    """The server killed (SIGKILL of its JVM) while an ingest's Spark job runs on it: the
    ingest exits within seconds (it used to wait 10 minutes for pyspark's retries, then
    print a raw gRPC error), non-zero, with one line naming the file, the server's pid
    and the next step; nothing of the file is committed, and the rerun, on a new server,
    ingests it exactly once. The same for a server stopped from another shell."""
    cli = _cli(tmp_path, "600")
    landing = tmp_path / "landing"
    write_jsonl(landing, "0.jsonl", [{"key": k, "offset": 0, "v": "-"} for k in range(5)])

    def fails_at_once(name: str, ts: int, end: str) -> int:
        write_jsonl(landing, name, [{"key": k, "offset": ts, "v": name}
                                    for k in range(BIG_ROWS)])
        pid = int(cli.run("spark", "status").json()["pid"])
        failed, took = _ingest_while_the_server_goes(cli, landing, end)
        assert failed.rc == 1 and took < 60, (took, str(failed))
        assert failed.err_lines == [
            "1 pending file(s)",
            f"upsertctl: error: {name}: the local Spark server stopped during the run"
            f" (pid {pid}); run the command again: nothing of {name} was committed"]
        assert cli.inspect()["upper"] == ts  # nothing of it committed
        return pid

    try:
        cli.ingest(landing)  # starts the server
        killed = fails_at_once("1.jsonl", 1, "kill")
        again = cli.ingest(landing)  # on a new server
        assert "upper 1 -> 2" in again.err, again.err
        assert cli.run("spark", "status").json()["pid"] != killed
        rows = cli.snapshot()
        assert len(rows) == BIG_ROWS and {r["v"] for r in rows} == {"1.jsonl"}
        assert cli.inspect()["upper"] == 2  # applied exactly once
        cli.check()
        fails_at_once("2.jsonl", 2, "stop")  # `upsertctl spark stop` from another shell
    finally:
        cli.run("spark", "stop")


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
