"""The warm ``upsertctl`` (``orchestration.cli.warm``) against the ways a shell, a terminal or
a scheduler starts a command: closed standard streams, a deleted working directory,
Ctrl-Z, ``nice``/``ulimit``/``taskset``, and settings read when a module is imported.
Each case must end as a process of its own would, never run the command twice, and
never leave the warm process busy.

One shard and one warm process serve the module (tests that need another warm process
start it in a directory of their own)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestration.cli.warm import client as warm
from tests.e2e.helpers import CLI, REPO, Cli

OPTIONS = ("--key", "k", "--order", "o", "--engine", "local", "--no-progress")
ROWS = 200_000


@dataclass
class Warm:
    cli: Cli
    cold: Cli
    sockets: Path

    def log(self) -> str:
        return "".join(p.read_text() for p in self.sockets.glob("*.log"))

    def children(self) -> list[int]:
        return [int(p) for p in re.findall(r"pid (\d+) runs a command", self.log())]

    def server(self) -> int:
        return int(re.findall(r"\(pid (\d+)\): serving", self.log())[-1])

    def stop(self) -> None:
        """SIGTERM to every warm process started here."""
        for pid in {int(p) for p in re.findall(r"\(pid (\d+)\): serving", self.log())}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


def _wait_for_socket(sockets: Path, count: int = 1, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(list(sockets.glob("*.sock"))) >= count:
            return
        time.sleep(0.05)
    logs = "\n".join(p.read_text() for p in sockets.glob("*.log"))
    raise AssertionError(f"no warm process started; logs:\n{logs}")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Warm]:
    root = tmp_path_factory.mktemp("warm-fidelity")
    sockets = root / "warm"
    env = {"UPSERT_LOCAL_SERVER": "auto", "UPSERT_LOCAL_SERVER_DIR": str(sockets)}
    cli = Cli(root / "home", env=env)
    cold = Cli(root / "home", env={**env, "UPSERT_LOCAL_SERVER": "off"})
    landing = root / "landing"
    landing.mkdir()
    with (landing / "a.jsonl").open("w") as out:
        for k in range(ROWS):
            out.write(json.dumps({"k": k, "o": 1, "v": "x" * 20}) + "\n")
    cli.run("ingest", str(landing), "--shard", "s", *OPTIONS)  # starts the warm process
    _wait_for_socket(sockets)
    state = Warm(cli, cold, sockets)
    yield state
    state.stop()


def _start(state: Warm, args: list[str], **popen: object) -> tuple[subprocess.Popen[bytes], int]:
    """A command handed to the warm process, and its child's pid."""
    before = len(state.children())
    proc = subprocess.Popen([*CLI, *args], env=state.cli.env, cwd=REPO, **popen)  # type: ignore[call-overload]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        children = state.children()
        if len(children) > before:
            return proc, children[-1]
        time.sleep(0.005)
    proc.kill()
    raise AssertionError("the command never reached the warm process")


