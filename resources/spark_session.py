"""The one way to get a SparkSession: a Spark Connect server, a cluster, or local.

:func:`get_spark` serves ``upsertctl ingest``, the Dagster resource and the tests.

Invariants:

- Which Spark: an explicit argument wins over the environment (``remote=`` a Spark
  Connect URL, or ``master=``); else ``SPARK_REMOTE`` (e.g. ``sc://127.0.0.1:15002``, a
  long-lived Spark Connect server: the session attaches in about a second instead of
  starting a JVM), else ``SPARK_MASTER``, else ``local[*]``. A Connect session is built
  with ``builder.remote(url)`` and never ``.master()`` (pyspark refuses the pair with
  CANNOT_CONFIGURE_SPARK_CONNECT_MASTER); while an explicit master is built,
  ``SPARK_REMOTE`` is hidden from pyspark, which reads it from the environment itself.
- Before a local JVM starts, ``SPARK_LOCAL_IP`` defaults to 127.0.0.1 (Spark would
  otherwise bind a public interface) and ``PYSPARK_PYTHON`` / ``PYSPARK_DRIVER_PYTHON``
  default to this interpreter (the Spark config key is ignored in local mode, and
  workers running the system python cannot import pyarrow). Values already in the
  environment win.
- The UI is off unless asked for; shuffle partitions default to a small number (the
  ingest itself runs one stage of a few tasks and shuffles nothing; see
  ``resources/spark_ingest.py``). A Connect session only takes the runtime ``spark.sql.*``
  settings: the server's static configuration (master, UI, executor environment) is the
  server's, fixed when it started (``deploy/cluster.sh``).
- One server-side session per user and server, shared by every process: a Connect URL
  without a ``session_id`` gets a stable one (:func:`shared_session_url`: a UUID from the
  user, the server and the current hour), so each ``upsertctl ingest`` and Dagster run
  attaches to the same session and finds its Python workers running, with their
  imports done and their bucket-state caches filled (a fresh session starts new
  workers: ~2 s per file for a 1,000-row file, against ~0.3 s warm). Such a session is
  never stopped by a client (:func:`release`: it only closes its own connection), since
  other processes use it; the server closes it when idle (its session timeout, 60 min by
  default; the hourly id means a closed id is never reused). ``UPSERT_SPARK_SHARED_SESSION=0``
  or an explicit ``session_id`` in the URL opts out.
- ``getOrCreate`` semantics: a second call returns the running session.
- Spark's own output stays off the user's terminal unless asked for: a driver JVM this
  process starts (``local[*]``, ``SPARK_MASTER``) writes its stdout and stderr (the
  JVM's ``WARNING: Using incubator modules``, log4j's lines, Python workers' stderr) to
  ``$UPSERT_HOME/spark/driver.log`` (appended; moved to ``driver.log.1`` past
  :data:`MAX_DRIVER_LOG_BYTES`), through pyspark's ``launch_gateway`` hook for exactly
  that. ``UPSERT_SPARK_LOG=1`` leaves them on stderr, as Spark prints them. Errors are
  not hidden: a job's failure reaches the caller as its exception (the CLI prints its
  one line), and a JVM that does not start is an error quoting the end of its output.
  A Connect session starts no JVM here (a Connect server's output is its own log's:
  ``resources/connect_server.py``).
- A driver JVM whose start is interrupted (Ctrl-C, or Dagster's SIGTERM of a run turned
  into an interrupt) is killed before the interrupt goes on: pyspark starts it ignoring
  SIGINT and deletes the file it would report its port in, so its main thread dies
  while its gateway thread keeps it alive for good, an orphan nobody else would stop.
- On a non-local master (a standalone or other cluster), executors do not inherit the
  driver's environment: ``PYTHONPATH`` is passed on as ``spark.executorEnv.PYTHONPATH``
  with this checkout first, so tasks import the same code as the driver. Explicit
  ``conf`` entries win. The blob store's ``AWS_*`` settings are NOT frozen into the
  executors here: the Spark engine ships the driver's current ``AWS_*`` values with every
  task (``resources/spark_ingest.py``, applied where the executor has none), which also
  follows a driver whose environment changes after the session started; fixing them at
  executor start would shadow those shipped values.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import SparkSession

from upsert_core.errors import ConfigError
from upsert_core.stores import upsert_home

if TYPE_CHECKING:
    from pyspark.sql.connect.client.retries import RetryPolicy

DEFAULT_SHUFFLE_PARTITIONS = 8
REPO_ROOT = Path(__file__).resolve().parents[1]
ENV_REMOTE = "SPARK_REMOTE"
ENV_MASTER = "SPARK_MASTER"
ENV_SHARED = "UPSERT_SPARK_SHARED_SESSION"
ENV_SPARK_LOG = "UPSERT_SPARK_LOG"
DRIVER_LOG = "driver.log"
MAX_DRIVER_LOG_BYTES = 8 * 1024 * 1024
DEFAULT_MASTER = "local[*]"
SHARED_SESSION_SECONDS = 3600

_shared_sessions: set[int] = set()


@dataclass(frozen=True)
class SparkTarget:
    """Where a session goes: a Spark Connect URL (``remote``) or a master URL."""

    url: str
    remote: bool

    def describe(self) -> str:
        return f"Spark Connect {self.url}" if self.remote else f"master {self.url}"


def spark_target(
    master: str | None = None,
    remote: str | None = None,
    env: Mapping[str, str] | None = None,
) -> SparkTarget:
    """The Spark a session is for (see the module docstring for the order)."""
    if master and remote:
        raise ConfigError(f"give a Spark master ({master!r}) or a Spark Connect URL"
                          f" ({remote!r}), not both")
    if remote:
        return _remote(remote)
    if master:
        return SparkTarget(master, remote=False)
    env = os.environ if env is None else env
    if env.get(ENV_REMOTE, "").strip():
        return _remote(env[ENV_REMOTE].strip())
    return SparkTarget(env.get(ENV_MASTER, "").strip() or DEFAULT_MASTER, remote=False)


def _remote(url: str) -> SparkTarget:
    if not url.startswith("sc://"):
        raise ConfigError(f"{ENV_REMOTE} must be a Spark Connect URL sc://HOST:PORT, got {url!r}")
    return SparkTarget(url, remote=True)


def shared_session_url(url: str, env: Mapping[str, str] | None = None,
                       now: float | None = None) -> str:
    """``url`` with the stable ``session_id`` every process of this user shares (see the
    module docstring); ``url`` unchanged if it names a session or sharing is off."""
    env = os.environ if env is None else env
    if "session_id=" in url or env.get(ENV_SHARED, "1").strip().lower() in ("0", "false", "no"):
        return url
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name (e.g. a container without one)
        user = str(os.getuid())
    hour = int((time.time() if now is None else now) // SHARED_SESSION_SECONDS)
    base = url.rstrip("/")
    session = uuid.uuid5(uuid.NAMESPACE_URL, f"upsert-platform/{user}/{base}/{hour}")
    separator = ";" if "/;" in base else "/;"
    return f"{base}{separator}session_id={session}"


def release(spark: SparkSession) -> None:
    """End this process's use of ``spark``: a shared Connect session only closes its
    connection (other processes use it); any other session is stopped."""
    if id(spark) in _shared_sessions:
        _shared_sessions.discard(id(spark))
        client = getattr(spark, "client", None)
        if client is not None:
            client.close()
        return
    spark.stop()


def prepare_environment() -> None:
    """Set the environment variables Spark's JVM and Python workers need (see above)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def get_spark(
    master: str | None = None,
    *,
    remote: str | None = None,
    app_name: str = "upsert-platform",
    ui: bool = False,
    shuffle_partitions: int = DEFAULT_SHUFFLE_PARTITIONS,
    conf: Mapping[str, str] | None = None,
    log: Path | None = None,
    retry_policies: Sequence[RetryPolicy] | None = None,
) -> SparkSession:
    """A SparkSession for ``remote``/``master``, else ``SPARK_REMOTE``, else
    ``SPARK_MASTER``, else ``local[*]``. A driver JVM this call starts writes its output
    to ``log`` (default :func:`driver_log`) unless ``UPSERT_SPARK_LOG`` is on.
    ``retry_policies``: a Connect session's client retries its calls with these instead
    of pyspark's default (set before its first call to the server)."""
    prepare_environment()
    target = spark_target(master, remote)
    sql = {
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
    }
    if target.remote:
        url = shared_session_url(target.url)
        if retry_policies is not None:
            # Made without settings, the session has called nothing on the server yet.
            made = SparkSession.builder.remote(url).getOrCreate()
            made.client.set_retry_policies(retry_policies)
        builder = SparkSession.builder.remote(url)
        settings = {**sql, **{k: v for k, v in (conf or {}).items() if k.startswith("spark.sql.")}}
        for key, value in settings.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        if url != target.url:
            _shared_sessions.add(id(session))
        return session
    settings = {
        "spark.app.name": app_name,
        "spark.ui.enabled": "true" if ui else "false",
        "spark.ui.showConsoleProgress": "true" if ui else "false",
        **sql,
    }
    if not target.url.startswith("local"):
        settings.update(executor_env(os.environ))
    settings.update(conf or {})
    with _without(ENV_REMOTE):
        if not spark_log_shown():
            start_driver_quietly(target.url, settings, log or driver_log())
        builder = SparkSession.builder.master(target.url)
        for key, value in settings.items():
            builder = builder.config(key, value)
        return builder.getOrCreate()


