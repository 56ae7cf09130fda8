"""A warm local Spark: one Spark Connect server per ``$UPSERT_HOME``, started by the
first Spark ingest (``upsertctl ingest``, a Dagster run) that needs one and reused by
every later command, stopped once it sat idle. This is the default on the embedded
defaults: without ``SPARK_REMOTE`` or ``SPARK_MASTER``, and unless
``UPSERT_SPARK_SERVER=off`` (a JVM per command, as before; the test suite's default).

Without it every ``upsertctl ingest`` and Dagster run on the embedded defaults started
its own JVM (10-40 s); with it the first one starts a Spark Connect server on
``local[*]`` and every later one attaches to it in about a second.

State lives in ``$UPSERT_HOME/spark/`` (mode 0700): ``server.json`` (0600: pid, port,
url, the access token, the code fingerprint, started, the watchdog's pid, and
``stopping`` once a stop began), ``lock``, ``last_used`` (its mtime), ``users/<pid>``,
the server's ``connect-server.log`` and the watchdog's ``watchdog.log``.

Invariants:

- At most one server per ``$UPSERT_HOME``: it is found or started under an exclusive
  lock of ``spark/lock``; a recorded server whose process is gone (or whose pid another
  process reused), whose port does not answer, or whose stop began and was interrupted
  is stopped (its process group, if still the server's) and replaced; ``spark status``
  and ``spark stop`` do not take such a record for a running server either.
- Loopback only, as ``connect_server`` starts it (127.0.0.1, UI off), and only for its
  user: it requires a random bearer token (Spark Connect's
  ``SPARK_CONNECT_AUTHENTICATE_TOKEN``, passed in the server's environment, never on a
  command line) that is kept in ``server.json``, readable by its owner only. Another
  local user can reach the port but not run anything on it. The token never appears in
  ``upsertctl spark status`` or in messages.
- Its Python workers run the interpreter and import the checkout that started it. A
  command whose code differs (another interpreter, a changed source file under the
  checkout's packages: :func:`code_fingerprint`) never runs on an older server: it
  replaces the server when no other command uses it, else runs on a JVM of its own.
- Every command that uses it touches ``last_used`` and registers its process in
  ``spark/users/<pid>``; a command that runs on a JVM of its own touches neither
  (:func:`ensure_server` gives it None). A watchdog process started with the server
  stops it (TERM, then KILL, its own process group only) once no registered process is
  alive and ``last_used`` is older than ``UPSERT_SPARK_IDLE_S`` (default 1800 s), so a
  job that runs longer than that is never stopped under it; it exits when the server is
  gone; a command attaching to a server whose watchdog is gone (killed) starts a new
  one. Its checks are repeated under ``spark/lock``, the lock a command attaches under,
  right before the stop (:func:`stop_if_idle`): an attach and an idle stop are
  serialized, and a command that attached meanwhile keeps its server.
- ``upsertctl spark status`` reports it without starting anything; ``upsertctl spark
  stop`` stops it and its watchdog (a no-op when none runs), as a replacement does
  (the CLI names the commands that were using it: :func:`users`). A recorded pid is
  signalled only while its command line is still the server's or the watchdog's (never
  a process that reused the pid).
- Every stop (``upsertctl spark stop``, the watchdog, a replacement) first records
  ``stopping`` in ``server.json``, under the lock: a command attached to the server
  (:class:`LocalServer`) takes a failure after that, or after the server's process is
  gone (a SIGKILL, a crash), for the server's end, gives up at once instead of retrying,
  and fails its file with one line saying to run the command again
  (``resources.local_session``, ``resources.engines``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resources import spark_session
from resources.connect_server import answers, start_connect_server
from upsert_core.errors import ConfigError, IngestError, UpsertPlatformError
from upsert_core.stores import upsert_home

ENV_SERVER = "UPSERT_SPARK_SERVER"
ENV_IDLE = "UPSERT_SPARK_IDLE_S"
ENV_TOKEN = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
DEFAULT_IDLE_S = 1800.0
WATCH_INTERVAL_S = 5.0
SERVER_MASTER = "local[*]"
#: The checkout's packages whose code the server's Python workers import.
CODE_PACKAGES = ("upsert_core", "resources", "assets", "orchestration")


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether commands use the local server: ``UPSERT_SPARK_SERVER`` unset or ``auto``
    (the default), and neither ``SPARK_REMOTE`` nor ``SPARK_MASTER`` chooses another
    Spark; ``off``: a JVM per command."""
    env = os.environ if env is None else env
    text = env.get(ENV_SERVER, "").strip().lower()
    if text not in ("", "auto", "off"):
        raise ConfigError(f"{ENV_SERVER}={text!r}: use auto (the default: a warm local Spark"
                          " Connect server) or off (a Spark JVM per command)")
    return text != "off" and not env.get("SPARK_REMOTE") and not env.get("SPARK_MASTER")