def _state(pid: int) -> str:
    """The process's state letter (R, S, T, Z, ...)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("closed", [0, 1, 2])
def test_a_closed_standard_stream_ends_as_in_a_process_of_its_own(served: Warm,
                                                                   closed: int) -> None:
    # SUBTLE: the socket a command opens takes the lowest free descriptor; with stdout
    # closed that was 1, so the command handed its own socket over as the child's
    # stdout, and the child's output went to the warm process, which spun on it.
    results = {}
    for name, cli in (("warm", served.cli), ("cold", served.cold)):
        before = len(served.children())
        proc = subprocess.run(
            ["sh", "-c", f'exec "$@" {closed}>&-', "sh", *CLI, "snapshot", "--shard", "s",
             "--format", "csv"],
            env=cli.env, cwd=REPO, capture_output=True, timeout=30)
        results[name] = (proc.returncode, proc.stdout, proc.stderr)
        if name == "cold":
            assert len(served.children()) == before
    assert results["warm"] == results["cold"]


def test_bytes_after_a_request_do_not_keep_the_warm_process_busy(served: Warm) -> None:
    """A peer that writes after its request (nothing of ours does) is read and ignored,
    not select()ed on in a loop."""
    key = next(served.sockets.glob("*.sock"))
    server = served.server()
    out_read, out_write = os.pipe()
    request = json.dumps({"argv": ["upsertctl", "snapshot", "--shard", "s"],
                          "env": served.cli.env, "cwd": str(REPO), "umask": 0o022,
                          "key": key.stem}).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(key))
        socket.send_fds(sock, [warm._LENGTH.pack(len(request))],
                        [0, out_write, sys.stderr.fileno()])
        os.close(out_write)
        sock.sendall(request)
        sock.recv(4096)  # the child's pid: it runs, blocked on its full stdout pipe
        sock.sendall(b"stray bytes\n")
        time.sleep(0.3)
        before = _cpu_s(server)
        time.sleep(1.5)
        spent = _cpu_s(server) - before
    os.close(out_read)
    assert spent < 0.3, f"the warm process spent {spent:.2f} s of CPU in 1.5 s"


def test_a_connection_that_sends_nothing_holds_up_no_other_command(served: Warm) -> None:
    """A command stopped (Ctrl-Z) or descheduled between its connect and its request
    must not make every other command wait for it."""
    key = next(served.sockets.glob("*.sock"))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.connect(str(key))
        time.sleep(0.2)  # accepted: the warm process waits for its request
        before = len(served.children())
        started = time.monotonic()
        served.cli.run("inspect", "--shard", "s")
        took = time.monotonic() - started
        assert len(served.children()) == before + 1  # run warm, not by itself
        assert took < 5.0, f"the command waited {took:.1f} s behind a silent connection"
        # The silent one is refused once its time is up, and nothing runs for it.
        silent.settimeout(30)
        assert silent.recv(4096) == b""
    assert len(served.children()) == before + 1


def test_a_child_holds_no_stream_of_a_request_still_coming(served: Warm) -> None:
    key = next(served.sockets.glob("*.sock"))
    theirs_read, theirs_write = os.pipe()  # the streams of a request whose body is late
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as late:
        late.connect(str(key))
        socket.send_fds(late, [warm._LENGTH.pack(100)], [theirs_write] * 3)
        time.sleep(0.2)
        proc, child = _start(served, ["snapshot", "--shard", "s"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
        try:
            time.sleep(0.5)
            held = {os.readlink(fd) for fd in Path(f"/proc/{child}/fd").iterdir()}
            assert os.readlink(f"/proc/self/fd/{theirs_write}") not in held
        finally:
            proc.kill()
            proc.communicate(timeout=60)
    os.close(theirs_read)
    os.close(theirs_write)


def test_a_deleted_working_directory_ends_as_in_a_process_of_its_own(served: Warm,
                                                                      tmp_path: Path) -> None:
    results = {}
    for name, cli in (("warm", served.cli), ("cold", served.cold)):
        gone = tmp_path / f"gone-{name}"
        gone.mkdir()
        proc = subprocess.run(
            ["sh", "-c", 'cd "$0" && rmdir "$0" && exec "$@"', str(gone), *CLI,
             "inspect", "--shard", "s"],
            env=cli.env, capture_output=True, timeout=60)
        results[name] = (proc.returncode, proc.stderr.decode())
    assert results["warm"] == results["cold"] == (0, "")


def test_a_command_returns_only_after_its_child_ended(served: Warm) -> None:
    """As with a process of its own, once the command returned its process is gone (a
    writer's pid checked right after, e.g. by ``gc``, is not running)."""
    for _ in range(5):
        before = len(served.children())
        served.cli.run("inspect", "--shard", "s")
        children = served.children()
        assert len(children) == before + 1
        assert _gone(children[-1]), f"child {children[-1]} still there ({_state(children[-1])})"


def test_a_child_that_cannot_take_the_command_runs_nothing(served: Warm) -> None:
    """A child that fails before it reports its pid (here: the working directory is
    gone) says so and writes nothing to the command's streams: the command runs
    itself."""
    key = next(served.sockets.glob("*.sock"))
    err_read, err_write = os.pipe()
    request = json.dumps({"argv": ["upsertctl", "inspect", "--shard", "s"],
                          "env": served.cli.env, "cwd": "/nonexistent/dir", "umask": 0o022,
                          "key": key.stem}).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(key))
        socket.send_fds(sock, [warm._LENGTH.pack(len(request))], [0, err_write, err_write])
        os.close(err_write)
        sock.sendall(request)
        replies = b""
        sock.settimeout(30)
        while chunk := sock.recv(4096):
            replies += chunk
    with os.fdopen(err_read, "rb") as streams:
        written = streams.read()
    messages = [json.loads(line) for line in replies.splitlines()]
    assert written == b""
    assert not any("pid" in m for m in messages), messages
    assert "refused" in messages[0], messages


