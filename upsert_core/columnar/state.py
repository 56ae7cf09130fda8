"""``ColumnarState``: one bucket's upsert state as sorted columns, no object per key.

The state of a bucket is four aligned columns, sorted by key:

- ``hi``, ``lo`` (uint64): the 16-byte upsert key read as two big-endian halves, so
  the numeric order of ``(hi, lo)`` is the byte order of the key;
- ``rows`` (Arrow ``large_binary``): the key's current encoded row, null for a
  tombstone;
- ``orders`` (global order scope only): the order value the key was last decided with,
  tombstones included: int64 for one order column, order keys (numpy bytes,
  ``upsert_core.order_keys``) for an order of several columns.

It holds what the per-key ``StateValue`` holds once a snapshot is complete and every
timestamp below the shard's upper has been fed back: finalized values and (global
scope) finalized tombstones. Accumulators and provisional values never exist here:
consolidation (:mod:`~upsert_core.columnar.consolidate`) verifies a snapshot before a
state is built from it, and the ingest's drain is always ``ToUpper`` of one timestamp.

Two levels, so a batch's cost follows the batch and not the table: the columns above
are the *base*, and an optional :class:`Overlay` holds the keys changed since the base
was built (their current row or order, or that they were removed). Draining reads both
levels and writes only the overlay; once the overlay outgrows a fraction of the base it
is folded in (:mod:`~upsert_core.columnar.merge`). A checkpoint stores the folded state.

Invariants:

- Keys are strictly increasing by ``(hi, lo)``: unique and sorted, in each level. Every constructor
  that takes columns from outside (:meth:`ColumnarState.checked`) verifies this.
- All columns have the same length; ``orders`` is None exactly in the batch scope.
- Orders are of one kind in a state (both levels): int64 or order keys, never mixed
  (``order_keys.concat_orders`` refuses it; numpy would turn integers into text).
- Batch scope: ``rows`` has no nulls (a deleted key is absent), exactly what
  rehydration from the shard's snapshot yields.
- A state is never mutated: draining returns a new state, so a state taken from a
  cache or a checkpoint is never left half-updated by a failure. (The base is shared
  between a state and the states drained from it, which is safe because of this.)
- An overlay key is either live (``gone`` False: its row, null for a global-scope
  tombstone, and order replace the base's) or removed (``gone`` True: batch scope
  only, and only for keys the base holds). ``in_base``/``base_index`` say where the key
  is in the base (fixed, since the base never changes).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from upsert_core.codec import UPSERT_KEY_LEN
from upsert_core.errors import InvalidUpsertState
from upsert_core.order_keys import OrderArray, empty_orders, is_order_keys

U64 = npt.NDArray[np.uint64]
I64 = OrderArray
"""Orders: int64, or order keys (``upsert_core.order_keys``) for several order columns."""
Index = npt.NDArray[np.intp]
Mask = npt.NDArray[np.bool_]

ROW_TYPE = pa.large_binary()


def split_keys(keys: pa.Array | pa.ChunkedArray) -> tuple[U64, U64]:
    """``(hi, lo)`` halves of 16-byte keys (binary or fixed-size binary), vectorised."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    n = len(keys)
    if n == 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    if keys.null_count:
        raise InvalidUpsertState("upsert keys must not be null")
    if pa.types.is_fixed_size_binary(keys.type):
        if keys.type.byte_width != UPSERT_KEY_LEN:
            raise InvalidUpsertState(
                f"upsert keys must be {UPSERT_KEY_LEN} bytes, not {keys.type.byte_width}"
            )
    else:
        try:
            keys = keys.cast(pa.binary(UPSERT_KEY_LEN))
        except pa.ArrowInvalid as exc:
            raise InvalidUpsertState(f"upsert keys must be {UPSERT_KEY_LEN} bytes: {exc}") from exc
    data = np.frombuffer(
        keys.buffers()[1], dtype=">u8", count=2 * n, offset=keys.offset * UPSERT_KEY_LEN
    ).reshape(n, 2)
    return data[:, 0].astype(np.uint64), data[:, 1].astype(np.uint64)


def join_keys(hi: U64, lo: U64) -> pa.FixedSizeBinaryArray:
    """The 16-byte keys whose halves are ``hi`` and ``lo`` (inverse of :func:`split_keys`)."""
    n = len(hi)
    both = np.empty((n, 2), dtype=">u8")
    both[:, 0] = hi
    both[:, 1] = lo
    buffer = pa.py_buffer(both.view(np.uint8))  # no copy: the array keeps its memory
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(UPSERT_KEY_LEN), n, [None, buffer])


def strictly_increasing(hi: U64, lo: U64) -> bool:
    """Whether the keys ``(hi, lo)`` are sorted and unique."""
    if len(hi) <= 1:
        return True
    h0, h1 = hi[:-1], hi[1:]
    return bool(np.all((h1 > h0) | ((h1 == h0) & (lo[1:] > lo[:-1]))))


