"""Helpers shared by the drain tests (no tests here): keys, states, collections.

The dict model of the upsert semantics is :mod:`tests.model`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from tests.oracle.drain import DrainOutput, OutputUpdate
from tests.oracle.state import UpsertState


def key(i: int) -> bytes:
    return i.to_bytes(16, "big")


def val(s: str) -> bytes:
    return s.encode()


def fresh_state(backend_name: str = "memory", tmp_path: Path | None = None) -> UpsertState:
    """An UpsertState with a completed (empty) snapshot, ready for draining."""
    from tests.oracle.backends import InMemoryBackend, SqliteBackend

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