@pytest.mark.parametrize(("messages", "expected"), [
    ([{"refused": "no such directory"}, {"exit": 1, "reaped": True}], None),
    ([{"exit": 1, "reaped": True}], None),  # died before it reported its pid
    ([{"pid": 1 << 30}, {"exit": 3}], 3),  # the warm process went away after the child
    ([{"pid": 1 << 30}, {"exit": 0}, {"exit": 4, "reaped": True}], 4),
])
def test_what_a_command_makes_of_the_replies(messages: list[dict[str, object]],
                                             expected: int | None) -> None:
    ours, theirs = socket.socketpair()
    with theirs:
        theirs.sendall(b"".join(json.dumps(m).encode() + b"\n" for m in messages))
    assert warm._wait(ours) == expected


def test_no_descriptor_of_the_warm_process_reaches_a_child(served: Warm) -> None:
    server = served.server()
    proc, child = _start(served, ["snapshot", "--shard", "s"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE)
    try:
        time.sleep(0.5)  # the child is blocked writing its stdout (we do not read it)

        def targets(pid: int) -> set[str]:
            fds = Path(f"/proc/{pid}/fd")
            return {os.readlink(fd) for fd in fds.iterdir()}

        # Shared by design: the command's connection (one of the warm process's sockets
        # other than the listening one, which the child must not hold).
        path = str(next(served.sockets.glob("*.sock")))
        listening = next(f"socket:[{fields[6]}]" for fields in (
            line.split() for line in Path("/proc/net/unix").read_text().splitlines()[1:])
            if fields[-1] == path and int(fields[3], 16) & 0x10000)  # __SO_ACCEPTCON
        connections = {t for t in targets(server) if t.startswith("socket:")} - {listening}
        assert targets(child) & (targets(server) - connections) == set()
        assert len(targets(child) & connections) == 1
    finally:
        proc.kill()
        proc.communicate(timeout=60)


def test_ctrl_z_stops_the_child_and_fg_continues_it(served: Warm) -> None:
    proc, child = _start(served, ["snapshot", "--shard", "s", "--format", "csv"],
                         stdout=subprocess.PIPE)
    try:
        proc.send_signal(signal.SIGTSTP)
        deadline = time.monotonic() + 10
        while _state(child) != "T" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (_state(proc.pid), _state(child)) == ("T", "T")
        proc.send_signal(signal.SIGCONT)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        assert len(out.splitlines()) == ROWS + 1
    finally:
        proc.kill()


def test_ctrl_c_as_soon_as_the_child_started_ends_as_in_a_process_of_its_own(
        served: Warm) -> None:
    """A SIGINT passed on the moment the child reported its pid lands before
    ``upsertctl`` catches it (a process of its own has that moment too, in its
    imports): the child dies of SIGINT as Python does for an uncaught
    KeyboardInterrupt, or exits 130 from ``upsertctl``'s handler; never exit 1."""
    key = next(served.sockets.glob("*.sock"))
    endings = []
    for _ in range(10):
        request = json.dumps({"argv": ["upsertctl", "inspect", "--shard", "s"],
                              "env": served.cli.env, "cwd": str(REPO), "umask": 0o022,
                              "key": key.stem}).encode()
        null = os.open(os.devnull, os.O_RDWR)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(key))
            socket.send_fds(sock, [warm._LENGTH.pack(len(request))], [null] * 3)
            os.close(null)
            sock.sendall(request)
            replies = b""
            sock.settimeout(30)
            while chunk := sock.recv(4096):
                if not replies:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(json.loads(chunk.split(b"\n")[0])["pid"], signal.SIGINT)
                replies += chunk
        final = json.loads(replies.splitlines()[-1])
        assert final.get("reaped"), replies
        endings.append(final.get("signal") or final.get("exit"))
    assert set(endings) <= {signal.SIGINT, 130, 0}, endings


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGINT])
def test_a_signal_the_command_ignores_stays_ignored(served: Warm, signum: int) -> None:
    """``nohup upsertctl ...`` (SIGHUP ignored) or a script's ``upsertctl ... &`` (SIGINT
    ignored) outlives the hangup or Ctrl-C, as a process of its own does."""
    def ignore() -> None:
        signal.signal(signum, signal.SIG_IGN)

    proc, child = _start(served, ["snapshot", "--shard", "s", "--format", "csv"],
                         stdout=subprocess.PIPE, preexec_fn=ignore)
    try:
        time.sleep(0.3)
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        assert len(out.splitlines()) == ROWS + 1
    finally:
        proc.kill()


