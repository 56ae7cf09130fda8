"""A warm ``upsertctl``: commands run in a fork of a process that has already imported
pyarrow, numpy and the platform, instead of importing them again.

A fresh ``upsertctl`` spends about 0.3-0.4 s of CPU importing before it does anything
(pyarrow and numpy 0.2-0.3 s, the platform 0.1 s), as much as a 100k-row batch at 1M
keys costs otherwise. The first command that finds no warm process starts one in the
background (:mod:`orchestration.cli.warm.server`) and runs itself as before; every later
command connects to it over a Unix socket, hands over its arguments, environment, working
directory, umask and its stdin/stdout/stderr, and the warm process forks a child that runs
the command exactly as ``upsertctl`` would (``orchestration.cli.main``), writing to the
command's own terminal or pipes. ``UPSERT_LOCAL_SERVER=off`` runs every command in its own
process (the test suite's default); ``UPSERT_LOCAL_SERVER_IDLE_S`` (default 900) is how
long a warm process waits for a command before it exits.

Invariants:

- A command behaves as in a process of its own: same arguments, environment (replaced
  whole in the child), working directory, umask, standard streams, exit status, and a
  child killed by a signal makes the command die of the same signal. SIGINT, SIGTERM,
  SIGHUP and SIGQUIT sent to the command are passed to the child (Ctrl-C interrupts it as
  before); if the command itself is killed (SIGKILL), the warm process kills the child.
- Only code and settings identical to the command's are used: the socket's name is a
  fingerprint (:func:`fingerprint`) of the interpreter, the checkout's source files (names,
  sizes, mtimes), the installed packages' directories, every environment variable read
  at interpreter start or at import (``PYTHON*``, ``LC_*``, ``LANG``, ``TZ``, ``LD_*``,
  ``MALLOC_*``, ``GLIBC_TUNABLES``, ``ARROW_*``, ``OMP_*``, ``NPY_*``, ``OPENBLAS_*``,
  ``GRPC_*``, ... :data:`_KEY_ENV_PREFIXES`), and what a fork inherits that a command
  cannot hand over (its priority, CPU affinity, resource limits, groups, cgroup and
  namespaces: ``nice``, ``taskset`` or ``ulimit`` before a command get a warm process
  started with them). A changed source file or an upgraded package names another
  socket: a new warm process starts and the old one exits when idle.
- Only this user: the sockets live in a directory of this user's with mode 0700
  (``$UPSERT_LOCAL_SERVER_DIR``, else ``$XDG_RUNTIME_DIR/upsertctl``, else
  ``/tmp/upsertctl-<uid>``), and the warm process serves only peers of its own uid.
- A command never runs twice: it runs in its own process instead only when no child
  started it (no warm process, a refused connection, a directory it cannot use, a closed
  standard stream or a working directory that no longer exists, a child that could not
  take it, a warm process that exited before a child reported its pid, which a child
  does before it runs anything). Once a child started it, the command waits until the
  child ended (reaped by the warm process: its pid is gone when the command returns,
  as a process of its own would be) and takes its exit status; if the warm side
  disappears without one, it fails with one line saying to run it again (every
  ``upsertctl`` command is safe to run again: ingests apply each file once).
- Ctrl-Z (SIGTSTP) stops the child with the command and ``fg``/``bg`` (SIGCONT)
  continue it. A SIGSTOP of the command itself cannot be caught: its child runs on. A
  signal the command ignores (``nohup``: SIGHUP) is not passed on.
- Nothing here imports pyarrow: the client costs a few milliseconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import signal
import socket
import struct
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

ENV_SWITCH = "UPSERT_LOCAL_SERVER"
ENV_IDLE = "UPSERT_LOCAL_SERVER_IDLE_S"
ENV_DIR = "UPSERT_LOCAL_SERVER_DIR"
DEFAULT_IDLE_S = 900.0
START_BACKOFF_S = 30.0
"""A command starts a warm process at most this often per fingerprint (one that cannot
start, e.g. an import error, is not retried by every command)."""

ROOT = Path(__file__).resolve().parents[2]
"""The directory holding the ``orchestration`` package this module was loaded from."""
CODE_PACKAGES = ("upsert_core", "resources", "assets", "orchestration")

_KEY_ENV_PREFIXES = (
    "PYTHON", "_PYTHON", "LC_", "LD_", "MALLOC_", "ARROW_", "PYARROW_", "OMP_", "NPY_",
    "NUMPY_", "JE_", "MIMALLOC_",
    # Native libraries read these as they load: BLAS thread pools, gRPC's core.
    "OPENBLAS_", "GOTO_", "MKL_", "GRPC_",
    # Read at import by protobuf (its backend), pandas (pulled in by pyspark), Py4J and
    # Python's ssl (pyarrow.fs asks it for the certificate paths).
    "PROTOCOL_BUFFERS_", "PANDAS_", "PY4J_", "SSL_CERT_",
)
_KEY_ENV_NAMES = (
    "LANG", "LANGUAGE", "TZ", "GLIBC_TUNABLES", "TEMPORARILY_DISABLE_PROTOBUF_VERSION_CHECK",
    # pyspark's Connect modules, at import.
    "SPARK_CONNECT_LOG_LEVEL", "PYSPARK_PIN_THREAD", "PYSPARK_ENABLE_NAMEDTUPLE_PATCH",
)
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
_LENGTH = struct.Struct("!Q")


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether commands use a warm process: ``UPSERT_LOCAL_SERVER`` unset, ``auto`` or
    ``on``; ``off`` (or anything else) runs each command in its own process."""
    env = os.environ if env is None else env
    return env.get(ENV_SWITCH, "auto").strip().lower() in ("", "auto", "on")