def idle_seconds(env: Mapping[str, str] | None = None) -> float:
    env = os.environ if env is None else env
    text = env.get(ENV_IDLE, "").strip()
    if not text:
        return DEFAULT_IDLE_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(f"{ENV_IDLE} must be a number of seconds > 0, got {text!r}")
    return value


def state_dir(home: Path | None = None) -> Path:
    return (home or upsert_home()) / "spark"


def code_fingerprint() -> str:
    """What a server's Python workers would run: this interpreter, pyspark's version and
    the checkout's source files (names, sizes, mtimes; a few ms)."""
    import pyspark

    root = spark_session.REPO_ROOT
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{sys.executable}\0{pyspark.__version__}\0{root}\0".encode())
    for package in CODE_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            st = path.stat()
            digest.update(f"{path.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\0"
                          .encode())
    return digest.hexdigest()


def _private_dir(directory: Path) -> None:
    """``directory``, created if need be, readable by its owner only: this user (another
    user's server is never used, nor its directory taken over)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = directory.stat()
    if info.st_uid != os.getuid():
        raise ConfigError(
            f"{directory} belongs to another user (uid {info.st_uid}): the warm local Spark"
            " server of this UPSERT_HOME is theirs; set UPSERT_HOME to a directory of your"
            f" own, or {ENV_SERVER}=off for a Spark JVM per command")
    if info.st_mode & 0o077:
        directory.chmod(0o700)


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    _private_dir(directory)
    with (directory / "lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _record(directory: Path) -> dict[str, Any] | None:
    """``server.json``, or None when there is none or it names no server (not JSON, no
    integer pid and port: edited by hand, damaged), which the next command replaces."""
    try:
        data = json.loads((directory / "server.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    valid = all(isinstance(data.get(key), int) for key in ("pid", "port"))
    return data if valid else None


def _write_record(directory: Path, record: dict[str, Any]) -> None:
    """``server.json``, mode 0600 (it holds the token), replaced whole."""
    temporary = directory / "server.json.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)
        json.dump(record, out)
    os.replace(temporary, directory / "server.json")


def attach_url(record: Mapping[str, Any]) -> str:
    """The URL a session attaches with: ``localhost`` (gRPC's local credentials, which
    Spark Connect needs for a token without TLS) and the token."""
    return f"sc://localhost:{int(record['port'])}/;token={record['token']}"


@dataclass(frozen=True)
class LocalServer:
    """A command's attachment to this home's server (what :func:`ensure_server` gives):
    its state directory, its pid, and the URL to attach with (it holds the token: kept
    out of ``repr``, never printed)."""

    directory: Path
    pid: int
    url: str = field(repr=False)

    def gone(self) -> bool:
        """Whether it stopped or is being stopped: its process is gone (or a zombie), or
        its record no longer names it (stopped, replaced) or says that a stop began."""
        if not (_alive(self.pid) and _is_ours(self.pid, SERVER_MARK)):
            return True
        record = _record(self.directory)
        return not record or record.get("pid") != self.pid or STOPPING in record

    def note_use(self) -> None:
        """Mark it used now (each file a command runs on it), so a long run is never
        taken for idle."""
        touch(self.directory)

    def stopped_error(self, file_name: str) -> IngestError:
        """The one line for a file whose run it left: nothing of the file was committed
        (a commit follows the file's Spark step), so running the command again is safe."""
        return IngestError(
            f"{file_name}: the local Spark server stopped during the run (pid {self.pid});"
            f" run the command again: nothing of {file_name} was committed")


class LocalServerStopped(UpsertPlatformError):
    """The server went away while a command attached to it (before it ran a file)."""

    def __init__(self, server: LocalServer) -> None:
        super().__init__(f"the local Spark server stopped (pid {server.pid})")
        self.server = server


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _running(record: dict[str, Any] | None) -> bool:
    """Whether ``record``'s server runs: its process is still the server (not a process
    that reused its pid, e.g. after a reboot) and its port answers."""
    if not record:
        return False
    pid = int(record["pid"])
    return _alive(pid) and _is_ours(pid, SERVER_MARK) and answers(int(record["port"]))


def touch(directory: Path) -> None:
    (directory / "last_used").touch()


def _register_user(directory: Path) -> None:
    """Mark this process as using the server until it exits."""
    users = directory / "users"
    users.mkdir(parents=True, exist_ok=True)
    (users / str(os.getpid())).touch()


def _in_use(directory: Path) -> bool:
    """Whether a process that uses the server is alive (stale marks are removed)."""
    users = directory / "users"
    busy = False
    for mark in users.glob("*") if users.exists() else ():
        if mark.name.isdigit() and int(mark.name) != os.getpid() and _alive(int(mark.name)):
            busy = True
        else:
            mark.unlink(missing_ok=True)
    return busy


def users(home: Path | None = None) -> list[int]:
    """The pids of the commands using this home's server now (changes nothing)."""
    marks = state_dir(home) / "users"
    found = marks.glob("*") if marks.is_dir() else ()
    return sorted(int(m.name) for m in found if m.name.isdigit() and _alive(int(m.name)))


def ensure_server(home: Path | None = None, *, timeout_s: float = 120.0
                  ) -> LocalServer | None:
    """This home's server to attach to (its URL has the token), started if none runs;
    None when a server of other code is in use by another command: the caller then runs
    on a JVM of its own (module docstring) and leaves the server's ``last_used`` alone."""
    directory = state_dir(home)
    code = code_fingerprint()
    idle_s = idle_seconds()  # a bad setting refused before a server starts without a watchdog
    with _locked(directory):
        record = _record(directory)
        # A record still saying "stopping" is a stop that was interrupted (its commands
        # would take every failure for the server's end): replaced, never attached to.
        if record and _running(record) and STOPPING not in record:
            if record.get("code") == code and record.get("token"):
                if not _watched(record):  # its watchdog was killed: it would never stop
                    record = {**record, "watchdog": _start_watchdog(directory, idle_s)}
                    _write_record(directory, record)
                touch(directory)
                _register_user(directory)
                return LocalServer(directory, int(record["pid"]), attach_url(record))
            if _in_use(directory):
                sys.stderr.write(
                    "spark: the local Spark Connect server runs other code (the checkout"
                    " changed since it started) and is in use; this command starts a Spark"
                    " JVM of its own\n")
                return None
        if record:
            _stop_server(directory, record)
        token = secrets.token_urlsafe(32)
        proc, url, port = start_connect_server(
            SERVER_MASTER, log=directory / "connect-server.log",
            name="upsert-local-spark", timeout_s=timeout_s, env={ENV_TOKEN: token},
        )
        record = {"pid": proc.pid, "port": port, "url": url, "token": token, "code": code,
                  "started": time.time()}
        _write_record(directory, record)
        touch(directory)
        _register_user(directory)
        # stopped with the server (stop, a replacement)
        record["watchdog"] = _start_watchdog(directory, idle_s)
        _write_record(directory, record)
        return LocalServer(directory, proc.pid, attach_url(record))


def _start_watchdog(directory: Path, idle_s: float) -> int:
    """Start the watchdog of this home's server (:func:`watch`); its pid."""
    with (directory / "watchdog.log").open("ab") as log:
        watchdog = subprocess.Popen(
            [sys.executable, "-m", "resources.local_spark", "watch", str(directory),
             str(idle_s)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return watchdog.pid


def _watched(record: Mapping[str, Any]) -> bool:
    """Whether the watchdog ``record`` names still runs."""
    watchdog = record.get("watchdog")
    return isinstance(watchdog, int) and _alive(watchdog) and _is_ours(watchdog,
                                                                        WATCHDOG_MARK)


def status(home: Path | None = None) -> dict[str, Any]:
    """What runs for this home (starts nothing, creates nothing; never the token)."""
    directory = state_dir(home)
    record = _record(directory)
    running = _running(record)
    used = directory / "last_used"
    return {
        "running": running,
        "url": record.get("url") if running and record else None,
        "pid": record.get("pid") if running and record else None,
        "runs_this_code": (record.get("code") == code_fingerprint()) if running and record
        else None,
        # a stop began (and, if it still runs, was interrupted: the next command replaces it)
        "stopping": bool(running and record and STOPPING in record),
        "idle_s": round(time.time() - used.stat().st_mtime, 1) if running and used.exists()
        else None,
        "stops_after_idle_s": idle_seconds(),
        "enabled": enabled(),
        "state": str(directory),
    }


def stop(home: Path | None = None) -> bool:
    """Stop this home's server; whether one was running (creates nothing)."""
    directory = state_dir(home)
    if not (directory / "server.json").exists():
        return False
    with _locked(directory):
        record = _record(directory)
        if not record:
            return False
        was = _running(record)
        _stop_server(directory, record)
        (directory / "server.json").unlink(missing_ok=True)
        return was


SERVER_MARK = b"upsert-local-spark"
WATCHDOG_MARK = b"resources.local_spark"
#: In ``server.json`` from the moment a stop begins: commands attached to the server
#: then know their failures are its stop (:meth:`LocalServer.gone`).
STOPPING = "stopping"


def _is_ours(pid: int, mark: bytes) -> bool:
    """Whether ``pid`` is still the recorded process (its command line has ``mark``), not
    a process that reused its pid; without ``/proc``, assumed so."""
    if not Path("/proc").is_dir():
        return True
    try:
        return mark in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _mark_stopping(directory: Path, record: Mapping[str, Any]) -> None:
    """Record that the server of ``record`` is being stopped (under the lock)."""
    _write_record(directory, {**record, STOPPING: time.time()})


def _stop_server(directory: Path, record: Mapping[str, Any]) -> None:
    """Stop a recorded server and its watchdog (not when called by the watchdog)."""
    _mark_stopping(directory, record)
    if _is_ours(int(record["pid"]), SERVER_MARK):
        _stop_pid(int(record["pid"]))
    watchdog = record.get("watchdog")
    if isinstance(watchdog, int) and watchdog != os.getpid() and _is_ours(watchdog,
                                                                         WATCHDOG_MARK):
        _stop_pid(watchdog)


def _stop_pid(pid: int) -> None:
    """TERM the process group led by ``pid``, then KILL it if it lingers."""
    for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not _alive(pid):
                return
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # reap it when it is our child
            time.sleep(0.2)


def watch(directory: Path, idle_s: float) -> int:
    """The watchdog: stop the server once idle for ``idle_s``; exit when it is gone (or
    replaced: the new one has a watchdog of its own)."""
    server: int | None = None
    while True:
        time.sleep(min(WATCH_INTERVAL_S, idle_s / 4))
        record = _record(directory)
        if not record or not _alive(int(record["pid"])) or server not in (None, record["pid"]):
            return 0
        server = record["pid"]
        if stop_if_idle(directory, record, idle_s):
            return 0


def stop_if_idle(directory: Path, record: Mapping[str, Any], idle_s: float,
                 now: Callable[[], float] = time.time) -> bool:
    """The watchdog's decision: stop the server of ``record`` if no command uses it and
    none has for ``idle_s``; whether it stopped it."""
    if not _idle(directory, idle_s, now):
        return False
    with _locked(directory):
        # SUBTLE: a command attaches under this lock (ensure_server registers it and
        # touches last_used), so the checks above may be stale by now: one that attached
        # since then must keep its server. Repeated here, they serialize the two.
        current = _record(directory)
        if not current or current.get("pid") != record.get("pid"):
            return False  # stopped or replaced meanwhile: not ours to stop
        if not _idle(directory, idle_s, now):
            return False
        _mark_stopping(directory, current)
        _stop_pid(int(record["pid"]))
        (directory / "server.json").unlink(missing_ok=True)
        return True


def _idle(directory: Path, idle_s: float, now: Callable[[], float]) -> bool:
    """No command uses the server and none has for ``idle_s``; a command still running on
    it touches ``last_used`` (however long it runs, the idle time starts when it ends)."""
    if _in_use(directory):
        touch(directory)
        return False
    used = directory / "last_used"
    return now() - (used.stat().st_mtime if used.exists() else 0.0) > idle_s


if __name__ == "__main__":  # python -m resources.local_spark watch DIR IDLE_S
    if len(sys.argv) == 4 and sys.argv[1] == "watch":
        sys.exit(watch(Path(sys.argv[2]), float(sys.argv[3])))
    sys.exit(2)
