"""A command's use of the warm local Spark server (``resources.local_session``, and the
engine's side in ``resources.engines``): only a session attached to the server marks it
used; a session on it retries a failed call for seconds, and not at all once the server
is gone; a file whose server went away under it is one line naming the file, the
server's pid and the next step. The server's process is a stand-in here (a Python
``sleep`` whose command line carries the server's name); the one JVM is the suite's
shared local session. The real server killed under a real ingest:
``tests/spark/test_local_server.py``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from pyspark.sql import SparkSession
from pyspark.sql.connect.client.retries import DefaultPolicy, Retrying

from resources import local_session, local_spark
from resources.connect_server import free_port
from resources.engines import LazySparkEngine
from resources.local_session import LocalServerRetries
from resources.local_spark import LocalServer, LocalServerStopped
from tests.e2e.helpers import REPO, write_jsonl
from upsert_core.errors import ConfigError, IngestError
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard

pytestmark = pytest.mark.spark

LONG_AGO = 1_000_000.0


class Unavailable(grpc.RpcError):
    """What a call gets from a server that no longer listens."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def trailing_metadata(self) -> None:
        return None


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LocalServer]:
    """This home's server as a command attached to it sees it: recorded and running."""
    directory = local_spark.state_dir(tmp_path / "home")
    directory.mkdir(parents=True, mode=0o700)
    proc = _stand_in()
    (directory / "server.json").write_text(json.dumps({"pid": proc.pid, "port": 1}))
    local_spark.touch(directory)
    os.utime(directory / "last_used", (LONG_AGO, LONG_AGO))
    try:
        yield LocalServer(directory, proc.pid, "sc://localhost:1/;token=t")
    finally:
        proc.kill()
        proc.wait()


def _shard(tmp_path: Path) -> tuple[Shard, Path]:
    landing = tmp_path / "landing"
    write_jsonl(landing, "1.jsonl", [{"key": k, "offset": 1, "v": "a"} for k in range(5)])
    shard = Shard.open(open_consensus(f"sqlite:///{tmp_path}/c.db"),
                       open_blob(f"file://{tmp_path}/blob"), "s")
    return shard, landing