def spark_log_shown(env: Mapping[str, str] | None = None) -> bool:
    """``UPSERT_SPARK_LOG`` set to something other than empty/0/false/no: Spark's own
    output goes to stderr (module docstring)."""
    env = os.environ if env is None else env
    return env.get(ENV_SPARK_LOG, "").strip().lower() not in ("", "0", "false", "no")


def driver_log(env: Mapping[str, str] | None = None) -> Path:
    """Where a driver JVM started by :func:`get_spark` writes its output."""
    return upsert_home(env) / "spark" / DRIVER_LOG


def start_driver_quietly(master: str, settings: Mapping[str, str], log: Path) -> None:
    """Start this process's driver JVM with ``settings`` (what ``spark-submit`` gets from
    the builder) and its stdout and stderr appended to ``log``, and its SparkContext; the
    builder then attaches to both. Nothing when this process has a JVM already (its
    output goes where it went). A JVM that does not start is an error whose first line
    quotes the end of what it wrote."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if getattr(SparkContext, "_gateway", None) is not None:
        return
    conf = SparkConf(loadDefaults=False).setMaster(master).setAll(list(settings.items()))
    log.parent.mkdir(parents=True, exist_ok=True)
    _rotate(log)
    with log.open("ab") as out:
        when = time.strftime("%Y-%m-%d %H:%M:%S")
        out.write(f"--- {when} pid {os.getpid()}: Spark driver on {master}\n".encode())
        out.flush()
        start = out.tell()
        try:
            with _killed_unless_started():
                gateway = launch_gateway(conf, popen_kwargs={"stdout": out, "stderr": out})
        except Exception as exc:
            said = _tail(log, start)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise RuntimeError(f"{first} Spark said: {said or '(nothing)'} (its output:"
                               f" {log}; UPSERT_SPARK_LOG=1 shows it on stderr)") from exc
    SparkContext(conf=conf, gateway=gateway)


@contextmanager
def _killed_unless_started() -> Iterator[None]:
    """Around ``launch_gateway``: if it raises anything (an interrupt included), kill
    the JVM it started (module docstring). pyspark passes no handle to its process
    back on failure, so the launch runs with ``pyspark.java_gateway.Popen`` recording
    the processes it starts, under ``SparkContext._lock`` (every launch of a gateway in
    this process holds it, so no other launch sees the recorder)."""
    import pyspark.java_gateway as java_gateway
    from pyspark import SparkContext

    started: list[subprocess.Popen[bytes]] = []
    real = java_gateway.Popen

    def recording(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        proc = real(*args, **kwargs)
        started.append(proc)
        return proc

    with SparkContext._lock:
        java_gateway.Popen = recording  # type: ignore[assignment,misc]
        try:
            yield
        except BaseException:
            for proc in started:
                if proc.poll() is None:
                    proc.kill()  # it never served: nothing of it to flush
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(10)
            raise
        finally:
            java_gateway.Popen = real  # type: ignore[misc]


def _rotate(log: Path) -> None:
    """Move ``log`` to ``<log>.1`` once it holds :data:`MAX_DRIVER_LOG_BYTES`."""
    try:
        if log.stat().st_size >= MAX_DRIVER_LOG_BYTES:
            log.replace(log.with_name(log.name + ".1"))
    except OSError:  # none yet, or another process moved it first
        pass


def _tail(log: Path, start: int, lines: int = 4, chars: int = 800) -> str:
    """The last ``lines`` non-empty lines written to ``log`` after offset ``start``, as
    one line."""
    try:
        with log.open("rb") as handle:
            handle.seek(start)
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    said = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(said[-lines:])[-chars:]


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect session (no RDD API, tasks run elsewhere)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def master_of(spark: SparkSession) -> str:
    """The master URL of ``spark``'s cluster (for Connect: the server's master)."""
    return str(spark.conf.get("spark.master", "") or "")


@contextmanager
def _without(name: str) -> Iterator[None]:
    saved = os.environ.pop(name, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[name] = saved


def executor_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``spark.executorEnv.*`` settings that give cluster executors the driver's code
    (``PYTHONPATH``, this checkout first)."""
    paths = [str(REPO_ROOT)] + [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {"spark.executorEnv.PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}
