"""``gc_paused()``: no cyclic garbage collection while a bulk step allocates.

Consolidation, draining and feedback allocate one or two small objects per key (output
tuples, state values). With a state of a million live objects, CPython's cyclic
collector keeps re-scanning that whole heap while they are built, which costs more than
the work itself.
The objects built here form no reference cycles, so pausing the collector loses nothing;
reference counting still frees everything as usual.

Invariants:

- The collector's previous setting is restored on exit, exceptions included; a caller
  that had disabled it keeps it disabled.
- SUBTLE: ``gc.disable`` is process-wide. Another thread allocating during the pause
  also runs without cyclic collection for that (short) time; nothing is lost, cycles are
  collected at the next collection after re-enabling.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
