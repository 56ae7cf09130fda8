"""Helpers shared by the drain tests (no tests here): keys, states, a dict upsert model."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from upsert_core.drain import DrainOutput, OrderScope, OutputUpdate
from upsert_core.state import UpsertState


def key(i: int) -> bytes:
    return i.to_bytes(16, "big")


def val(s: str) -> bytes:
    return s.encode()


def fresh_state(backend_name: str = "memory", tmp_path: Path | None = None) -> UpsertState:
    """An UpsertState with a completed (empty) snapshot, ready for draining."""
    from upsert_core.backends import InMemoryBackend, SqliteBackend

    if backend_name == "memory":
        state = UpsertState(InMemoryBackend())
    else:
        assert tmp_path is not None
        state = UpsertState(SqliteBackend(tmp_path / "state.sqlite"))
    state.consolidate_chunk([], completes_snapshot=True)
    return state


def collection(updates: Iterable[OutputUpdate]) -> Counter[tuple[bytes, bytes]]:
    """Accumulate ``(key, row, ts, diff)`` into ``(key, row) -> count`` (zeros dropped)."""
    acc: Counter[tuple[bytes, bytes]] = Counter()
    for k, row, _ts, diff in updates:
        acc[(k, row)] += diff
    return Counter({kr: c for kr, c in acc.items() if c != 0})


def is_consolidated(updates: list[OutputUpdate]) -> bool:
    """No ``(key, row, ts)`` twice and no zero diff."""
    seen = [(k, r, t) for k, r, t, _d in updates]
    return len(seen) == len(set(seen)) and all(d != 0 for *_rest, d in updates)


def output_of(out: DrainOutput) -> list[OutputUpdate]:
    return out.consolidated()


class UpsertModel:
    """Obviously correct upsert semantics of CONTRACT.md, one batch (ts) at a time.

    ``live[key] = (row, order value)``; ``tombstones[key] = order value`` (global only).
    """

    def __init__(self, scope: OrderScope) -> None:
        self.scope = scope
        self.live: dict[bytes, tuple[bytes, int]] = {}
        self.tombstones: dict[bytes, int] = {}

    def stored_order(self, k: bytes) -> int | None:
        if k in self.live:
            return self.live[k][1]
        return self.tombstones.get(k)

    def apply_batch(
        self, updates: Iterable[tuple[bytes, bytes | None, tuple[int, int]]]
    ) -> list[tuple[bytes, bytes, int]]:
        """Apply one batch; returns its changes as ``(key, row, diff)``."""
        best: dict[bytes, tuple[tuple[int, int], bytes | None]] = {}
        for k, v, order in updates:
            if k not in best or order > best[k][0]:
                best[k] = (order, v)
        changes: list[tuple[bytes, bytes, int]] = []
        for k, (order, v) in best.items():
            if self.scope is OrderScope.GLOBAL:
                stored = self.stored_order(k)
                if stored is not None and order[0] <= stored:
                    continue
            old = self.live.get(k, (None, 0))[0]
            if v is None:
                self.live.pop(k, None)
                if self.scope is OrderScope.GLOBAL:
                    self.tombstones[k] = order[0]
            else:
                self.live[k] = (v, order[0])
                self.tombstones.pop(k, None)
            if old != v:
                if old is not None:
                    changes.append((k, old, -1))
                if v is not None:
                    changes.append((k, v, 1))
        return changes

    def snapshot(self) -> Counter[tuple[bytes, bytes]]:
        return Counter({(k, v): 1 for k, (v, _o) in self.live.items()})
