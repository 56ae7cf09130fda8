"""The S3 settings a Spark task takes from the driver: what the Spark engine and the
``upsert`` data source ship with every task.

Cluster executors do not inherit the driver's environment, and Python workers are reused
across tasks (and across jobs of other sessions), so each task applies the driver's
values itself.

Invariants:

- Only the names in :data:`SHIPPED_ENV` are taken, and only those the driver has set;
  a name the driver does not set is left as the executor's environment has it (an
  instance profile or the worker's own credentials keep working).
- A shipped value always wins over what an earlier task left in the worker (a stale
  endpoint would point at another S3 server); a shipped empty value unsets the name.
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


def apply_env(env: Mapping[str, str]) -> None:
    """Apply shipped values in this worker: set each non-empty one, unset empty ones."""
    for name, value in env.items():
        if value:
            os.environ[name] = value
        else:
            os.environ.pop(name, None)
