"""What drains emit: differential output updates and the per-key decisions behind them.

One :class:`DrainOutput` accumulates every drain of the timestamps about to be committed
(for instance a partial ``AtTime`` drain and the final ``ToUpper`` drain of the same
``ts``), then feeds the state once they are committed (:func:`apply_feedback`).

Invariants:

- ``updates`` holds ``(key, row, ts, diff)`` with ``diff`` in ``{-1, +1}``; rows are keyed
  (a row belongs to exactly one key). The updates of one drain are consolidated: one
  winning command per ``(ts, key)``, and setting a key to an identical row emits nothing.
  Across drains they may not be; :meth:`DrainOutput.consolidated` sums them.
- Every command a drain applied (not skipped) is a decision: ``(ts, key, row or None
  for a delete, order)``. They are kept column-wise (the drain's winners and a mask) and
  built only when asked for. A later drain applies a command for the same ``(ts, key)``
  only if its order is greater (the skip rule), so for each ``(ts, key)`` the last
  decision is the one that defines the key at ``ts``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from tests.oracle.drain.stash import StagedColumns
from tests.oracle.state import ValueMetadata

UpsertKey = bytes
OrderKey = tuple[int, int]
OutputUpdate = tuple[UpsertKey, bytes, int, int]


class Decision(NamedTuple):
    """The winning command for one ``(ts, key)``: a row, or None for a delete."""

    ts: int
    key: UpsertKey
    value: bytes | None
    order: OrderKey


class DrainOutput:
    """Accumulated output of drains; see the module docstring."""

    __slots__ = ("updates", "_decided", "counted_metadata")

    def __init__(self) -> None:
        self.updates: list[OutputUpdate] = []
        self._decided: list[tuple[StagedColumns, npt.NDArray[np.bool_]]] = []
        # Per key written provisionally: its metadata as the state's per-record stats
        # last counted it (before the first provisional write, which is not counted).
        self.counted_metadata: dict[UpsertKey, ValueMetadata | None] = {}

    def __len__(self) -> int:
        return len(self.updates)

    def clear(self) -> None:
        self.updates.clear()
        self._decided.clear()
        self.counted_metadata.clear()

    def add_decisions(self, winners: StagedColumns, applied: npt.NDArray[np.bool_]) -> None:
        """Record the ``winners`` of one drain whose ``applied`` flag is set."""
        if applied.any():
            self._decided.append((winners, applied))

    def final_columns(self) -> tuple[list[UpsertKey], list[bytes | None], list[int]]:
        """Per key, its last decision: ``(keys, rows or None, order values)`` columns.

        "Last" means at the greatest timestamp and, within it, from the latest drain.
        """
        blocks = [win if applied.all() else win.select(applied) for win, applied in self._decided]
        if not blocks:
            return [], [], []
        cat = StagedColumns.concat(blocks)
        several_ts = bool(cat.ts.min() != cat.ts.max())
        if several_ts:
            cat = cat.select(np.argsort(cat.ts, kind="stable"))  # keeps drain order per ts
        keys: list[UpsertKey] = cat.keys.tolist()
        if several_ts or len(blocks) > 1:
            last = {k: i for i, k in enumerate(keys)}
            if len(last) != len(keys):
                cat = cat.select(np.fromiter(last.values(), dtype=np.intp, count=len(last)))
                keys = cat.keys.tolist()
        return keys, cat.values.tolist(), cat.orders.tolist()

    def decisions(self) -> list[Decision]:
        """Every applied command, in drain order (within a drain: by ``(ts, key)``)."""
        out: list[Decision] = []
        for win, applied in self._decided:
            sel = win if applied.all() else win.select(applied)
            orders = zip(sel.orders.tolist(), sel.positions.tolist(), strict=True)
            rows = zip(sel.ts.tolist(), sel.keys.tolist(), sel.values.tolist(), orders, strict=True)
            out += map(Decision._make, rows)
        return out

    def times(self) -> list[int]:
        """The distinct timestamps that have decisions, ascending."""
        return sorted({int(t) for win, applied in self._decided for t in win.ts[applied]})

    def consolidated(self) -> list[OutputUpdate]:
        """The updates with equal ``(key, row, ts)`` summed and zero sums dropped.

        Sorted by ``(ts, key, diff, row)`` so the result is deterministic.
        """
        sums: dict[tuple[UpsertKey, bytes, int], int] = {}
        for key, row, ts, diff in self.updates:
            k = (key, row, ts)
            sums[k] = sums.get(k, 0) + diff
        out = [(key, row, ts, d) for (key, row, ts), d in sums.items() if d != 0]
        out.sort(key=lambda u: (u[2], u[0], u[3], u[1]))
        return out

    def rows(self) -> Iterator[tuple[bytes, int, int]]:
        """The consolidated updates as ``(row, ts, diff)``, what the shard stores."""
        for _key, row, ts, diff in self.consolidated():
            yield row, ts, diff
