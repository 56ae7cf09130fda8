"""The warm process behind :mod:`orchestration.cli.warm.client`: it imports what commands need
once, then forks a child per command (``python -m orchestration.cli.warm.server DIR KEY``).

Invariants (beside those of :mod:`orchestration.cli.warm.client`):

- One warm process per socket: it binds ``DIR/KEY.sock`` only while it holds an
  exclusive lock of ``DIR/KEY.lock``, taken before its imports (a second one exits at
  once, having imported nothing heavy), and exits when the fingerprint of what it
  imported differs from ``KEY`` (a file changed while it started).
- It forks only while no Python thread but its own runs (checked after the imports;
  otherwise it exits and commands run in their own processes): a child starts from the
  imported modules and nothing else, as a fresh process would after its imports. The
  native threads the imports start (OpenBLAS's pool, jemalloc's background purging)
  handle a fork themselves (``pthread_atfork``), as with ``multiprocessing``'s fork.
- A request is read as it arrives, alongside everything else, and refused after
  ``REQUEST_TIMEOUT_S`` unless whole: a connection that sends nothing holds up no
  other command.
- A child closes everything of the warm process (listening socket, lock, other
  commands' connections and the streams of requests still coming, both ends of the
  wake-up pipe), takes the command's directory,
  umask and environment (failing that it reports ``refused``, having written nothing
  to the command's streams: the command runs itself), then its standard streams,
  restores the default signal handling, reports its pid, runs ``upsertctl`` and reports
  its exit status before it exits. The warm process reaps every child and then reports
  how it ended (``reaped``: the command returns only then); it kills a child whose
  command's connection closed before the child ended (the command was killed). Bytes a
  command sends after its request are read and ignored.
- It exits after ``UPSERT_LOCAL_SERVER_IDLE_S`` without a command, on SIGTERM, or when its
  socket file was removed or replaced; children still running finish and report on
  their own.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import io
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, NoReturn

from orchestration.cli.warm.client import _LENGTH, fingerprint, idle_seconds, send_message

PRELOAD = (
    "numpy", "pyarrow", "pyarrow.compute", "pyarrow.csv", "pyarrow.json", "pyarrow.ipc",
    "pyarrow.parquet", "pyarrow.fs", "sqlite3", "xxhash",
    "orchestration.cli.main", "orchestration.cli.commands", "orchestration.cli.ingest",
    "orchestration.cli.output", "orchestration.cli.progress", "orchestration.cli.config",
    "resources.engines", "upsert_core.ingest", "upsert_core.ingest.engine",
    "upsert_core.ingest.first_file", "upsert_core.ingest.maintenance",
    "upsert_core.ingest.verify", "upsert_core.persist.shard", "upsert_core.persist.keys",
    "upsert_core.persist.state.commit_times", "upsert_core.persist.location.urls",
    "upsert_core.shard_table", "upsert_core.shard_summary", "upsert_core.landing",
    "upsert_core.row_view",
    # The Spark engine's driver side (the default engine): pyspark's Connect client,
    # about half a second of imports. No channel or session is made here: a child makes
    # its own after the fork.
    "pyspark.sql.connect.session", "resources.local_session", "resources.local_spark",
    "resources.spark_ingest", "resources.spark_group", "resources.spark_split",
)
"""Modules a command of the embedded defaults imports (a missing one is a test failure,
``tests/e2e/test_cli_warm.py``); anything else a command needs it imports itself."""

MAX_REQUEST_BYTES = 64 << 20
MAX_LOG_BYTES = 1 << 20
REQUEST_TIMEOUT_S = 10.0
TICK_S = 5.0


def preload() -> None:
    """Import :data:`PRELOAD` with the settings ``upsertctl`` runs with
    (``upsert_core.arrow_startup``)."""
    from upsert_core.arrow_startup import (  # heavy: pyarrow, once per warm process
        defer_pandas,
        keep_freed_memory,
        prefer_jemalloc,
    )

    keep_freed_memory()
    prefer_jemalloc()
    defer_pandas()
    for name in PRELOAD:
        importlib.import_module(name)


class _Request:
    """A connection whose request is still coming: read as it arrives, never waited for
    (a command stopped between its connect and its request holds up no other)."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.fds: list[int] = []
        self.length: int | None = None
        self.parts: list[bytes] = []
        self.received = 0

    def read(self, conn: socket.socket) -> bytes | None:
        """What arrived so far on the non-blocking ``conn``: the request once whole, else
        None; ValueError or OSError for a request refused."""
        try:
            if self.length is None:
                head, fds, _, _ = socket.recv_fds(conn, _LENGTH.size, 3)
                self.fds = list(fds)
                if len(head) != _LENGTH.size or len(fds) != 3:
                    raise ValueError("a request without its length and three streams")
                (self.length,) = _LENGTH.unpack(head)
                if self.length > MAX_REQUEST_BYTES:
                    raise ValueError(f"a request of {self.length} bytes")
            while self.received < self.length:
                chunk = conn.recv(min(self.length - self.received, 1 << 20))
                if not chunk:
                    raise ValueError("a request cut short")
                self.parts.append(chunk)
                self.received += len(chunk)
        except BlockingIOError:
            return None
        return b"".join(self.parts)

    def close_fds(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


class _Server:
    def __init__(self, directory: Path, key: str, listener: socket.socket,
                 lock: Any, wake_read: int, wake_write: int) -> None:
        self.directory = directory
        self.key = key
        self.listener = listener
        self.lock = lock
        self.wake_read = wake_read
        self.wake_write = wake_write
        self.socket_inode = os.stat(directory / f"{key}.sock").st_ino
        self.children: dict[int, socket.socket] = {}
        self.requests: dict[socket.socket, _Request] = {}
        self.killed: set[int] = set()
        self.last_active = time.monotonic()
        self.idle_s = idle_seconds()
        self.stopping = False

    def serve(self) -> None:
        while not self.stopping:
            self._expire_requests()
            watched: list[Any] = [self.listener, self.wake_read, *self.requests, *(
                conn for pid, conn in self.children.items() if pid not in self.killed)]
            ready, _, _ = select.select(watched, [], [], self._timeout())
            self._reap()
            for item in ready:
                if item is self.listener:
                    self._accept()
                elif item == self.wake_read:
                    _drain(self.wake_read)
                elif item in self.requests:
                    self._read_request(item)
                elif isinstance(item, socket.socket):
                    self._check_command(item)
            if self.children or self.requests:
                self.last_active = time.monotonic()
            elif time.monotonic() - self.last_active > self.idle_s or not self._socket_ours():
                break

    def _timeout(self) -> float:
        timeout = min(TICK_S, self.idle_s)
        if self.requests:
            first = min(request.deadline for request in self.requests.values())
            timeout = min(timeout, max(0.0, first - time.monotonic()))
        return timeout

    def _socket_ours(self) -> bool:
        try:
            return os.stat(self.directory / f"{self.key}.sock").st_ino == self.socket_inode
        except OSError:
            return False

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        self.last_active = time.monotonic()
        try:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            if int.from_bytes(creds[4:8], sys.byteorder) != os.getuid():
                conn.close()
                return
            conn.setblocking(False)
        except OSError:
            conn.close()
            return
        self.requests[conn] = _Request(time.monotonic() + REQUEST_TIMEOUT_S)
        self._read_request(conn)  # usually all there already

    def _refuse(self, conn: socket.socket, why: str) -> None:
        log(f"refused a request: {why}")
        self.requests.pop(conn).close_fds()
        conn.close()

    def _expire_requests(self) -> None:
        now = time.monotonic()
        for conn, request in list(self.requests.items()):
            if now >= request.deadline:
                self._refuse(conn, "timed out")

    def _read_request(self, conn: socket.socket) -> None:
        request = self.requests[conn]
        try:
            body = request.read(conn)
            if body is None:
                return
            command = json.loads(body)
            if command.get("key") != self.key:
                raise ValueError("a request for another fingerprint")
            conn.setblocking(True)
        except (OSError, ValueError) as exc:
            self._refuse(conn, str(exc))
            return
        del self.requests[conn]
        pid = os.fork()
        if pid == 0:
            _child(self, conn, request.fds, command)
        request.close_fds()
        self.children[pid] = conn
        log(f"pid {pid} runs a command")

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            self.killed.discard(pid)
            if conn is None:
                continue
            try:
                if os.WIFSIGNALED(status):
                    send_message(conn, {"signal": os.WTERMSIG(status), "reaped": True})
                else:
                    send_message(conn, {"exit": os.waitstatus_to_exitcode(status),
                                        "reaped": True})
            except OSError:
                pass  # the command already has the child's own report, or is gone
            conn.close()

    def _check_command(self, conn: socket.socket) -> None:
        """A command's connection is readable once it closed: the command is gone
        (killed), so its child goes too. A command sends nothing after its request;
        bytes that come anyway are read and dropped (left there, select() would return
        at once, again and again)."""
        try:
            data = conn.recv(1 << 16, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            return
        for pid, child_conn in list(self.children.items()):
            if child_conn is conn:
                self.killed.add(pid)
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


def log(message: str) -> None:
    """One line on the warm process's stderr (its log file, emptied past
    :data:`MAX_LOG_BYTES`); never names a command's arguments (they may hold secrets)."""
    try:
        if os.fstat(2).st_size > MAX_LOG_BYTES:
            os.ftruncate(2, 0)
        sys.stderr.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} warm upsertctl"
                         f" (pid {os.getpid()}): {message}\n")
        sys.stderr.flush()
    except OSError:
        pass


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _child(server: _Server, conn: socket.socket, fds: list[int],
           request: dict[str, Any]) -> NoReturn:
    """The command's process (module docstring); never returns."""
    try:
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        server.listener.close()
        server.lock.close()
        os.close(server.wake_read)
        os.close(server.wake_write)
        for other in server.children.values():
            other.close()
        for other, pending in server.requests.items():  # other commands' streams too
            other.close()
            pending.close_fds()
        os.chdir(request["cwd"])
        os.umask(int(request["umask"]))
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = list(request["argv"])
    except BaseException as exc:  # noqa: BLE001 - nothing ran: the command runs itself
        log(f"a child could not take a command: {type(exc).__name__}")  # still our log
        with contextlib.suppress(OSError):
            send_message(conn, {"refused": type(exc).__name__})
        os._exit(1)
    status = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        _standard_streams()
        send_message(conn, {"pid": os.getpid()})
        from orchestration.cli.main import run_command  # heavy: preloaded; after the fork

        status = run_command(sys.argv[1:])
    except SystemExit as exc:  # ``--help``: as the interpreter ends a process for it
        status = _exit_status(exc.code)
    except KeyboardInterrupt:
        # Ctrl-C before ``upsertctl`` catches it (right after the pid went out): as
        # Python ends a process for an uncaught KeyboardInterrupt, a traceback, then
        # death by SIGINT (a process of its own has that moment too, in its imports).
        with contextlib.suppress(Exception):
            traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # noqa: BLE001 - a child reports every ending as a status
        try:
            traceback.print_exc()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - the status is reported whatever the streams do
        pass
    with contextlib.suppress(OSError):
        send_message(conn, {"exit": status})
    os._exit(status)


