"""Keep pyarrow from importing pandas in a short-lived process that never uses it.

pyarrow asks "is pandas installed?" the first time almost any function converts a value
(``pa.array``, ``pa.scalar``, most compute calls), to recognise pandas objects, and
answers by importing pandas: 0.4-0.5 s here, a third of an ``upsertctl ingest`` of a
small file. :func:`defer_pandas` answers that first question with "no" without
importing pandas.

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
"""

from __future__ import annotations

import importlib.abc
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