def test_a_jvm_of_its_own_leaves_the_servers_last_used_alone(
    tmp_path: Path, spark: SparkSession, server: LocalServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A command that runs on a JVM of its own (the server runs other code and is busy)
    does not use the server, so its files do not make the server look used."""
    monkeypatch.delenv("UPSERT_SPARK_SERVER")  # the product's default: the server
    monkeypatch.setenv("UPSERT_HOME", str(tmp_path / "home"))
    shard, landing = _shard(tmp_path)
    report = ingest(shard, str(landing), IngestRequest(), engine=LazySparkEngine(lambda: spark))
    assert [f.name for f in report.files] == ["1.jsonl"]
    assert (server.directory / "last_used").stat().st_mtime == LONG_AGO

    # The control: a session attached to the server marks it used with each file.
    monkeypatch.setattr(local_session, "server_of", lambda session: server)
    write_jsonl(landing, "2.jsonl", [{"key": 1, "offset": 2, "v": "b"}])
    ingest(shard, str(landing), IngestRequest(), engine=LazySparkEngine(lambda: spark))
    assert (server.directory / "last_used").stat().st_mtime > time.time() - 600


def test_retries_last_seconds_and_end_when_the_server_is_gone(server: LocalServer) -> None:
    policy = LocalServerRetries(server)
    assert policy.can_retry(Unavailable()) and DefaultPolicy().can_retry(Unavailable())
    assert not policy.can_retry(ValueError("not a call's failure"))

    def waits(policies: list[DefaultPolicy]) -> list[float]:
        slept: list[float] = []
        with pytest.raises(Unavailable), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pyspark's [RETRIES_EXCEEDED]
            for attempt in Retrying(policies, sleep=slept.append):
                with attempt:
                    raise Unavailable()
        return slept

    ours, pysparks = waits([policy]), waits([DefaultPolicy()])
    assert 5 < sum(ours) <= local_session.budget_s() < 15
    assert sum(pysparks) > 600  # what an ingest waited for a server that was gone

    record = json.loads((server.directory / "server.json").read_text())
    stopping = {**record, local_spark.STOPPING: time.time()}
    (server.directory / "server.json").write_text(json.dumps(stopping))
    assert server.gone() and not policy.can_retry(Unavailable())  # a stop began
    (server.directory / "server.json").write_text(json.dumps({**record, "pid": 1}))
    assert server.gone()  # replaced
    (server.directory / "server.json").write_text(json.dumps(record))
    assert not server.gone()
    os.kill(server.pid, 9)
    deadline = time.monotonic() + 30
    while not server.gone():  # a zombie until the fixture reaps it: gone all the same
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not policy.can_retry(Unavailable()) and waits([policy]) == []


def test_a_session_retries_with_the_given_policies_from_its_first_call() -> None:
    """get_spark sets a Connect session's retry policies before it calls the server at
    all (its settings are a call): a server that does not answer fails the session at
    once, where pyspark's default would retry for 10 minutes. In a process of its own,
    as the failed session stays the process's default."""
    code = f"""
import time
from pyspark.sql.connect.client.retries import DefaultPolicy
from resources.spark_session import get_spark

class Counted(DefaultPolicy):
    calls = 0
    def can_retry(self, e):
        Counted.calls += 1
        return False

start = time.monotonic()
try:
    get_spark(remote="sc://127.0.0.1:{free_port()}", retry_policies=[Counted()])
except Exception:
    print(Counted.calls > 0, time.monotonic() - start < 30)
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.split() == ["True", "True"], done.stderr[-2000:]


class Unanswered:
    """A Connect session whose server went away: every call fails as gRPC says."""

    class conf:  # noqa: N801 - pyspark's attribute name
        @staticmethod
        def get(*_: object) -> str:
            raise RuntimeError("<_InactiveRpcError of RPC that terminated with:\n"
                               "\tstatus = StatusCode.UNAVAILABLE\n\tdetails = \"refused\"\n>")


@pytest.mark.parametrize("gone", [True, False])
def test_a_file_whose_server_went_away_is_one_line_saying_to_run_again(
    gone: bool, tmp_path: Path, server: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    shard, landing = _shard(tmp_path)
    monkeypatch.setattr(local_session, "server_of", lambda session: server)
    if gone:
        os.kill(server.pid, 9)
        while not server.gone():
            time.sleep(0.01)
    with pytest.raises(IngestError) as info:
        ingest(shard, str(landing), IngestRequest(), engine=LazySparkEngine(Unanswered))
    if gone:
        assert str(info.value) == (
            f"1.jsonl: the local Spark server stopped during the run (pid {server.pid});"
            " run the command again: nothing of 1.jsonl was committed")
    else:  # a server still there: what the failure said
        assert str(info.value) == ("1.jsonl: Spark does not answer: the Spark Connect call"
                                   " failed: UNAVAILABLE: refused")
    assert shard.state().upper == 0


def test_a_server_gone_before_the_first_file_is_the_same_line(
    tmp_path: Path, server: LocalServer
) -> None:
    shard, landing = _shard(tmp_path)

    def attach() -> SparkSession:
        raise LocalServerStopped(server)

    with pytest.raises(IngestError, match=(
            rf"^1\.jsonl: the local Spark server stopped during the run \(pid {server.pid}\);"
            r" run the command again: nothing of 1\.jsonl was committed$")):
        ingest(shard, str(landing), IngestRequest(), engine=LazySparkEngine(attach))


def _stand_in() -> subprocess.Popen[bytes]:
    """A process standing for a server: its command line carries the server's name."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)",
                             local_spark.SERVER_MARK.decode()], start_new_session=True)
    deadline = time.monotonic() + 30
    while local_spark.SERVER_MARK not in Path(f"/proc/{proc.pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline  # its exec is under way
        time.sleep(0.01)
    return proc


def test_a_server_whose_stop_was_interrupted_is_replaced_not_attached_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``spark stop`` interrupted after it marked the record: the next command must not
    attach (it would take any failure for the server's end) but replace the server."""
    home = tmp_path / "home"
    directory = local_spark.state_dir(home)
    directory.mkdir(parents=True, mode=0o700)
    old, new = _stand_in(), _stand_in()
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        record = {"pid": old.pid, "port": port, "token": "t",
                  "code": local_spark.code_fingerprint(), local_spark.STOPPING: time.time()}
        (directory / "server.json").write_text(json.dumps(record))
        monkeypatch.setattr(local_spark, "start_connect_server",
                            lambda *_, **__: (new, "sc://127.0.0.1:1", 1))
        try:
            assert local_spark.status(home)["stopping"] is True  # `spark status` says so
            server = local_spark.ensure_server(home)
            assert server is not None and server.pid == new.pid and not server.gone()
            assert old.wait(30) is not None  # the old one was stopped
        finally:
            local_spark.stop(home)  # the stand-in and the watchdog started with it
            for proc in (old, new):
                proc.kill()
                proc.wait()


def test_a_record_whose_pid_was_reused_is_not_a_running_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``server.json`` left behind (a reboot, a killed server) whose pid now belongs to
    another process and whose port something else answers on: ``spark status`` said
    running, ``spark stop`` said it stopped it, and every ingest attached to the stranger
    and failed with "run the command again", forever. It is replaced instead, and the
    other process is never signalled."""
    home = tmp_path / "home"
    directory = local_spark.state_dir(home)
    directory.mkdir(parents=True, mode=0o700)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                                start_new_session=True)
    new = _stand_in()
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        record = {"pid": stranger.pid, "port": port, "token": "t",
                  "code": local_spark.code_fingerprint()}
        (directory / "server.json").write_text(json.dumps(record))
        monkeypatch.setattr(local_spark, "start_connect_server",
                            lambda *_, **__: (new, "sc://127.0.0.1:1", 1))
        try:
            assert local_spark.status(home)["running"] is False
            assert local_spark.stop(home) is False  # nothing of ours was running
            (directory / "server.json").write_text(json.dumps(record))
            server = local_spark.ensure_server(home)
            assert server is not None and server.pid == new.pid and not server.gone()
            assert stranger.poll() is None  # not ours: never signalled
        finally:
            local_spark.stop(home)
            for proc in (stranger, new):
                proc.kill()
                proc.wait()


@pytest.mark.parametrize("text", ['{"port": 5}', '{"pid": "abc", "port": 1}',
                                  '{"pid": 1, "port": null}'])
def test_a_malformed_record_is_no_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    """A ``server.json`` that parses but lacks a usable pid or port (edited by hand, a
    damaged disk) made ``spark status``, ``spark stop`` and every ingest fail with
    ``unexpected KeyError: 'pid'``, with no way out: it is no server, and the next
    command starts one in its place."""
    home = tmp_path / "home"
    directory = local_spark.state_dir(home)
    directory.mkdir(parents=True, mode=0o700)
    (directory / "server.json").write_text(text)
    new = _stand_in()
    monkeypatch.setattr(local_spark, "start_connect_server",
                        lambda *_, **__: (new, "sc://127.0.0.1:1", 1))
    try:
        assert local_spark.status(home)["running"] is False
        assert local_spark.stop(home) is False
        server = local_spark.ensure_server(home)
        assert server is not None and server.pid == new.pid
    finally:
        local_spark.stop(home)
        new.kill()
        new.wait()


def test_a_bad_idle_setting_starts_no_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``UPSERT_SPARK_IDLE_S`` was read only to start the watchdog, after the server was
    up: a bad value failed the command after the server's start (30 s) and left that
    server running with no watchdog, never stopped when idle. It is refused first."""
    home = tmp_path / "home"
    monkeypatch.setenv(local_spark.ENV_IDLE, "0")
    started: list[subprocess.Popen[bytes]] = []

    def start(*_: object, **__: object) -> tuple[subprocess.Popen[bytes], str, int]:
        started.append(_stand_in())
        return started[-1], "sc://127.0.0.1:1", 1

    monkeypatch.setattr(local_spark, "start_connect_server", start)
    try:
        with pytest.raises(ConfigError, match=r"UPSERT_SPARK_IDLE_S must be a number"):
            local_spark.ensure_server(home)
        assert started == []
    finally:
        for proc in started:
            proc.kill()
            proc.wait()


def test_a_server_whose_watchdog_is_gone_gets_a_new_one(tmp_path: Path) -> None:
    """The watchdog killed (the OOM killer, a kill of stray pythons): commands went on
    attaching to the server, which then never stopped when idle. The next command to
    attach starts a watchdog for it."""
    home = tmp_path / "home"
    directory = local_spark.state_dir(home)
    directory.mkdir(parents=True, mode=0o700)
    server_proc = _stand_in()
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        record = {"pid": server_proc.pid, "port": listening.getsockname()[1], "token": "t",
                  "code": local_spark.code_fingerprint(), "watchdog": 2 ** 22 + 1}
        (directory / "server.json").write_text(json.dumps(record))
        try:
            server = local_spark.ensure_server(home)
            assert server is not None and server.pid == server_proc.pid  # attached
            watchdog = json.loads((directory / "server.json").read_text())["watchdog"]
            deadline = time.monotonic() + 30  # its exec may still be under way
            while not local_spark._is_ours(watchdog, local_spark.WATCHDOG_MARK):
                assert watchdog != record["watchdog"] and time.monotonic() < deadline
                time.sleep(0.01)
        finally:
            local_spark.stop(home)  # the stand-in and the new watchdog
            server_proc.kill()
            server_proc.wait()