def _exit_status(code: object) -> int:
    """The status a process exits with for ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def _standard_streams() -> None:
    """New ``sys.stdin/stdout/stderr`` on fds 0-2 (now the command's), with the
    encodings this interpreter chose and the buffering a process of the command's own
    would have (line-buffered on a terminal; stderr always)."""
    def text(fd: int, old: io.TextIOWrapper, writing: bool, line: bool) -> io.TextIOWrapper:
        raw = io.FileIO(fd, "w" if writing else "r", closefd=False)
        buffered: Any = io.BufferedWriter(raw) if writing else io.BufferedReader(raw)
        return io.TextIOWrapper(buffered, encoding=old.encoding, errors=old.errors,
                                line_buffering=line)

    sys.stdin = sys.__stdin__ = text(0, sys.__stdin__, False, False)  # type: ignore[arg-type,misc]
    sys.stdout = sys.__stdout__ = text(1, sys.__stdout__, True, os.isatty(1))  # type: ignore[arg-type,misc]
    sys.stderr = sys.__stderr__ = text(2, sys.__stderr__, True, True)  # type: ignore[arg-type,misc]


def serve(directory: Path, key: str) -> int:
    """Start, serve until idle, exit (module docstring)."""
    # SUBTLE: the lock before the imports. Commands that start at once each start a
    # warm process (11 for 20 commands, measured); all but one leave here, before a
    # second or two of CPU each on imports they would throw away.
    lock = (directory / f"{key}.lock").open("a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another warm process has this fingerprint
    preload()
    if fingerprint() != key:
        log("the code or settings changed while it started; exiting")
        return 0
    if threading.active_count() != 1:
        log("a Python thread runs after the imports: cannot fork safely; exiting")
        return 0
    path = directory / f"{key}.sock"
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o600)
    listener.listen(64)
    listener.setblocking(False)
    with contextlib.suppress(FileNotFoundError):
        (directory / f"{key}.starting").unlink()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    server = _Server(directory, key, listener, lock, wake_read, wake_write)
    log(f"serving {path}")

    def stop(signum: int, frame: object) -> None:
        server.stopping = True

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve()
    finally:
        if server._socket_ours():
            path.unlink()
        listener.close()
        log("exiting")
    return 0


if __name__ == "__main__":
    sys.exit(serve(Path(sys.argv[1]), sys.argv[2]))
