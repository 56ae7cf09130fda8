"""One way to get a SparkSession that works on these machines, locally or on a cluster.

Invariants:

- Before the JVM starts, ``SPARK_LOCAL_IP`` defaults to 127.0.0.1 (Spark would otherwise
  bind a public interface) and ``PYSPARK_PYTHON`` / ``PYSPARK_DRIVER_PYTHON`` default to
  this interpreter (the Spark config key is ignored in local mode, and workers running
  the system python cannot import pyarrow). Values already in the environment win.
- The master is the argument, else ``SPARK_MASTER``, else ``local[*]``.
- The UI is off unless asked for; shuffle partitions default to a small number (the
  ingest itself runs one stage of a few tasks and shuffles nothing; see
  ``resources/spark_ingest.py``).
- ``getOrCreate`` semantics: a second call returns the running session.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

DEFAULT_SHUFFLE_PARTITIONS = 8


def prepare_environment() -> None:
    """Set the environment variables Spark's JVM and Python workers need (see above)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def get_spark(
    master: str | None = None,
    *,
    app_name: str = "upsert-platform",
    ui: bool = False,
    shuffle_partitions: int = DEFAULT_SHUFFLE_PARTITIONS,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A SparkSession for ``master`` (or ``SPARK_MASTER``, or ``local[*]``)."""
    prepare_environment()
    builder = (
        SparkSession.builder.master(master or os.environ.get("SPARK_MASTER") or "local[*]")
        .appName(app_name)
        .config("spark.ui.enabled", "true" if ui else "false")
        .config("spark.ui.showConsoleProgress", "true" if ui else "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
