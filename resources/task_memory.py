"""How much memory a Spark task of the ingest took: its Python worker's resident set.

The Spark engine's work happens in Python workers (``mapInArrow``/``applyInArrow``), so
Spark's own task metrics (``peakExecutionMemory``, the JVM's sort and aggregation
memory) do not see it. A task measures its worker itself and returns the figures with
its ``task:`` lines (``resources.spark_split.task_info``):

- ``rss_start``: the worker's resident set when the task began: the interpreter, its
  imports and whatever earlier tasks left in it (the bucket-state cache,
  ``upsert_core.ingest.statecache``, which holds the states of the buckets this worker
  drained before, up to ``UPSERT_STATE_CACHE_KEYS`` keys);
- ``peak_rss``: the worker's peak resident set during the task.

Invariants: on Linux the peak is reset at the task's start (writing ``5`` to
``/proc/self/clear_refs`` sets ``VmHWM`` to the current resident set), so it is the
peak of this task alone; where that is not possible (another OS, a kernel that refuses)
the peak is the process's (``VmHWM`` since its start or a last reset, else
``getrusage``), an upper bound, and ``exact`` says so. Measuring costs a write and two
small reads of ``/proc`` per task, and never raises (a figure that cannot be read is 0;
where there is no ``resource`` module, which is POSIX only, the module still imports).
Only exact figures give a task's growth (``resources.spark_lines.task_memory``): an
inexact peak may be an earlier task's.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"
_RESET_PEAK = "5"  # clear_refs: reset the peak resident set size (Linux >= 4.0)


def _status_kb(name: str) -> int | None:
    try:
        with open(_STATUS) as fh:
            for line in fh:
                if line.startswith(f"{name}:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def current_rss() -> int:
    """This process's resident set in bytes (0 when unknown)."""
    kb = _status_kb("VmRSS")
    return 0 if kb is None else kb * 1024


def _lifetime_peak() -> int:
    """The process's peak resident set in bytes by ``getrusage`` (0 where there is none)."""
    try:
        import resource  # heavy: no; POSIX only, imported here so the module loads everywhere
    except ImportError:
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes there, KiB on Linux


def _reset_peak() -> bool:
    try:
        with open(_CLEAR_REFS, "w") as fh:
            fh.write(_RESET_PEAK)
    except OSError:
        return False
    return _status_kb("VmHWM") is not None


@dataclass
class TaskMemory:
    """The memory of one task, from its start (construction) to each :meth:`figures`."""

    exact: bool = field(init=False)
    rss_start: int = field(init=False)

    def __post_init__(self) -> None:
        self.rss_start = current_rss()
        self.exact = os.name == "posix" and _reset_peak()

    def peak(self) -> int:
        """The peak resident set since the start (exact) or of the process (not)."""
        kb = _status_kb("VmHWM")
        if kb is not None:
            return kb * 1024
        return max(_lifetime_peak(), current_rss())

    def figures(self) -> dict[str, int | bool]:
        """What a ``task:`` line carries: ``rss_start``, ``peak_rss``, ``exact``."""
        return {"rss_start": self.rss_start, "peak_rss": self.peak(), "exact": self.exact}
