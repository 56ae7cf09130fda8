"""What drains emit: differential output updates and the per-key decisions behind them.

One :class:`DrainOutput` accumulates every drain of the timestamps about to be committed
(for instance a partial ``AtTime`` drain and the final ``ToUpper`` drain of the same
``ts``), then feeds the state once they are committed (:func:`apply_feedback`).

Invariants:

- ``updates`` holds ``(key, row, ts, diff)`` with ``diff`` in ``{-1, +1}``; rows are keyed
  (a row belongs to exactly one key). The updates of one drain are consolidated: one
  winning command per ``(ts, key)``, and setting a key to an identical row emits nothing.
  Across drains they may not be; :meth:`DrainOutput.consolidated` sums them.
- ``decisions`` lists, in drain order, every command that was applied (not skipped):
  ``(ts, key, row or None for a delete, order)``. A later drain applies a command for
  the same ``(ts, key)`` only if its order is greater (the skip rule), so for each
  ``(ts, key)`` the last listed decision is the one that defines the key at ``ts``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from upsert_core.state import ValueMetadata

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

    __slots__ = ("updates", "decisions", "counted_metadata")

    def __init__(self) -> None:
        self.updates: list[OutputUpdate] = []
        self.decisions: list[Decision] = []
        # Per key written provisionally: its metadata as the state's per-record stats
        # last counted it (before the first provisional write, which is not counted).
        self.counted_metadata: dict[UpsertKey, ValueMetadata | None] = {}

    def __len__(self) -> int:
        return len(self.updates)

    def clear(self) -> None:
        self.updates.clear()
        self.decisions.clear()
        self.counted_metadata.clear()

    def times(self) -> list[int]:
        """The distinct timestamps that have decisions, ascending."""
        return sorted({d.ts for d in self.decisions})

    def final_decisions(self) -> dict[UpsertKey, Decision]:
        """Per key, the decision at its greatest timestamp (last applied wins)."""
        out: dict[UpsertKey, Decision] = {}
        for d in sorted(self.decisions, key=lambda d: d.ts):  # stable: drain order kept
            out[d.key] = d
        return out

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
