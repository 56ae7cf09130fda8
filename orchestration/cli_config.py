"""Where ``upsertctl`` keeps shards: see :mod:`upsert_core.stores` (flag > environment >
default under ``$UPSERT_HOME``); plus the CLI's own ``UPSERT_DEBUG`` switch."""

from __future__ import annotations

import os
from collections.abc import Mapping

from upsert_core.stores import (
    DEFAULT_HOME,
    ENV_BLOB,
    ENV_CONSENSUS,
    ENV_HOME,
    StoreConfig,
    open_stores,
    resolve,
    upsert_home,
)

ENV_DEBUG = "UPSERT_DEBUG"

__all__ = [
    "DEFAULT_HOME", "ENV_BLOB", "ENV_CONSENSUS", "ENV_DEBUG", "ENV_HOME", "StoreConfig",
    "debug_enabled", "open_stores", "resolve", "upsert_home",
]


def debug_enabled(flag: bool, env: Mapping[str, str] | None = None) -> bool:
    """``--debug`` or ``UPSERT_DEBUG`` set to something other than empty/0/false."""
    env = os.environ if env is None else env
    value = env.get(ENV_DEBUG, "").strip().lower()
    return flag or value not in ("", "0", "false", "no")
