"""upsert_core: the pure-Python heart of upsert-platform.

Invariants of the package as a whole:

- It imports neither ``dagster`` nor ``pyspark`` (tests/test_layering.py checks this),
  so it can be used and tested without either.
- Every error it raises on purpose derives from
  :class:`upsert_core.errors.UpsertPlatformError`.
- ``open_shard`` (:mod:`upsert_core.shard_table`) is the Python read API: typed Arrow
  tables of a shard, found where ``upsertctl`` finds it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from upsert_core.errors import UpsertPlatformError

if TYPE_CHECKING:
    from upsert_core.shard_table import ShardTable, open_shard

__all__ = ["ShardTable", "UpsertPlatformError", "open_shard"]


def __getattr__(name: str) -> Any:
    # Lazy: ``import upsert_core`` (every CLI start) must not pull in pyarrow.
    if name in ("open_shard", "ShardTable"):
        from upsert_core import shard_table  # heavy: pyarrow

        return getattr(shard_table, name)
    raise AttributeError(f"module 'upsert_core' has no attribute {name!r}")
