"""The Spark resource: which engine runs the ingest step of a Dagster run, and on which
Spark.

:class:`SparkResource` hands the ingest driver the engine ``resources.engines`` makes:
``engine="spark"`` (default) the Spark engine, whose session comes from
``resources.spark_session.get_spark`` (the same factory ``upsertctl ingest`` uses) on
the first file that runs; ``engine="local"`` the in-process engine (tests, tiny
landings, machines without Java).

Which Spark: ``remote`` (a Spark Connect URL) or ``master`` when set, else the run's
environment: ``SPARK_REMOTE`` (one long-lived Spark Connect server serves every run; a
run attaches in about a second), else ``SPARK_MASTER``, else the warm local Spark
Connect server of ``resources.local_spark`` (started by the first run, shared by later
runs and ``upsertctl``; attached with ``resources.local_session``), else
(``UPSERT_SPARK_SERVER=off``) ``local[*]`` in the run's process.
:func:`spark_resource_from_env` fills them, and ``engine``, from ``SPARK_REMOTE``,
``SPARK_MASTER`` and ``UPSERT_ENGINE``.

Invariants:

- A run with nothing pending creates no session: no JVM, no Connect session.
- The resource never stops a session: in ``dagster dev`` each run is its own process
  (a local JVM ends with it, a Connect session is released when it exits); in-process
  tests share one session.
- Sessions are made only by ``get_spark`` (no dagster-pyspark resource): the CLI, runs
  and tests get the same configuration.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from dagster import ConfigurableResource

from resources.engines import ENGINES, ENV_ENGINE, check_engine_name, make_engine
from upsert_core.ingest import Engine

__all__ = ["ENGINES", "ENV_ENGINE", "SparkResource", "spark_resource_from_env"]

APP_NAME = "upsert-platform-dagster"


class SparkResource(ConfigurableResource):
    """The ingest engine: Spark (default) or in-process (``engine="local"``)."""

    engine: str = "spark"
    master: str | None = None
    remote: str | None = None

    def ingest_engine(self) -> Engine:
        """The engine the ingest driver runs each file's steps on; a Spark one starts
        its session on its first file."""
        check_engine_name(self.engine)
        master, remote = self.master, self.remote

        def session() -> Any:
            # heavy: pyspark
            from resources import local_session, local_spark
            from resources.spark_session import get_spark

            if master is None and remote is None and local_spark.enabled():
                attached = local_session.attach(APP_NAME)  # the warm local server
                if attached is not None:  # None: it runs other code and is busy
                    return attached
            return get_spark(master, remote=remote, app_name=APP_NAME)

        return make_engine(self.engine, session)


def spark_resource_from_env(env: Mapping[str, str] | None = None) -> SparkResource:
    """The engine from ``UPSERT_ENGINE`` (default ``spark``); Spark from ``SPARK_REMOTE``,
    else ``SPARK_MASTER`` (else left to the run's environment: ``local[*]``)."""
    env = os.environ if env is None else env
    remote = env.get("SPARK_REMOTE", "").strip() or None
    master = None if remote else (env.get("SPARK_MASTER", "").strip() or None)
    return SparkResource(engine=env.get(ENV_ENGINE) or "spark", master=master, remote=remote)
