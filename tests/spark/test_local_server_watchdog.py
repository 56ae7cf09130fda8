"""The watchdog's idle stop of the warm local Spark (``resources.local_spark``) and a
command attaching to the server are serialized by ``spark/lock``: a command that
attaches after the watchdog found the server idle, but before it stopped it, keeps its
server. Deterministic: a fake clock, and the attach run by a hook exactly where it would
win the race (it takes the lock before the watchdog does). The "server" is a ``sleep``
in a process group of its own, as the real one leads its own group; no JVM runs."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from resources import local_spark

IDLE_S = 60.0
NOW = 1_000_000.0  # the fake clock: the watchdog's now, an hour after the last use


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[Path, dict[str, object]]]:
    """A state directory whose record names a live stand-in server, last used long ago."""
    directory = local_spark.state_dir(tmp_path)
    directory.mkdir(mode=0o700)
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    record: dict[str, object] = {"pid": proc.pid, "port": 1, "token": "t", "code": "c"}
    (directory / "server.json").write_text(json.dumps(record))
    local_spark.touch(directory)
    os.utime(directory / "last_used", (NOW - 3600, NOW - 3600))
    try:
        yield directory, record
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def command() -> Iterator[subprocess.Popen[bytes]]:
    """Another process, standing for a command that uses the server."""
    proc = subprocess.Popen(["sleep", "300"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _attached_first(
    monkeypatch: pytest.MonkeyPatch, attach: object
) -> list[str]:
    """Make the lock's next taker find that ``attach()`` ran under it just before."""
    real = local_spark._locked
    ran: list[str] = []

    @contextmanager
    def locked(directory: Path) -> Iterator[None]:
        if not ran:
            with real(directory):  # the command wins the race for the lock
                attach()  # type: ignore[operator]
                ran.append("attached")
        with real(directory):
            yield

    monkeypatch.setattr(local_spark, "_locked", locked)
    return ran


def _alive(pid: int) -> bool:
    """Running: not gone, not a zombie (our child, unreaped until a stop reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("how", ["registers", "touches"])
def test_a_command_attaching_during_the_idle_stop_keeps_its_server(
    how: str, server: tuple[Path, dict[str, object]], command: subprocess.Popen[bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``registers``: a command that attaches (ensure_server marks ``users/<pid>``);
    ``touches``: one that only touches ``last_used`` (the run of a file). Either, done
    under the lock between the watchdog's idle check and its stop, keeps the server."""
    directory, record = server

    def attach() -> None:
        if how == "registers":
            (directory / "users").mkdir(exist_ok=True)
            (directory / "users" / str(command.pid)).touch()
        else:
            os.utime(directory / "last_used", (NOW, NOW))

    ran = _attached_first(monkeypatch, attach)
    stopped = local_spark.stop_if_idle(directory, record, IDLE_S, now=lambda: NOW)
    assert ran == ["attached"]  # the attach happened after the check that found it idle
    assert stopped is False
    assert _alive(int(record["pid"]))  # type: ignore[call-overload]
    assert (directory / "server.json").exists()


def test_an_idle_server_is_stopped(server: tuple[Path, dict[str, object]]) -> None:
    directory, record = server
    assert local_spark.stop_if_idle(directory, record, IDLE_S, now=lambda: NOW) is True
    assert not (directory / "server.json").exists()
    assert not _alive(int(record["pid"]))  # type: ignore[call-overload]


def test_a_used_server_is_not_stopped(
    server: tuple[Path, dict[str, object]], command: subprocess.Popen[bytes]
) -> None:
    directory, record = server
    (directory / "users").mkdir()
    (directory / "users" / str(command.pid)).touch()
    assert local_spark.stop_if_idle(directory, record, IDLE_S, now=lambda: NOW) is False
    assert _alive(int(record["pid"]))  # type: ignore[call-overload]
    # Ended commands' marks go; the server is idle again once it sat unused long enough.
    command.kill()
    command.wait()
    touched = (directory / "last_used").stat().st_mtime  # by the watchdog: it was in use
    assert local_spark.stop_if_idle(directory, record, IDLE_S,
                                    now=lambda: touched + IDLE_S / 2) is False
    assert local_spark.stop_if_idle(directory, record, IDLE_S,
                                    now=lambda: touched + 2 * IDLE_S) is True


def test_a_replaced_server_is_not_stopped_by_the_old_ones_watchdog(
    server: tuple[Path, dict[str, object]]
) -> None:
    directory, record = server
    assert local_spark.stop_if_idle(directory, {**record, "pid": 1}, IDLE_S,
                                    now=lambda: NOW) is False
    assert _alive(int(record["pid"]))  # type: ignore[call-overload]
