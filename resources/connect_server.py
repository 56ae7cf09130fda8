"""A Spark Connect server started from the pyspark package, for tests, benchmarks and
one-machine setups (``deploy/cluster.sh`` starts the long-lived one of a cluster).

``connect_server(master)`` runs ``spark-submit --class SparkConnectServer`` in a process
group of its own, waits until its gRPC port answers, yields ``sc://127.0.0.1:PORT``
(what ``SPARK_REMOTE`` takes) and stops the group on exit.

Invariants:

- Loopback only: the server binds 127.0.0.1 on a free port, Spark's UI is off.
- Its Python workers run this interpreter and import this checkout first
  (``PYTHONPATH``), so the engine's tasks run the caller's code.
- The caller's ``SPARK_REMOTE`` / ``SPARK_MASTER`` / ``SPARK_CONNECT_AUTHENTICATE_TOKEN``
  never leak into the server (a token is given only through ``env``).
- Stopping signals only the server's own process group: TERM, then KILL.
- A server that exits or does not answer within ``timeout_s`` is a
  :class:`ConfigError` quoting the tail of its log.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from resources.spark_session import REPO_ROOT
from upsert_core.errors import ConfigError

CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_TIMEOUT_S = 90.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@contextmanager
def connect_server(
    master: str = "local[2]",
    *,
    log: Path | None = None,
    conf: Mapping[str, str] | None = None,
    name: str = "upsert-connect",
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Iterator[str]:
    """A Spark Connect server on ``master``; yields its ``sc://`` URL (see above)."""
    proc, url, _ = start_connect_server(master, log=log, conf=conf, name=name,
                                        timeout_s=timeout_s)
    try:
        yield url
    finally:
        stop_group(proc)


def start_connect_server(
    master: str = "local[2]",
    *,
    log: Path | None = None,
    conf: Mapping[str, str] | None = None,
    name: str = "upsert-connect",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], str, int]:
    """Start a server as :func:`connect_server` does and leave it running: ``(process,
    sc:// URL, port)`` once it answers (the caller stops it, e.g. with
    :func:`stop_group`); a server that does not come up is stopped and refused. ``env``:
    more environment for the server (e.g. its access token, which a command line would
    show to every local user)."""
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    port = free_port()
    log = log or Path(tempfile.mkdtemp(prefix="upsert-connect-")) / "connect-server.log"
    extra = dict(env or {})
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPARK_REMOTE", "SPARK_MASTER", "SPARK_CONNECT_AUTHENTICATE_TOKEN")}
    env.update(extra)
    env.update(SPARK_HOME=str(spark_home), SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    settings = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.ui.enabled": "false",
        **(conf or {}),
    }
    command = [str(spark_home / "bin" / "spark-submit"), "--class", CONNECT_CLASS,
               "--name", name, "--master", master]
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while not answers(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-3000:]
                raise ConfigError(f"the Spark Connect server did not come up ({log}):\n{tail}")
            time.sleep(0.3)
    except BaseException:
        stop_group(proc)
        raise
    return proc, f"sc://127.0.0.1:{port}", port


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """TERM the process group of ``proc``, then KILL it if it lingers."""
    for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
