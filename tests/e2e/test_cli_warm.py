"""``upsertctl`` in a warm process (``orchestration.cli.warm``): the same outputs, exit
statuses and signals as a process of its own, never a command run twice, only code and
settings identical to the command's, and the warm process goes away when idle.

Each test has its own socket directory and starts its own warm process (the first
command starts it in the background and runs itself as before)."""

from __future__ import annotations

import importlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestration.cli.warm import client as warm
from orchestration.cli.warm.server import PRELOAD
from tests.e2e.helpers import Cli

OPTIONS = ("--key", "k", "--order", "o", "--engine", "local", "--no-progress")


def test_every_preloaded_module_imports() -> None:
    for name in PRELOAD:
        importlib.import_module(name)


def _cli(tmp_path: Path, **env: str) -> Cli:
    sockets = tmp_path / "warm"
    return Cli(tmp_path / "home", env={"UPSERT_LOCAL_SERVER": "auto",
                                       "UPSERT_LOCAL_SERVER_DIR": str(sockets), **env})


def _served(cli: Cli) -> int:
    """How many commands the warm process of ``cli`` ran (from its log)."""
    directory = Path(cli.env["UPSERT_LOCAL_SERVER_DIR"])
    return sum(log.read_text().count("runs a command") for log in directory.glob("*.log"))


def _wait_for_server(cli: Cli, timeout_s: float = 60.0) -> Path:
    directory = Path(cli.env["UPSERT_LOCAL_SERVER_DIR"])
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sockets = list(directory.glob("*.sock"))
        if sockets:
            return sockets[0]
        time.sleep(0.1)
    logs = "\n".join(p.read_text() for p in directory.glob("*.log"))
    raise AssertionError(f"no warm process started; logs:\n{logs}")


def _server_pid(cli: Cli) -> int:
    directory = Path(cli.env["UPSERT_LOCAL_SERVER_DIR"])
    for log in directory.glob("*.log"):
        found = re.findall(r"\(pid (\d+)\): serving", log.read_text())
        if found:
            return int(found[-1])
    raise AssertionError("no serving line in the log")


def _stop(cli: Cli) -> None:
    with_pid = _server_pid(cli)
    os.kill(with_pid, signal.SIGTERM)


