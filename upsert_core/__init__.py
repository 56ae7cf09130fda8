"""upsert_core: the pure-Python heart of upsert-platform.

Invariants of the package as a whole:

- It imports neither ``dagster`` nor ``pyspark`` (tests/test_layering.py checks this),
  so it can be used and tested without either.
- Every error it raises on purpose derives from
  :class:`upsert_core.errors.UpsertPlatformError`.
"""

from upsert_core.errors import UpsertPlatformError

__all__ = ["UpsertPlatformError"]