def locate(hi: U64, lo: U64, q_hi: U64, q_lo: U64) -> tuple[Index, Mask]:
    """For each query key, its index in the sorted keys ``(hi, lo)`` and whether it is
    there; an absent key gets the index it would be inserted at (keys stay sorted).

    One ``searchsorted`` on ``hi``; the rare queries whose ``hi`` is shared by several
    stored keys (digests nearly never share 8 bytes) are resolved one by one.
    """
    left = np.searchsorted(hi, q_hi, side="left")
    right = np.searchsorted(hi, q_hi, side="right")
    run = right - left
    index = left.astype(np.intp)
    found = np.zeros(len(q_hi), dtype=bool)
    single = run == 1
    cand = np.where(single, left, 0)
    if len(lo):
        lo_at = lo[cand]
        found = single & (lo_at == q_lo)
        # One stored key with this hi but a smaller lo: insert after it.
        index = np.where(single & (lo_at < q_lo), left + 1, left).astype(np.intp)
    for i in np.flatnonzero(run > 1).tolist():
        start, stop = int(left[i]), int(right[i])
        at = start + int(np.searchsorted(lo[start:stop], q_lo[i], side="left"))
        index[i] = at
        found[i] = at < stop and lo[at] == q_lo[i]
    return index, found


@dataclass(frozen=True)
class Overlay:
    """The keys changed since the base was built; see the module docstring."""

    hi: U64
    lo: U64
    rows: pa.LargeBinaryArray
    orders: I64 | None
    gone: Mask
    in_base: Mask
    base_index: Index

    def __len__(self) -> int:
        return len(self.hi)


@dataclass(frozen=True)
class ColumnarState:
    """A bucket's upsert state; see the module docstring."""

    hi: U64
    lo: U64
    rows: pa.LargeBinaryArray
    orders: I64 | None = None
    overlay: Overlay | None = None

    @classmethod
    def empty(cls, keeps_orders: bool, order_keys: bool = False) -> ColumnarState:
        """The empty state (``keeps_orders``: the global order scope; ``order_keys``: its
        orders are order keys, for an order of several columns)."""
        return cls(
            np.zeros(0, np.uint64),
            np.zeros(0, np.uint64),
            pa.array([], ROW_TYPE),
            empty_orders(order_keys) if keeps_orders else None,
        )

    @classmethod
    def checked(
        cls, hi: U64, lo: U64, rows: pa.Array, orders: I64 | None
    ) -> ColumnarState:
        """A state from outside columns, verified (:class:`InvalidUpsertState` if not)."""
        n = len(hi)
        if len(lo) != n or len(rows) != n or (orders is not None and len(orders) != n):
            raise InvalidUpsertState("upsert state columns have different lengths")
        if not strictly_increasing(hi, lo):
            raise InvalidUpsertState("upsert state keys are not sorted and unique")
        if orders is None and rows.null_count:
            raise InvalidUpsertState("a batch-scope upsert state holds tombstones")
        if rows.type != ROW_TYPE:
            rows = rows.cast(ROW_TYPE)
        return cls(
            np.ascontiguousarray(hi, dtype=np.uint64),
            np.ascontiguousarray(lo, dtype=np.uint64),
            rows,
            None if orders is None else np.ascontiguousarray(
                orders, dtype=orders.dtype if is_order_keys(orders) else np.int64),
        )

    @property
    def keeps_orders(self) -> bool:
        return self.orders is not None

    @property
    def has_order_keys(self) -> bool:
        """Whether the state's orders are order keys (several order columns)."""
        return self.orders is not None and is_order_keys(self.orders)

    def is_empty(self) -> bool:
        """No key in either level."""
        return len(self.hi) == 0 and (self.overlay is None or len(self.overlay) == 0)

    def __len__(self) -> int:
        """Keys held (tombstones included), both levels counted once."""
        ov = self.overlay
        if ov is None:
            return len(self.hi)
        added = int(np.count_nonzero(~ov.in_base & ~ov.gone))
        removed = int(np.count_nonzero(ov.in_base & ov.gone))
        return len(self.hi) + added - removed

    @property
    def nbytes(self) -> int:
        """Memory held by the columns of both levels."""
        total = self.hi.nbytes + self.lo.nbytes + self.rows.nbytes
        total += 0 if self.orders is None else self.orders.nbytes
        ov = self.overlay
        if ov is not None:
            total += ov.hi.nbytes + ov.lo.nbytes + ov.rows.nbytes + 2 * len(ov)
            total += ov.base_index.nbytes + (0 if ov.orders is None else ov.orders.nbytes)
        return int(total)

    def _level_items(self) -> Iterator[tuple[bytes, bytes | None, int | bytes | None]]:
        keys = join_keys(self.hi, self.lo).to_pylist()
        orders: list[int | bytes | None] = (
            [None] * len(keys) if self.orders is None else self.orders.tolist()
        )
        yield from zip(keys, self.rows.to_pylist(), orders, strict=True)

    def items(self) -> Iterator[tuple[bytes, bytes | None, int | bytes | None]]:
        """Every ``(key, row or None for a tombstone, order or None)``, in key order
        (for tests and checks; the ingest never iterates keys)."""
        ov = self.overlay
        if ov is None:
            yield from self._level_items()
            return
        changed = {
            k: (r, o, g)
            for k, r, o, g in zip(
                join_keys(ov.hi, ov.lo).to_pylist(), ov.rows.to_pylist(),
                [None] * len(ov) if ov.orders is None else ov.orders.tolist(),
                ov.gone.tolist(), strict=True,
            )
        }
        merged = {k: (r, o) for k, r, o in self._level_items()}
        for k, (r, o, g) in changed.items():
            if g:
                merged.pop(k, None)
            else:
                merged[k] = (r, o)
        for k in sorted(merged):
            yield k, merged[k][0], merged[k][1]

    def live_rows(self) -> dict[bytes, bytes]:
        """``{key: row}`` of every live key (tests and checks)."""
        return {k: r for k, r, _ in self.items() if r is not None}
