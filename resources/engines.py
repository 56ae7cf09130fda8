"""Which engine runs an ingest's file steps, chosen in one place and started lazily.

``upsertctl ingest`` (:func:`engine_named`) and the Dagster resource
(``resources.spark.SparkResource.ingest_engine``) both get their engine here:

- ``"local"``: the in-process engine (no JVM; tests, tiny landings, machines without
  Java).
- ``"spark"``: a :class:`LazySparkEngine`, the Spark engine
  (``resources.spark_ingest.SparkEngine``) on the warm local Spark Connect server
  (``resources.local_spark``) on the embedded defaults, else on
  ``resources.spark_session.get_spark()``.

Invariants:

- No Spark session is created (so no JVM started, no Spark Connect session opened)
  before the first file actually runs: an ingest with nothing pending, or one that
  fails on its options before any file, never pays for Spark. Nor does a first file
  of at most :data:`PREFLIGHT_BYTES` with a file-level problem (a missing key column,
  a changed column type, an unreadable file): it is read and validated in this process
  first (``tasks.read_file``, nothing written), and its problem is reported as the Spark
  run would report it, in a second instead of after a JVM start.
- :meth:`LazySparkEngine.stop` stops only a session this engine created; a session
  that was already active in the process (a test's shared session, a notebook's) is
  left running. The CLI stops its session when the command ends (for a Spark Connect
  session that only releases the session on the long-lived server). The Dagster
  resource does not stop: each run is its own process.
- Engine names other than :data:`ENGINES` are a :class:`ConfigError`; a session that
  cannot be made (no Java, a Connect server that does not answer) is one
  :class:`IngestError` line naming the file that needed it.
- On the warm local server (a session ``resources.local_session.attach`` made, and only
  then: not a JVM a command falls back to), each file touches the server's
  ``last_used``; a file whose Spark step fails, or whose session cannot be made, while
  that server is gone (stopped, replaced, killed) is one :class:`IngestError` line naming
  the file and the server's pid and saying to run the command again (nothing of the file
  was committed), whatever the underlying failure said.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from resources.spark_paths import group_size
from upsert_core.errors import ConfigError, IngestError, UpsertPlatformError
from upsert_core.ingest.engine import Engine, InProcessEngine
from upsert_core.ingest.first_file import PREFLIGHT_BYTES
from upsert_core.ingest.outcome import FileOutcome
from upsert_core.ingest.shard_api import IngestShard
from upsert_core.ingest.tasks import FileTask, read_file
from upsert_core.landing import LandingFile, read_counter
from upsert_core.redact import redact_url

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from resources.local_spark import LocalServer
    from resources.spark_ingest import SparkEngine

ENGINES = ("spark", "local")
ENV_ENGINE = "UPSERT_ENGINE"
DEFAULT_ENGINE = "spark"


def check_engine_name(name: str) -> str:
    if name not in ENGINES:
        raise ConfigError(f"engine must be one of {ENGINES}, got {name!r}")
    return name


def engine_from_env(env: Mapping[str, str] | None = None) -> str:
    """``UPSERT_ENGINE``, else ``spark``."""
    env = os.environ if env is None else env
    return check_engine_name(env.get(ENV_ENGINE) or DEFAULT_ENGINE)


def _default_factory() -> SparkSession:
    # heavy: pyspark
    from resources import local_session, local_spark
    from resources.spark_session import get_spark

    if local_spark.enabled():  # the warm local server (UPSERT_SPARK_SERVER, default auto)
        session = local_session.attach()
        if session is not None:  # None: the server runs other code and is busy
            return session
    return get_spark()


def _active_session() -> Any:
    """The SparkSession already active in this process, if any (never starts one)."""
    try:
        from pyspark.sql import SparkSession

        return SparkSession.getActiveSession()
    except Exception:  # noqa: BLE001 - no usable pyspark state: nothing is active
        return None




def preflight(task: FileTask, shard: IngestShard) -> FileOutcome | None:
    """The outcome of ``task``'s file when it has a file-level problem found without
    Spark (nothing written), else None (also for a file too big to read twice)."""
    if task.file.size < 0 or task.file.size > PREFLIGHT_BYTES:
        return None
    read, _ = read_file(task, shard.blob, write_errors=False)
    if read.file_error is None and read.changed is None:
        return None
    return FileOutcome(read=read)


class LazySparkEngine:
    """The Spark engine, whose session is made by ``factory`` on the first file."""

    def __init__(self, factory: Callable[[], SparkSession] | None = None) -> None:
        self.factory = factory or _default_factory
        self.spark: SparkSession | None = None
        self.created = False
        self._engine: SparkEngine | None = None
        self.local_server: LocalServer | None = None
        """The warm local server the session is attached to, if it is."""

    @property
    def started(self) -> bool:
        return self._engine is not None

    def run_file(self, task: FileTask, shard: IngestShard) -> FileOutcome:
        checked = 0  # landing bytes the preflight read (the outcome reports every read)
        if self._engine is None:
            before = read_counter.bytes_read(task.file.url)
            found = preflight(task, shard)
            if found is not None:
                return found  # no session for a file Spark would refuse anyway
            checked = read_counter.bytes_read(task.file.url) - before
        engine = self._started(task)
        with self._server_watched(task):
            outcome = engine.run_file(task, shard)
        outcome.read.landing_bytes += checked
        return outcome

    def group_size(self, files: Sequence[LandingFile], envelope: str) -> int:
        """How many pending files run as one job (``resources.spark_paths``; no session)."""
        return group_size(files, envelope)

    def run_group(self, tasks: list[FileTask], shard: IngestShard) -> list[FileOutcome]:
        """The Spark engine's group (``SparkEngine.run_group``), after the preflight of
        its first file when no session runs yet."""
        checked = 0
        if self._engine is None:
            before = read_counter.bytes_read(tasks[0].file.url)
            found = preflight(tasks[0], shard)
            if found is not None:
                return [found]  # no session for a file Spark would refuse anyway
            checked = read_counter.bytes_read(tasks[0].file.url) - before
        engine = self._started(tasks[0])
        with self._server_watched(tasks[0]):
            outcomes = engine.run_group(tasks, shard)
        if outcomes:
            outcomes[0].read.landing_bytes += checked
        return outcomes

    def _started(self, task: FileTask) -> SparkEngine:
        """The Spark engine, its session made now if this is the first file that runs."""
        if self._engine is None:
            from resources.local_session import server_of  # heavy: pyspark
            from resources.local_spark import LocalServerStopped  # heavy: pyspark's paths
            from resources.spark_ingest import SparkEngine, failure_line  # heavy: pyspark

            before = _active_session()
            try:
                spark = self.factory()
            except LocalServerStopped as exc:
                raise exc.server.stopped_error(task.file.name) from exc
            except UpsertPlatformError:
                raise
            except Exception as exc:  # noqa: BLE001 - one line for the user, not a trace
                # redacted: the warm local server's URL carries its token
                raise IngestError(f"{task.file.name}: no Spark session:"
                                  f" {redact_url(failure_line(exc))}") from exc
            self.spark, self.created = spark, spark is not before
            self._engine = SparkEngine(spark)
            self.local_server = server_of(spark)
        if self.local_server is not None:
            self.local_server.note_use()
        return self._engine

    @contextmanager
    def _server_watched(self, task: FileTask) -> Iterator[None]:
        """Run the block; whatever its failure looked like (a job error, an RPC given up
        on), a warm local server that stopped under the file is what the user needs to
        know."""
        server = self.local_server
        try:
            yield
        except Exception as exc:
            if server is not None and server.gone():
                raise server.stopped_error(task.file.name) from exc
            raise

    def stop(self) -> None:
        """Stop the session if this engine created it; forget it either way."""
        spark, created = self.spark, self.created
        self.spark, self.created, self._engine = None, False, None
        if spark is not None and created:
            from resources.spark_session import release  # heavy: pyspark

            release(spark)


def make_engine(name: str, factory: Callable[[], SparkSession] | None = None) -> Engine:
    """The engine called ``name``; a Spark one has no session yet."""
    if check_engine_name(name) == "local":
        return InProcessEngine()
    return LazySparkEngine(factory)


@contextmanager
def engine_named(
    name: str, factory: Callable[[], SparkSession] | None = None
) -> Iterator[Engine]:
    """The engine called ``name``, stopped afterwards (see above)."""
    engine = make_engine(name, factory)
    try:
        yield engine
    finally:
        if isinstance(engine, LazySparkEngine):
            engine.stop()
