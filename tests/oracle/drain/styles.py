"""Drain styles and order scopes: *which* staged updates may be drained, and how
orders are remembered once a timestamp is final.

Timestamps are ints; an upper (frontier) is the first timestamp that is not complete.

Invariants:

- ``ToUpper(input_upper, persist_upper)``: an update at ``ts`` is eligible iff its
  timestamp is complete on the source (``ts < input_upper``) and the state has learnt
  every earlier time from the output shard (``ts <= persist_upper``). Its output is final
  for ``ts``; the state is not written (it learns from feedback).
- ``AtTime(time, persist_upper)``: a partial drain of ``ts <= time`` (and
  ``ts <= persist_upper``) before the source closed ``time``. Its output may be retracted
  by a later drain of the same ``ts``; it writes provisional values into the state so
  that later drains see what was emitted.
- ``OrderScope.BATCH``: finalized state carries no order, so a later timestamp always
  overrides. ``OrderScope.GLOBAL``: finalized state keeps each key's order value
  (tombstones included) and updates whose order value is not greater are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from upsert_core.order_scope import OrderScope

__all__ = ["AtTime", "DrainStyle", "OrderScope", "ToUpper"]


@dataclass(frozen=True, slots=True)
class ToUpper:
    """Drain every update whose timestamp is complete and at the persist upper."""

    input_upper: int
    persist_upper: int

    def eligible(self, ts: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        return (ts < self.input_upper) & (ts <= self.persist_upper)

    @property
    def writes_provisional(self) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class AtTime:
    """Partially drain updates at or before ``time`` (the source has not closed it)."""

    time: int
    persist_upper: int

    def eligible(self, ts: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        return (ts <= self.time) & (ts <= self.persist_upper)

    @property
    def writes_provisional(self) -> bool:
        return True


DrainStyle = ToUpper | AtTime
