"""The S3 settings a Spark task takes from the driver: what the Spark engine and the
``upsert`` data source ship with every task.

Cluster executors do not inherit the driver's environment, and Python workers are reused
across tasks (and across jobs of other sessions), so each task applies the driver's
values itself.

Invariants:

- Only the names in :data:`SHIPPED_ENV` are taken, and only those the driver has set;
  a name the driver does not set is left as the executor's environment has it (an
  instance profile or the worker's own credentials keep working).
- A task sees the worker's own values (as they were when this module was imported in
  the worker) overridden by the shipped ones, never an earlier task's: Python workers
  outlive tasks and, on a shared Spark Connect session, serve several client processes,
  so a value an earlier driver shipped and this one does not is put back to the
  worker's own (a stale endpoint would point at another S3 server). A shipped empty
  value unsets the name.
- Shipped values travel inside the pickled task, never as data source options, so they
  do not show in query plans or the Spark UI.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

SHIPPED_ENV = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
)


def driver_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The :data:`SHIPPED_ENV` values set in the driver's environment."""
    env = os.environ if env is None else env
    return {name: env[name] for name in SHIPPED_ENV if name in env}


_WORKER_ENV: dict[str, str | None] = {name: os.environ.get(name) for name in SHIPPED_ENV}
"""This process's own :data:`SHIPPED_ENV` values, before any task applied a driver's."""


def _set(name: str, value: str | None) -> None:
    if value:
        os.environ[name] = value
    else:
        os.environ.pop(name, None)


def apply_env(env: Mapping[str, str]) -> None:
    """Apply a task's shipped values in this worker: the worker's own
    :data:`SHIPPED_ENV` values first, then each shipped one (empty: unset). Names
    outside :data:`SHIPPED_ENV` (the writer token) are set or unset as shipped."""
    for name, value in _WORKER_ENV.items():
        _set(name, value)
    for name, value in env.items():
        _set(name, value)