def _landing(tmp_path: Path, name: str, rows: list[dict[str, object]]) -> Path:
    landing = tmp_path / "landing"
    landing.mkdir(exist_ok=True)
    (landing / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return landing


def test_commands_behave_as_in_their_own_process(tmp_path: Path) -> None:
    cli = _cli(tmp_path)
    cold = _cli(tmp_path, UPSERT_LOCAL_SERVER="off")
    landing = _landing(tmp_path, "a.jsonl", [{"k": 1, "o": 1, "v": "x"}, {"k": 2, "o": 1, "v": "é"},
                                             {"k": 1, "o": 2, "v": None}, {"o": 3}])
    cli.run("ingest", str(landing), "--shard", "s", *OPTIONS)
    _wait_for_server(cli)
    assert _served(cli) == 0  # the first command ran itself
    cold_home = Cli(tmp_path / "cold-home", env=cold.extra_env)
    cold_home.run("ingest", str(landing), "--shard", "s", *OPTIONS)
    _landing(tmp_path, "b.jsonl", [{"k": 3, "o": 1, "v": "y"}, {"k": 2, "o": 0, "v": "late"}])
    results = {}
    for name, runner in (("warm", cli), ("cold", cold_home)):
        results[name] = [
            runner.run("ingest", str(landing), "--shard", "s", *OPTIONS),
            runner.run("snapshot", "--shard", "s"),
            runner.run("snapshot", "--shard", "s", "--format", "csv"),
            runner.run("errors", "--shard", "s"),
            runner.run("inspect", "--shard", "s"),
            runner.run("snapshot", "--shard", "nope", rc=1),
            runner.run("snapshot", "--shard", "s", "--as-of", "x", rc=2),
            runner.run("--help"),
        ]
    assert _served(cli) == 8
    for warm_result, cold_result in zip(results["warm"], results["cold"], strict=True):
        assert warm_result.rc == cold_result.rc, (warm_result, cold_result)
        if warm_result.args[0] == "inspect":  # commit times differ
            assert warm_result.json().keys() == cold_result.json().keys()
            assert warm_result.json()["upper"] == cold_result.json()["upper"]
        elif warm_result.args[0] != "ingest":
            assert warm_result.out == cold_result.out.replace("cold-home", "home")
            assert warm_result.err == cold_result.err.replace("cold-home", "home")
    # Batch order scope (the default): the later file's row of key 2 wins.
    assert sorted(results["warm"][1].jsonl(), key=lambda r: r["k"]) == [
        {"k": 1, "o": 2, "v": None}, {"k": 2, "o": 0, "v": "late"}, {"k": 3, "o": 1, "v": "y"}]
    _stop(cli)


def test_relative_paths_umask_and_environment_are_the_commands(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    cli = _cli(tmp_path)
    cli = Cli(work / ".upsert", env=cli.extra_env, cwd=work)
    cli.env.pop("UPSERT_HOME")  # the default: ./.upsert of the working directory
    _landing(work, "a.jsonl", [{"k": 1, "o": 1, "v": "x"}])
    cli.run("ingest", "landing", "--shard", "s", *OPTIONS)
    _wait_for_server(cli)
    _landing(work, "b.jsonl", [{"k": 2, "o": 1, "v": "y"}])
    env_cli = Cli(work / ".upsert", env={**cli.extra_env, "UPSERT_HOME": "elsewhere"}, cwd=work)
    env_cli.env["UPSERT_HOME"] = "elsewhere"
    # Another UPSERT_HOME (relative, so under the working directory): another shard.
    env_cli.run("ingest", "landing", "--shard", "s", *OPTIONS)
    assert (work / "elsewhere" / "consensus.db").exists()
    old = os.umask(0o077)  # the command's umask, not the warm process's (0o022)
    try:
        cli.run("snapshot", "--shard", "s", "--out", "out.jsonl")
    finally:
        os.umask(old)
    out = work / "out.jsonl"
    assert out.stat().st_mode & 0o777 == 0o600
    assert [json.loads(line)["k"] for line in out.read_text().splitlines()] == [1]
    assert _served(cli) == 2
    _stop(cli)


def _big_landing(tmp_path: Path, rows: int) -> Path:
    landing = tmp_path / "landing"
    landing.mkdir(exist_ok=True)
    table = pa.table({"k": pa.array(range(rows), pa.int64()),
                      "o": pa.array([1] * rows, pa.int64()),
                      "v": pa.array([f"value {i:>40}" for i in range(rows)])})
    pq.write_table(table, landing / f"big-{rows}.parquet", row_group_size=rows // 8)
    return landing


def _start_warm_command(cli: Cli, *args: str) -> tuple[subprocess.Popen[str], int]:
    """A command handed to the warm process, and its child's pid (from the log)."""
    before = _served(cli)
    proc = cli.popen(*args)
    directory = Path(cli.env["UPSERT_LOCAL_SERVER_DIR"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pids = [int(p) for log in directory.glob("*.log")
                for p in re.findall(r"pid (\d+) runs a command", log.read_text())]
        if len(pids) > before:
            return proc, pids[-1]
        time.sleep(0.01)
    raise AssertionError("the command never reached the warm process")


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_ctrl_c_and_kill_reach_the_child(tmp_path: Path) -> None:
    cli = _cli(tmp_path)
    landing = _landing(tmp_path, "a.jsonl", [{"k": 1, "o": 1, "v": "x"}])
    cli.run("ingest", str(landing), "--shard", "s", *OPTIONS)
    _wait_for_server(cli)
    _big_landing(tmp_path, 1_000_000)
    proc, child = _start_warm_command(cli, "ingest", str(landing), "--shard", "s", *OPTIONS)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "upsertctl: error: interrupted"
    assert _gone(child)

    proc, child = _start_warm_command(cli, "ingest", str(landing), "--shard", "s", *OPTIONS)
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGTERM
    assert _gone(child)

    # The command killed outright: the warm process kills its child.
    proc, child = _start_warm_command(cli, "ingest", str(landing), "--shard", "s", *OPTIONS)
    time.sleep(0.2)
    proc.kill()
    proc.communicate(timeout=60)
    assert _gone(child)

    # Nothing was half applied: the file is ingested once, by the next command.
    done = cli.run("ingest", str(landing), "--shard", "s", *OPTIONS, "--json")
    assert sum(f["rows_read"] for f in done.json()["files"]) == 1_000_000
    again = cli.run("ingest", str(landing), "--shard", "s", *OPTIONS, "--json")
    assert again.json()["files"] == []
    rows = cli.run("snapshot", "--shard", "s", "--format", "csv").out.splitlines()
    assert len(rows) == 1_000_000 + 1  # the header; key 1 appears once
    _stop(cli)


def test_a_child_killed_by_a_signal_kills_the_command_with_it(tmp_path: Path) -> None:
    cli = _cli(tmp_path)
    landing = _landing(tmp_path, "a.jsonl", [{"k": 1, "o": 1, "v": "x"}])
    cli.run("ingest", str(landing), "--shard", "s", *OPTIONS)
    _wait_for_server(cli)
    _big_landing(tmp_path, 1_000_000)
    proc, child = _start_warm_command(cli, "ingest", str(landing), "--shard", "s", *OPTIONS)
    time.sleep(0.2)
    os.kill(child, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    _stop(cli)


def test_commands_at_once_and_a_server_that_goes_away(tmp_path: Path) -> None:
    cli = _cli(tmp_path, UPSERT_LOCAL_SERVER_IDLE_S="2")
    landing = _landing(tmp_path, "a.jsonl", [{"k": 1, "o": 1, "v": "x"}])
    cli.run("ingest", str(landing), "--shard", "s", *OPTIONS)
    socket_path = _wait_for_server(cli)
    procs = [cli.popen("snapshot", "--shard", "s") for _ in range(4)]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert [json.loads(line)["k"] for line in out.splitlines()] == [1]
    assert _served(cli) == 4
    # Idle past UPSERT_LOCAL_SERVER_IDLE_S: it exits and removes its socket.
    deadline = time.monotonic() + 30
    while socket_path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not socket_path.exists()
    # The next command runs itself (and starts a new warm process).
    assert [json.loads(line)["k"] for line in
            cli.run("snapshot", "--shard", "s").out.splitlines()] == [1]


def test_other_settings_or_code_name_another_warm_process(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    base = {"PATH": "/usr/bin", "HOME": "/h"}
    key = warm.fingerprint(base)
    assert warm.fingerprint({**base, "UPSERT_HOME": "/x", "AWS_REGION": "r"}) == key
    for name in ("PYTHONHASHSEED", "LC_ALL", "ARROW_DEFAULT_MEMORY_POOL", "TZ",
                 "MALLOC_ARENA_MAX", "OMP_NUM_THREADS", "PYTHONPATH"):
        assert warm.fingerprint({**base, name: "1"}) != key, name
    code = tmp_path / "checkout"
    for package in warm.CODE_PACKAGES:
        (code / package).mkdir(parents=True)
        (code / package / "__init__.py").write_text("")
    monkeypatch.setattr(warm, "ROOT", code)
    before = warm.fingerprint(base)
    (code / "upsert_core" / "__init__.py").write_text("# changed\n")
    assert warm.fingerprint(base) != before


def test_a_socket_directory_not_ours_runs_the_command_itself(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    cli = _cli(tmp_path)
    cli.env["UPSERT_LOCAL_SERVER_DIR"] = str(shared)
    landing = _landing(tmp_path, "a.jsonl", [{"k": 1, "o": 1, "v": "x"}])
    cli.run("ingest", str(landing), "--shard", "s", *OPTIONS)
    time.sleep(1.0)
    assert list(shared.iterdir()) == []  # nothing started there, nothing listens there
    assert cli.run("snapshot", "--shard", "s").jsonl() == [{"k": 1, "o": 1, "v": "x"}]