def test_a_second_warm_process_for_a_fingerprint_leaves_before_its_imports(
        tmp_path: Path) -> None:
    """Commands that start at once each start a warm process (11 for 20 commands here):
    all but one must leave at once, not after a second or two of imports each."""
    sockets = tmp_path / "warm"
    warm.private_dir(sockets)
    key = warm.fingerprint()
    with (sockets / f"{key}.lock").open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as the first one does
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run([sys.executable, "-m", "orchestration.cli.warm.server",
                               str(sockets), key], cwd=REPO, capture_output=True,
                              timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert proc.returncode == 0, proc.stderr
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu_s < 0.4, f"the second warm process spent {cpu_s:.2f} s of CPU"
    assert not (sockets / f"{key}.sock").exists()


@pytest.mark.parametrize("prefix", [["nice", "-n", "7"], ["taskset", "-c", "0"],
                                    ["prlimit", "--nofile=321"]])
def test_a_nice_taskset_or_ulimit_command_is_not_run_by_a_plain_warm_process(
        tmp_path: Path, prefix: list[str]) -> None:
    """What a fork inherits and the command cannot hand over (its priority, CPUs and
    resource limits) names another warm process, started with the command's own."""
    sockets = tmp_path / "warm"
    cli = Cli(tmp_path / "home", env={"UPSERT_LOCAL_SERVER": "auto",
                                      "UPSERT_LOCAL_SERVER_DIR": str(sockets)})
    state = Warm(cli, cli, sockets)
    cli.run("inspect", "--shard", "s", rc=1)  # starts a plain warm process
    _wait_for_socket(sockets)
    plain = state.server()
    try:
        command = [*prefix, *CLI, "inspect", "--shard", "s"]
        for _ in range(2):  # the first starts a warm process like it, the second uses it
            proc = subprocess.run(command, env=cli.env, cwd=REPO, capture_output=True,
                                  timeout=60)
            assert proc.returncode == 1
            _wait_for_socket(sockets, 2, timeout_s=20)
        servers = {int(s) for s in re.findall(r"\(pid (\d+)\): pid \d+ runs a command",
                                              state.log())}
        assert plain not in servers, "the plain warm process ran the prefixed command"
        assert len(servers) == 1
        other = servers.pop()
        if prefix[0] == "nice":
            assert os.getpriority(os.PRIO_PROCESS, other) == 7
        elif prefix[0] == "taskset":
            assert os.sched_getaffinity(other) == {0}
        else:
            assert "321" in next(line for line in Path(f"/proc/{other}/limits").read_text()
                                 .splitlines() if line.startswith("Max open files"))
    finally:
        state.stop()


IMPORT_ENV_NOT_FINGERPRINTED = {
    # task_env keeps a Spark worker's own AWS_* at import; a driver (our child) never
    # applies it, and the child's S3 clients read the environment when made.
    "AWS_ACCESS_KEY_ID", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
    "AWS_REGION", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    # sysconfig's user site directory: a different one is a different sys.path entry,
    # which the fingerprint covers.
    "HOME",
    # pyspark.testing's own switches and the Spark checkout it looks for its test jars
    # in (imported by pyspark's Connect modules); a Spark session finds SPARK_HOME when
    # it starts, in the child.
    "SPARK_ANSI_SQL_MODE", "SPARK_SKIP_CONNECT_COMPAT_TESTS", "SPARK_HOME",
}


def test_every_setting_read_at_import_names_the_warm_process() -> None:
    """An environment variable a preloaded module reads when imported would keep the
    warm process's value in every child: each one is in the fingerprint (or listed
    above with why it does not matter)."""
    script = textwrap.dedent("""
        import json, os
        seen = set()
        kind = type(os.environ)
        for name in ("__getitem__", "__contains__", "get"):
            def spy(self, key, *rest, _real=getattr(kind, name)):
                seen.add(key)
                return _real(self, key, *rest)
            setattr(kind, name, spy)
        from orchestration.cli.warm import server
        server.preload()
        print(json.dumps(sorted(seen)))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPSERT_")}
    env["PYTHONPATH"] = str(REPO)
    read = json.loads(subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO,
                                     capture_output=True, check=True, timeout=120).stdout)
    base = {"PATH": "/usr/bin"}
    key = warm.fingerprint(base)
    missing = [name for name in read if name not in IMPORT_ENV_NOT_FINGERPRINTED
               and warm.fingerprint({**base, name: "a value of the test's"}) == key]
    assert missing == []
    # Read by native libraries as they load (not through os.environ).
    for name in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "MKL_NUM_THREADS",
                 "MIMALLOC_ARENA_EAGER_COMMIT", "GRPC_VERBOSITY"):
        assert warm.fingerprint({**base, name: "1"}) != key, name