def idle_seconds(env: Mapping[str, str] | None = None) -> float:
    """``UPSERT_LOCAL_SERVER_IDLE_S`` (a bad value: the default)."""
    env = os.environ if env is None else env
    try:
        value = float(env.get(ENV_IDLE, "") or DEFAULT_IDLE_S)
    except ValueError:
        return DEFAULT_IDLE_S
    return value if value > 0 else DEFAULT_IDLE_S


def socket_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get(ENV_DIR):
        return Path(env[ENV_DIR]).absolute()
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "upsertctl"
    return Path("/tmp") / f"upsertctl-{os.getuid()}"


def private_dir(directory: Path) -> Path:
    """``directory``, created 0700 if need be; OSError when it is not this user's or is
    open to others (never used then: the sockets there would not be ours)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = directory.lstat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077 or not os.path.isdir(directory):
        raise PermissionError(f"{directory} is not a private directory of this user")
    return directory


def fingerprint(env: Mapping[str, str] | None = None) -> str:
    """What a warm process must share with a command to run it (module docstring)."""
    env = os.environ if env is None else env
    digest = hashlib.blake2b(digest_size=12)
    digest.update(f"{sys.executable}\0{sys.version}\0{sys.prefix}\0{ROOT}\0".encode())
    for name in sorted(env):
        if name.startswith(_KEY_ENV_PREFIXES) or name in _KEY_ENV_NAMES:
            digest.update(f"{name}={env[name]}\0".encode())
    for entry in sys.path[1:]:
        # Where packages are installed: an install or upgrade changes the directory.
        if entry.endswith("-packages"):
            try:
                digest.update(f"{entry}\0{os.stat(entry).st_mtime_ns}\0".encode())
            except OSError:
                continue
    digest.update(_inherited().encode())
    for package in CODE_PACKAGES:
        top = ROOT / package
        for folder, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    st = os.stat(path)
                    digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return digest.hexdigest()


def _inherited() -> str:
    """What a child inherits from the warm process that a command cannot hand over:
    priority, CPU affinity, resource limits, ids and groups, cgroup, namespaces."""
    parts: list[object] = [os.getuid(), os.geteuid(), os.getgid(), os.getegid(),
                           sorted(os.getgroups())]
    with contextlib.suppress(OSError):
        parts.append(os.getpriority(os.PRIO_PROCESS, 0))
    with contextlib.suppress(OSError, AttributeError):
        parts.append(sorted(os.sched_getaffinity(0)))
    for name in sorted(n for n in dir(resource) if n.startswith("RLIMIT_")):
        with contextlib.suppress(OSError, ValueError):
            parts.append((name, resource.getrlimit(getattr(resource, name))))
    for path in ("/proc/self/cgroup", "/proc/self/oom_score_adj"):
        with contextlib.suppress(OSError):
            parts.append(Path(path).read_text())
    for space in ("mnt", "pid", "net", "ipc", "uts", "user", "cgroup"):
        with contextlib.suppress(OSError):
            parts.append(os.readlink(f"/proc/self/ns/{space}"))
    return repr(parts)


def send_message(sock: socket.socket, message: Mapping[str, object]) -> None:
    sock.sendall(json.dumps(dict(message)).encode() + b"\n")


class _Forwarder:
    """Passes the forwarded signals to the child once its pid is known (a signal that
    arrives before is passed on as soon as it is)."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.pending: list[int] = []
        self.stop_pending = False
        self.previous: dict[int, object] = {}

    def install(self) -> None:
        handlers = {**dict.fromkeys(FORWARDED_SIGNALS, self._handle),
                    signal.SIGTSTP: self._stop, signal.SIGCONT: self._continue}
        for signum, handler in handlers.items():
            # SUBTLE: a signal ignored when the command started (``nohup`` ignores
            # SIGHUP; a script's background job SIGINT) stays ignored, as in a process of
            # its own: caught and passed on, it would kill the child.
            if signal.getsignal(signum) != signal.SIG_IGN:
                self.previous[signum] = signal.signal(signum, handler)

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.pid is None:
            self.pending.append(signum)
        else:
            _kill(self.pid, signum)

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        if self.pid is None:
            # SUBTLE: a child may be forking: stopped now, we would leave it running
            # while we are stopped. Stop once its pid is known (:func:`_wait`).
            self.stop_pending = True
        else:
            self.stop_now()

    def stop_now(self) -> None:
        """Ctrl-Z: stop the child, then this process as SIGTSTP would have."""
        self.stop_pending = False
        # SUBTLE: the child is in the warm process's session, an orphaned process group,
        # where the kernel discards SIGTSTP: only SIGSTOP stops it.
        if self.pid is not None:
            _kill(self.pid, signal.SIGSTOP)
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)
        # Here once continued, or at once where the kernel discarded the stop (this
        # process in an orphaned group): either way the child runs again with us.
        signal.signal(signal.SIGTSTP, self._stop)
        self._continue(signal.SIGCONT, None)

    def _continue(self, signum: int, frame: FrameType | None) -> None:
        if self.pid is not None:
            _kill(self.pid, signal.SIGCONT)

    def child_started(self, pid: int) -> None:
        self.pid = pid
        for signum in self.pending:
            _kill(pid, signum)
        self.pending.clear()


