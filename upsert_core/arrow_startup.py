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
   user time and a lower peak RSS (docs/benchmarks.md). The pool keeps freed pages for
   :data:`JEMALLOC_DECAY_MS` (10 s) before returning them, and glibc's malloc (numpy's
   arrays) keeps allocations up to 32 MB on its heap and 256 MB of freed heap
   (:func:`keep_freed_memory`): an ingest's maintenance pass at 1M keys faulted in
   750k pages with the defaults (2.5 s of system time), 390k with both.

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
- :func:`prefer_jemalloc` changes only the default pool of this process (and its
  decay), never when the user chose one (``ARROW_DEFAULT_MEMORY_POOL``), and does
  nothing where pyarrow was built without jemalloc. :func:`keep_freed_memory` only
  raises glibc's thresholds, and does nothing on another C library or when the user
  set them (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``GLIBC_TUNABLES``).
  Memory allocated before stays with its pool (Arrow frees
  each buffer through the pool that allocated it).
"""

from __future__ import annotations

import ctypes
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
        pa.jemalloc_set_decay_ms(JEMALLOC_DECAY_MS)
    except NotImplementedError:  # a pyarrow built without jemalloc
        return
    pa.set_memory_pool(pool)


JEMALLOC_DECAY_MS = 10_000
"""How long the jemalloc pool keeps freed pages before returning them to the kernel."""

_M_TRIM_THRESHOLD = -1  # mallopt(3) parameters
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20
"""glibc's largest mmap threshold on 64-bit: smaller allocations come from the heap."""
TRIM_THRESHOLD_BYTES = 256 << 20
"""Freed heap at the top kept by glibc instead of returned to the kernel."""


def keep_freed_memory() -> None:
    """Raise glibc malloc's mmap and trim thresholds for this process (see the module
    docstring); best effort."""
    if any(name in os.environ for name in
           ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")):
        return
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return
    mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
