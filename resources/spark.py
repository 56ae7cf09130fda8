"""The Spark resource: which engine runs the ingest step, and the SparkSession through
dagster-pyspark.

:class:`SparkResource` wraps dagster-pyspark's ``LazyPySparkResource`` (the session is
created on first use, so a run with nothing to ingest never starts a JVM) and hands the
ingest driver a ``resources.spark_ingest.SparkEngine`` on that session: the same engine
``upsertctl ingest`` uses. ``engine="local"`` selects the in-process engine instead
(tests, tiny landings, machines without Java).

:func:`spark_config` builds the session config from the environment: ``spark.master``
from ``SPARK_MASTER`` (else ``local[*]``), the UI and console progress off, few shuffle
partitions, Arrow on; ``spark.remote`` from ``SPARK_REMOTE`` for Spark Connect.

Invariants:

- ``resources.spark_session.prepare_environment`` runs before the session is created,
  so workers use this interpreter and Spark binds 127.0.0.1 unless told otherwise.
- The resource never stops a session: in ``dagster dev`` each run is its own process
  (the JVM ends with it); in-process tests share one session.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from dagster import ConfigurableResource
from dagster_pyspark import LazyPySparkResource

from upsert_core.errors import ConfigError
from upsert_core.ingest import Engine, InProcessEngine

ENGINES = ("spark", "local")
ENV_ENGINE = "UPSERT_ENGINE"
DEFAULT_SHUFFLE_PARTITIONS = 8


def spark_config(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The session config for this environment (see the module docstring)."""
    env = os.environ if env is None else env
    conf: dict[str, Any] = {
        "spark.app.name": "upsert-platform-dagster",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(DEFAULT_SHUFFLE_PARTITIONS),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
    }
    if env.get("SPARK_REMOTE"):
        conf["spark.remote"] = env["SPARK_REMOTE"]
    else:
        conf["spark.master"] = env.get("SPARK_MASTER") or "local[*]"
    return conf


class SparkResource(ConfigurableResource):
    """The ingest engine: Spark (default) or in-process (``engine="local"``)."""

    engine: str = "spark"
    pyspark: LazyPySparkResource

    def ingest_engine(self) -> Engine:
        """The engine the ingest driver runs each file's steps on."""
        if self.engine not in ENGINES:
            raise ConfigError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if self.engine == "local":
            return InProcessEngine()
        from resources.spark_ingest import SparkEngine
        from resources.spark_session import prepare_environment

        prepare_environment()
        return SparkEngine(self.pyspark.spark_session)


def spark_resource_from_env(env: Mapping[str, str] | None = None) -> SparkResource:
    """Spark configured by ``SPARK_MASTER``/``SPARK_REMOTE``; engine by ``UPSERT_ENGINE``."""
    env = os.environ if env is None else env
    return SparkResource(
        engine=env.get(ENV_ENGINE) or "spark",
        pyspark=LazyPySparkResource(spark_config=spark_config(env)),
    )