def _kill(pid: int, signum: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signum)


def run_warm(argv: list[str]) -> int | None:
    """Run ``upsertctl argv`` in a warm process; its exit status, or None when it must
    run in this process (nothing was handed over; a warm process may be starting)."""
    # Installed first: a signal from now on ends the command as it would have ended a
    # process of its own, whether or not a child started it by then.
    forwarder = _Forwarder()
    forwarder.install()
    try:
        sock = _hand_over(argv, forwarder)
        if sock is None:
            return _not_started(forwarder)
        return _wait(sock, forwarder)
    finally:
        forwarder.restore()


def _standard_streams_open() -> bool:
    """Whether descriptors 0, 1 and 2 are open."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            return False
    return True


def _hand_over(argv: list[str], forwarder: _Forwarder) -> socket.socket | None:
    """The connection to a warm process that has the whole request, or None when the
    command must run here."""
    # SUBTLE: a closed standard stream would be taken by the socket opened below (the
    # lowest free descriptor) and handed over as the child's stream: the child wrote
    # its output into the warm process's end of the connection. A process of its own
    # sees such a stream closed (``sys.stdout`` None): run here.
    if not _standard_streams_open():
        return None
    try:
        directory = private_dir(socket_dir())
        key = fingerprint()
        cwd = os.getcwd()  # FileNotFoundError where it was removed: run here, as before
    except OSError:
        return None
    path = directory / f"{key}.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        start_server(directory, key)
        return None
    if forwarder.pending:  # interrupted before anything was handed over
        sock.close()
        return None
    request = json.dumps({
        "argv": ["upsertctl", *argv], "env": dict(os.environ), "cwd": cwd,
        "umask": _umask(), "key": key,
    }).encode()
    try:
        socket.send_fds(sock, [_LENGTH.pack(len(request))], [0, 1, 2])
        sock.sendall(request)
    except OSError:
        # Not handed over whole: the warm process runs nothing it did not read whole.
        sock.close()
        return None
    return sock


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _wait(sock: socket.socket, forwarder: _Forwarder | None = None) -> int | None:
    """The command's exit status once its child ended; None when no child reported its
    pid (nothing ran: a child reports it before it runs anything).

    Messages: the child's ``pid`` before it runs the command, its ``exit`` after, or
    ``refused`` when it could not take the command; then the warm process's report of
    the reaped child (``reaped``, with ``exit`` or ``signal``). The child's own ``exit``
    counts only when the warm process went away before it reaped the child.
    """
    if forwarder is None:
        forwarder = _Forwarder()
        forwarder.install()
    reported: int | None = None
    buffer = b""
    try:
        while True:
            if forwarder.stop_pending and forwarder.pid is not None:
                forwarder.stop_now()
            # Until the child's pid comes, wake up to honour a Ctrl-Z that came first.
            sock.settimeout(0.2 if forwarder.pid is None else None)
            try:
                chunk = sock.recv(4096)
            except TimeoutError:
                if forwarder.stop_pending:
                    forwarder.stop_now()  # no child yet, after all: stop alone
                continue
            except ConnectionError:
                chunk = b""
            if not chunk:
                break
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                message = json.loads(line)
                if "pid" in message:
                    forwarder.child_started(int(message["pid"]))
                elif forwarder.pid is None and ("refused" in message or "reaped" in message):
                    return _not_started(forwarder)
                elif "reaped" in message and "signal" in message:
                    forwarder.restore()
                    return _die_of(int(message["signal"]))
                elif "reaped" in message:
                    return int(message["exit"])
                elif "exit" in message:
                    reported = int(message["exit"])
    finally:
        forwarder.restore()
        sock.close()
    if forwarder.pid is None:
        return _not_started(forwarder)
    if reported is not None:
        return reported
    sys.stderr.write(
        "upsertctl: error: the warm upsertctl process stopped during the command before it"
        " reported how it ended; run the command again (it is safe to: a file is applied"
        f" once), or set {ENV_SWITCH}=off to run commands in their own process\n")
    return 1


def _not_started(forwarder: _Forwarder) -> int | None:
    """No child started the command: None (run it here), unless a signal came meanwhile,
    which ends the command as it would have ended a process of its own."""
    if forwarder.stop_pending:
        forwarder.stop_now()
    forwarder.restore()
    if not forwarder.pending:
        return None
    signum = forwarder.pending[0]
    if signum == signal.SIGINT:
        sys.stderr.write("upsertctl: error: interrupted\n")
        return 130
    return _die_of(signum)


def _die_of(signum: int) -> int:
    """Die of ``signum`` as the child did (the exit status a shell would see); 128 +
    ``signum`` where that signal cannot end this process."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        time.sleep(0.5)
    except (OSError, ValueError):
        pass
    return 128 + signum


def start_server(directory: Path, key: str) -> None:
    """Start a warm process for ``key`` in the background, unless one started recently
    (:data:`START_BACKOFF_S`); never raises."""
    marker = directory / f"{key}.starting"
    try:
        if time.time() - marker.stat().st_mtime < START_BACKOFF_S:
            return
    except OSError:
        pass
    try:
        import subprocess  # heavy: only to start a warm process (a few ms)

        marker.touch()
        with open(directory / f"{key}.log", "ab") as log:
            subprocess.Popen(
                [sys.executable, "-m", "orchestration.cli.warm.server", str(directory), key],
                cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True, close_fds=True)
    except OSError:
        pass
