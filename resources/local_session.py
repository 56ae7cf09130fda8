"""A session on the warm local Spark Connect server (``resources.local_spark``): how a
command attaches to it, and how quickly it gives up on a server that went away.

``upsertctl ingest`` (``resources.engines``) and Dagster runs (``resources.spark``)
attach with :func:`attach`; :func:`server_of` tells a session made here from any other.

Invariants:

- A session is the local server's only when :func:`attach` made it: a command that
  runs on a JVM of its own (the server runs other code and is busy) is not using the
  server, and never touches its ``last_used``.
- Such a session gives up on its server in seconds, not minutes. pyspark's
  ``DefaultPolicy`` retries an unreachable server for at least 10 minutes (15 retries,
  backing off to 60 s), which suits a remote server that restarts; ours is a local
  process whose end this machine sees. Its client retries with
  :class:`LocalServerRetries` instead (set with the client's public
  ``set_retry_policies``, before its first RPC): the failures ``DefaultPolicy`` retries,
  for at most :data:`MAX_RETRIES` retries, about 9 s in all, and none once the server's
  process is gone or a stop of it began (:meth:`LocalServer.gone`). pyspark's
  ``[RETRIES_EXCEEDED]`` warning is not printed: the command's own error line says it.
- A failure while the server is gone is :class:`LocalServerStopped` here, before a file
  ran; the engine (``resources.engines``) turns it, and a file's failed Spark step while
  the server is gone, into one line naming the file and the server's pid and saying to
  run the command again: nothing of that file was committed.
"""

from __future__ import annotations

import warnings

from pyspark.sql import SparkSession
from pyspark.sql.connect.client.retries import DefaultPolicy

from resources import local_spark, spark_session
from resources.local_spark import LocalServer, LocalServerStopped

MAX_RETRIES = 8
INITIAL_BACKOFF_MS = 100
MAX_BACKOFF_MS = 2000
BACKOFF_MULTIPLIER = 2.0
RETRIES_EXCEEDED = r"\[RETRIES_EXCEEDED\]"


class LocalServerRetries(DefaultPolicy):
    """``DefaultPolicy``'s choice of what to retry, with a budget of seconds, and nothing
    once ``server`` is gone (see the module docstring)."""

    def __init__(self, server: LocalServer) -> None:
        super().__init__(max_retries=MAX_RETRIES, initial_backoff=INITIAL_BACKOFF_MS,
                         max_backoff=MAX_BACKOFF_MS, backoff_multiplier=BACKOFF_MULTIPLIER,
                         jitter=0, min_jitter_threshold=0)
        # A delay the server asks for (pyspark >= 4.1 honours it, up to 10 min) stays
        # within the budget too.
        self.max_server_retry_delay = MAX_BACKOFF_MS
        self.server = server

    def can_retry(self, exception: BaseException) -> bool:
        return super().can_retry(exception) and not self.server.gone()


def budget_s() -> float:
    """The longest the retries of one call wait in all, in seconds."""
    wait, total = float(INITIAL_BACKOFF_MS), 0.0
    for _ in range(MAX_RETRIES):
        total += wait
        wait = min(MAX_BACKOFF_MS, wait * BACKOFF_MULTIPLIER)
    return total / 1000


def attach(app_name: str = "upsert-platform") -> SparkSession | None:
    """A session on this home's server, started if none runs; None when the command is
    to run on a JVM of its own (``local_spark.ensure_server``)."""
    server = local_spark.ensure_server()
    if server is None:
        return None
    warnings.filterwarnings("ignore", message=RETRIES_EXCEEDED, category=UserWarning,
                            module=r"pyspark\.sql\.connect\.client\.retries")
    try:
        return spark_session.get_spark(remote=server.url, app_name=app_name,
                                       retry_policies=[LocalServerRetries(server)])
    except Exception as exc:
        if server.gone():
            raise LocalServerStopped(server) from exc
        raise


def server_of(spark: SparkSession) -> LocalServer | None:
    """The local server ``spark`` was attached to by :func:`attach`, else None."""
    if not spark_session.is_connect(spark):
        return None
    for policy in spark.client.get_retry_policies():
        if isinstance(policy, LocalServerRetries):
            return policy.server
    return None
