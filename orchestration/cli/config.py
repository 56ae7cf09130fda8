"""Where ``upsertctl`` keeps shards: see :mod:`upsert_core.stores` (flag > environment >
default under ``$UPSERT_HOME``); the shard a command opens; the CLI's own ``UPSERT_DEBUG``
switch.

Invariant: opening a shard imports the persist layer (pyarrow) only when a command opens
one, so ``--help`` and usage errors stay fast.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from upsert_core.errors import ShardNotFound
from upsert_core.stores import (
    DEFAULT_HOME,
    ENV_BLOB,
    ENV_CONSENSUS,
    ENV_HOME,
    StoreConfig,
    existing_shards_note,
    open_stores,
    resolve,
    upsert_home,
)

if TYPE_CHECKING:
    from upsert_core.persist.shard import Shard

ENV_DEBUG = "UPSERT_DEBUG"

__all__ = [
    "DEFAULT_HOME", "ENV_BLOB", "ENV_CONSENSUS", "ENV_DEBUG", "ENV_HOME", "StoreConfig",
    "debug_enabled", "open_shard", "open_stores", "resolve", "store_config", "upsert_home",
]


def debug_enabled(flag: bool, env: Mapping[str, str] | None = None) -> bool:
    """``--debug`` or ``UPSERT_DEBUG`` set to something other than empty/0/false."""
    env = os.environ if env is None else env
    value = env.get(ENV_DEBUG, "").strip().lower()
    return flag or value not in ("", "0", "false", "no")


def store_config(args: argparse.Namespace) -> StoreConfig:
    """The stores a command's ``--consensus`` / ``--blob`` (or the environment) name."""
    return resolve(getattr(args, "consensus", None), getattr(args, "blob", None))


def open_shard(args: argparse.Namespace, *, create: bool = False) -> Shard:
    """The shard ``--shard`` names; read commands never create one (ShardNotFound, its
    message saying what to do next: ingest into it, or name the stores that hold it)."""
    from upsert_core.persist.shard import Shard  # heavy: pyarrow, only when a shard opens

    config = store_config(args)
    try:
        # A read creates nothing: not even the embedded stores (issue 23).
        consensus, blob = open_stores(config, create=create, shard=args.shard)
        return Shard.open(consensus, blob, args.shard, create=create)
    except ShardNotFound as exc:
        raise ShardNotFound(
            f"{exc} in these stores{existing_shards_note(config)}: create it with"
            f" `upsertctl ingest LANDING --shard"
            f" {args.shard}`, or point --consensus/--blob (UPSERT_CONSENSUS_URL,"
            f" UPSERT_BLOB_URL, UPSERT_HOME) at the stores that hold it"
        ) from exc
