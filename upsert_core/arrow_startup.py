"""Process-wide pyarrow settings for a short-lived console process (``upsertctl``).

1. Keep pyarrow from importing pandas in a process that never uses it. pyarrow asks "is
   pandas installed?" the first time almost any function converts a value
   (``pa.array``, ``pa.scalar``, most compute calls), to recognise pandas objects, and
   answers by importing pandas: 0.4-0.5 s here, a third of an ``upsertctl ingest`` of a
   small file. :func:`defer_pandas` answers that first question with "no" without
   importing pandas.
2. Allocate Arrow memory with jemalloc (:func:`prefer_jemalloc`). With pyarrow's default
   pool (mimalloc) a 1M-row first load spent 1.6-2.6 s of system time here, returning
   memory to the kernel and faulting it back in; with jemalloc 0.9-1.0 s, for the same
   user time and a lower peak RSS (docs/benchmarks.md).

Invariants:

- Only pyarrow's *probe* is affected: ``Table.to_pandas``, ``Table.from_pandas`` and
  ``Array.from_pandas`` import pandas when called (pyarrow retries the import whenever
  pandas is actually required), and ``import pandas`` anywhere works as usual. A pandas
  Series passed to ``pa.array`` is still converted (as a sequence of values).
- Nothing else is withheld, and the import hook is removed before the function
  returns, whatever happens.
- Call it before the process's first pyarrow conversion; later it does nothing (the
  probe has run). Meant for console entry points (``upsertctl``), not for libraries:
  an application that mixes pandas and pyarrow should not call it.
- :func:`prefer_jemalloc` changes only the default pool of this process, never when the
  user chose one (``ARROW_DEFAULT_MEMORY_POOL``), and does nothing where pyarrow was
  built without jemalloc. Memory allocated before stays with its pool (Arrow frees
  each buffer through the pool that allocated it).
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType


class _WithholdPandas(importlib.abc.MetaPathFinder):
    """A finder that reports pandas as not installed (used only during the probe)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname == "pandas" or fullname.startswith("pandas."):
            raise ImportError("pandas is withheld from pyarrow's probe", name=fullname)
        return None


def defer_pandas() -> None:
    """Make pyarrow's pandas probe answer "no" without importing pandas (see above)."""
    if "pandas" in sys.modules:
        return
    import pyarrow as pa

    finder = _WithholdPandas()
    sys.meta_path.insert(0, finder)
    try:
        pa.array([0])  # runs the probe once; pyarrow remembers its answer
    finally:
        sys.meta_path.remove(finder)


POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"


def prefer_jemalloc() -> None:
    """Make jemalloc this process's default Arrow memory pool, unless ``POOL_ENV`` names
    one or pyarrow lacks jemalloc (see the module docstring)."""
    if os.environ.get(POOL_ENV, "").strip():
        return
    import pyarrow as pa

    try:
        pool = pa.jemalloc_memory_pool()
    except NotImplementedError:  # a pyarrow built without jemalloc
        return
    pa.set_memory_pool(pool)
