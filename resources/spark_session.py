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

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

DEFAULT_SHUFFLE_PARTITIONS = 8
REPO_ROOT = Path(__file__).resolve().parents[1]


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
    master_url = master or os.environ.get("SPARK_MASTER") or "local[*]"
    builder = (
        SparkSession.builder.master(master_url)
        .appName(app_name)
        .config("spark.ui.enabled", "true" if ui else "false")
        .config("spark.ui.showConsoleProgress", "true" if ui else "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
    settings = {} if master_url.startswith("local") else executor_env(os.environ)
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def executor_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``spark.executorEnv.*`` settings that give cluster executors the driver's code
    (``PYTHONPATH``, this checkout first)."""
    paths = [str(REPO_ROOT)] + [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {"spark.executorEnv.PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}
