"""The stash: source updates staged until a drain style makes them eligible.

Updates are kept column-wise (numpy arrays) so that selecting, sorting and
deduplicating a million of them costs a few vectorised passes, not Python loops.

Invariants:

- Every staged update has ``ts >= resume_upper``: earlier times are already reflected
  in the output shard (and so in the state), and are dropped on staging.
- Every staged update had a positive diff; a non-positive diff is rejected with
  :class:`InvalidSourceUpdate` and nothing of that call is staged.
- Every key is exactly 16 bytes (an ``UpsertKey``); it is also held as two big-endian
  ``uint64`` halves so that sorting the halves sorts the key bytes.
- ``position`` breaks ties between equal order values: the later row of a file wins.
  Staging order never matters; only ``(order value, position)`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from upsert_core.errors import InvalidSourceUpdate
from tests.oracle.state.gc_pause import gc_paused

KEY_LEN = 16

Int64Array = npt.NDArray[np.int64]
UInt64Array = npt.NDArray[np.uint64]
ObjectArray = npt.NDArray[np.object_]


class SourceUpdate(NamedTuple):
    """One source update, the per-row form of :meth:`Stash.stage`."""

    key: bytes
    value: bytes | None  # None deletes the key
    order: tuple[int, int]  # (order value, position)
    ts: int
    diff: int = 1


@dataclass(slots=True)
class StagedColumns:
    """A column-wise block of staged updates (all arrays have the same length)."""

    ts: Int64Array
    key_hi: UInt64Array
    key_lo: UInt64Array
    keys: ObjectArray  # bytes
    values: ObjectArray  # bytes | None
    orders: Int64Array
    positions: Int64Array

    def __len__(self) -> int:
        return int(self.ts.shape[0])

    def select(self, index: npt.NDArray[np.bool_] | npt.NDArray[np.intp]) -> StagedColumns:
        return StagedColumns(
            self.ts[index],
            self.key_hi[index],
            self.key_lo[index],
            self.keys[index],
            self.values[index],
            self.orders[index],
            self.positions[index],
        )

    @staticmethod
    def concat(blocks: Sequence[StagedColumns]) -> StagedColumns:
        if len(blocks) == 1:
            return blocks[0]
        return StagedColumns(
            np.concatenate([b.ts for b in blocks]),
            np.concatenate([b.key_hi for b in blocks]),
            np.concatenate([b.key_lo for b in blocks]),
            np.concatenate([b.keys for b in blocks]),
            np.concatenate([b.values for b in blocks]),
            np.concatenate([b.orders for b in blocks]),
            np.concatenate([b.positions for b in blocks]),
        )


def _object_array(items: Sequence[object]) -> ObjectArray:
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def _int64_column(name: str, data: int | Sequence[int] | npt.ArrayLike, n: int) -> Int64Array:
    """``data`` as an int64 column of length ``n`` (a scalar is repeated)."""
    try:
        arr = np.asarray(data)
    except (OverflowError, ValueError) as e:
        raise InvalidSourceUpdate(f"{name}: not an integer column ({e})") from e
    if arr.size and arr.dtype.kind not in "iu":
        raise InvalidSourceUpdate(f"{name} must be int64 integers, got {arr.dtype}")
    if arr.size and arr.dtype.kind == "u" and int(arr.max()) > np.iinfo(np.int64).max:
        raise InvalidSourceUpdate(f"{name} out of the int64 range")
    out = arr.astype(np.int64)
    if out.ndim == 0:
        return np.full(n, out, dtype=np.int64)
    if out.shape != (n,):
        raise InvalidSourceUpdate(f"{name} has shape {out.shape}, expected ({n},)")
    return out


def split_keys(keys: Sequence[bytes]) -> tuple[UInt64Array, UInt64Array]:
    """Check every key is 16 bytes and return its two big-endian uint64 halves."""
    n = len(keys)
    if n == 0:
        empty = np.empty(0, dtype=np.uint64)
        return empty, empty.copy()
    lengths = set(map(len, keys))
    if lengths != {KEY_LEN}:
        bad = next(i for i, k in enumerate(keys) if len(k) != KEY_LEN)
        raise InvalidSourceUpdate(
            f"upsert keys must be {KEY_LEN} bytes; update {bad} has {len(keys[bad])}"
        )
    halves = np.frombuffer(b"".join(keys), dtype=">u8").reshape(n, 2)
    return halves[:, 0].astype(np.uint64), halves[:, 1].astype(np.uint64)


class Stash:
    """Source updates waiting for a drain; see the module docstring for invariants."""

    def __init__(self, resume_upper: int = 0) -> None:
        self.resume_upper = resume_upper
        self._blocks: list[StagedColumns] = []
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def stage(
        self,
        ts: int | Sequence[int] | npt.ArrayLike,
        keys: Sequence[bytes],
        values: Sequence[bytes | None],
        orders: Sequence[int] | npt.ArrayLike,
        positions: Sequence[int] | npt.ArrayLike,
        diffs: Sequence[int] | npt.ArrayLike | None = None,
    ) -> int:
        """Stage updates given column-wise; returns how many were kept.

        ``ts`` may be one int for the whole block. ``diffs`` defaults to all 1. Raises
        :class:`InvalidSourceUpdate` (staging nothing) on a non-positive diff, a key that
        is not 16 bytes, or mismatched column lengths.
        """
        n = len(keys)
        if len(values) != n:
            raise InvalidSourceUpdate(f"{len(values)} values for {n} keys")
        ts_col = _int64_column("ts", ts, n)
        order_col = _int64_column("orders", orders, n)
        pos_col = _int64_column("positions", positions, n)
        if diffs is not None:
            diff_col = _int64_column("diffs", diffs, n)
            bad = np.flatnonzero(diff_col <= 0)
            if bad.size:
                i = int(bad[0])
                raise InvalidSourceUpdate(
                    f"invalid upsert input: update {i} (ts {int(ts_col[i])}) has diff "
                    f"{int(diff_col[i])}; source updates must have a positive diff"
                )
        with gc_paused():
            key_hi, key_lo = split_keys(keys)
            block = StagedColumns(
                ts_col,
                key_hi,
                key_lo,
                _object_array(keys),
                _object_array(values),
                order_col,
                pos_col,
            )
        keep = ts_col >= self.resume_upper
        if not keep.all():
            block = block.select(keep)
        if len(block):
            self._blocks.append(block)
            self._len += len(block)
        return len(block)

    def stage_updates(self, updates: Iterable[SourceUpdate]) -> int:
        """Per-row convenience form of :meth:`stage` (for tests and small inputs)."""
        rows = list(updates)
        for u in rows:
            if u.value is not None and not isinstance(u.value, bytes):
                raise InvalidSourceUpdate(f"value must be bytes or None, got {type(u.value)}")
        return self.stage(
            [u.ts for u in rows],
            [u.key for u in rows],
            [u.value for u in rows],
            [u.order[0] for u in rows],
            [u.order[1] for u in rows],
            [u.diff for u in rows],
        )

    def min_time(self) -> int | None:
        """The least staged timestamp, or None when the stash is empty."""
        if not self._len:
            return None
        return min(int(b.ts.min()) for b in self._blocks)

    def take(
        self, eligible: Callable[[Int64Array], npt.NDArray[np.bool_]]
    ) -> tuple[StagedColumns, int | None]:
        """Remove and return the updates ``eligible`` selects, and the least remaining ts."""
        if not self._blocks:
            return _empty_block(), None
        block = StagedColumns.concat(self._blocks)
        mask = eligible(block.ts)
        if mask.all():
            self._blocks, self._len = [], 0
            return block, None
        rest_mask = ~mask
        rest = block.select(rest_mask)
        self._blocks, self._len = [rest], len(rest)
        taken = block.select(mask) if mask.any() else _empty_block()
        return taken, int(rest.ts.min())


def _empty_block() -> StagedColumns:
    i64 = np.empty(0, dtype=np.int64)
    u64 = np.empty(0, dtype=np.uint64)
    obj = np.empty(0, dtype=object)
    return StagedColumns(i64, u64, u64.copy(), obj, obj.copy(), i64.copy(), i64.copy())
