"""Reading and writing a :class:`ColumnarState`'s two levels, vectorised.

Both the drain's feedback and the replay of the shard's changes end the same way: a
sorted, unique set of keys, each either written (a row, or null for a tombstone, and
an order) or removed. :func:`lookup` reads those keys through both levels;
:func:`with_changes` writes them into the overlay only (cost: the batch plus the
overlay, not the table); :func:`fold` merges the overlay into a new base (cost: the
table), which :func:`with_changes` does once the overlay holds more than
``FOLD_FRACTION`` of the base (at least ``FOLD_MIN_KEYS``) keys, and checkpoints do
before writing. Nothing is done per key in Python.

Invariants:

- Every level stays sorted and unique: a written key absent from a level is inserted
  at the position ``locate`` found for it; present keys keep their place.
- No input is modified (new levels are returned; the base is shared, never changed).
- Removing an absent key is a no-op; writing and removing the same key is refused.
- Reading a state gives the same answers before and after :func:`fold`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from upsert_core.columnar.derived_rows import DerivedRows, as_row_array
from upsert_core.columnar.state import (
    I64,
    ROW_TYPE,
    U64,
    ColumnarState,
    Index,
    Mask,
    Overlay,
    locate,
)
from upsert_core.errors import InvalidUsage
from upsert_core.order_keys import concat_orders, zero_like

FOLD_FRACTION = 0.25
"""The overlay is folded into the base once it holds more than this fraction of it."""

FOLD_MIN_KEYS = 65_536
"""... and more than this many keys (small states are simply rewritten)."""


def merge_sources(n: int, index: Index, found: Mask, write: Mask, remove: Mask) -> Index:
    """Where each key of the merged level comes from, as indices into the level's
    ``n`` entries followed by the changes (see :func:`merge_changes`; a removed key
    comes from nowhere)."""
    replace = write & found
    insert = write & ~found
    drop = remove & found
    at = index[insert]  # ascending, since the query keys are sorted
    k = len(at)
    shift = np.searchsorted(at, np.arange(n), side="right") if k else 0
    level_final = np.arange(n, dtype=np.intp) + shift
    sources = np.empty(n + k, dtype=np.intp)
    sources[level_final] = np.arange(n, dtype=np.intp)
    sources[at + np.arange(k)] = n + np.flatnonzero(insert)
    replaced = np.flatnonzero(replace)
    sources[level_final[index[replaced]]] = n + replaced
    if drop.any():
        keep = np.ones(n + k, dtype=bool)
        keep[level_final[index[drop]]] = False
        sources = sources[keep]
    return sources


def _rows(
    level_rows: pa.Array | DerivedRows, rows: pa.Array, sources: Index
) -> pa.LargeBinaryArray | DerivedRows:
    if isinstance(level_rows, DerivedRows):
        # A base derived from values stays so: the changed rows are decoded into values
        # rather than every base row encoded (a fresh process never needs them all).
        merged = level_rows.merged(rows, sources)
        if merged is not None:
            return merged
    both = pa.concat_arrays([as_row_array(level_rows).cast(ROW_TYPE), rows.cast(ROW_TYPE)])
    taken: pa.LargeBinaryArray = both.take(pa.array(sources, pa.int64()))
    return taken


def merge_changes(
    state: ColumnarState,
    index: Index,
    found: Mask,
    hi: U64,
    lo: U64,
    rows: pa.Array,
    orders: I64 | None,
    write: Mask,
    remove: Mask,
) -> ColumnarState:
    """The base of ``state`` (which has no overlay) with query key ``j`` (``hi[j],
    lo[j]``, sorted and unique, located in it by ``locate`` as ``index[j], found[j]``)
    set to ``rows[j]`` (and ``orders[j]``) where ``write[j]``, and removed where
    ``remove[j]``."""
    if state.overlay is not None:
        raise InvalidUsage("merge_changes writes a single level; fold the overlay first")
    if np.any(write & remove):
        raise InvalidUsage("a key cannot be written and removed by one merge")
    if state.orders is not None and orders is None:
        raise InvalidUsage("a state that keeps orders needs the changes' orders")
    if not ((write & found).any() or (write & ~found).any() or (remove & found).any()):
        return state
    n = len(state.hi)
    if n == 0:
        # Into an empty state (an initial load): the written keys are the state.
        picked = np.flatnonzero(write)
        whole = len(picked) == len(hi)
        new_rows = rows if whole else rows.take(pa.array(picked, pa.int64()))
        new_orders = None if state.orders is None or orders is None else orders[picked]
        return ColumnarState(hi[picked], lo[picked], new_rows.cast(ROW_TYPE), new_orders)
    sources = merge_sources(n, index, found, write, remove)
    new_orders = None
    if state.orders is not None and orders is not None:
        new_orders = concat_orders([state.orders, orders])[sources]
    return ColumnarState(
        np.concatenate([state.hi, hi])[sources],
        np.concatenate([state.lo, lo])[sources],
        _rows(state.rows, rows, sources),
        new_orders,
    )


@dataclass(frozen=True)
class Lookup:
    """What :func:`lookup` found for sorted, unique query keys: whether each is held
    (tombstones count as held), its row (null if absent or a tombstone) and order, and
    where it sits in each level (for :func:`with_changes`)."""

    found: Mask
    rows: pa.LargeBinaryArray
    orders: I64 | None
    base_index: Index
    in_base: Mask
    overlay_index: Index | None
    in_overlay: Mask | None

    def select(self, index: Index) -> Lookup:
        """The answers for queries ``index`` only (as if only those keys were read)."""
        return Lookup(
            self.found[index],
            self.rows.take(pa.array(index, pa.int64())),
            None if self.orders is None else self.orders[index],
            self.base_index[index],
            self.in_base[index],
            None if self.overlay_index is None else self.overlay_index[index],
            None if self.in_overlay is None else self.in_overlay[index],
        )


def lookup(state: ColumnarState, hi: U64, lo: U64) -> Lookup:
    """Read keys through both levels of ``state`` (sorted and unique when the result goes
    to :func:`with_changes`; any keys otherwise)."""
    n = len(hi)
    b_index, b_found = locate(state.hi, state.lo, hi, lo)
    rows = (
        state.rows.take(pa.array(b_index, pa.int64(), mask=~b_found))
        if len(state.hi) else pa.nulls(n, ROW_TYPE)
    )
    orders = None
    if state.orders is not None:
        last = max(len(state.hi) - 1, 0)
        orders = np.where(
            b_found, state.orders[np.minimum(b_index, last)], zero_like(state.orders)
        ) if len(state.hi) else np.zeros(n, state.orders.dtype)
    found = b_found
    ov = state.overlay
    if ov is None or len(ov) == 0:
        return Lookup(found, rows, orders, b_index, b_found, None, None)
    o_index, o_found = locate(ov.hi, ov.lo, hi, lo)
    at = np.minimum(o_index, len(ov) - 1)
    gone = o_found & ov.gone[at]
    found = np.where(o_found, ~gone, b_found)
    o_rows = ov.rows.take(pa.array(o_index, pa.int64(), mask=~o_found))
    rows = pc.if_else(pa.array(o_found), o_rows, rows)
    if orders is not None and ov.orders is not None:
        if not len(state.hi):  # an empty base's filler takes the overlay's kind
            orders = np.zeros(n, ov.orders.dtype)
        orders = np.where(o_found, ov.orders[at], orders)
    return Lookup(found, rows, orders, b_index, b_found, o_index, o_found)


def with_changes(
    state: ColumnarState,
    look: Lookup,
    hi: U64,
    lo: U64,
    rows: pa.Array,
    orders: I64 | None,
    write: Mask,
    remove: Mask,
) -> ColumnarState:
    """``state`` with the sorted, unique keys ``hi, lo`` (read by ``look``) set to
    ``rows`` (and ``orders``) where ``write``, removed where ``remove``; the changes go
    to the overlay, which is folded into the base once it is large (module docstring)."""
    if np.any(write & remove):
        raise InvalidUsage("a key cannot be written and removed by one merge")
    if state.orders is not None and orders is None:
        raise InvalidUsage("a state that keeps orders needs the changes' orders")
    if state.overlay is None and len(state.hi) == 0:
        return merge_changes(state, look.base_index, look.in_base, hi, lo, rows, orders,
                             write, remove)
    # Removing a key only the overlay holds drops it; one the base holds marks it gone.
    mark_gone = remove & look.in_base
    entries = write | mark_gone
    ov = state.overlay
    in_overlay = look.in_overlay if look.in_overlay is not None else np.zeros(len(hi), bool)
    if not (entries.any() or (remove & in_overlay).any()):
        return state  # nothing changes (e.g. deletes of absent keys)
    if ov is None:
        pick = np.flatnonzero(entries)
        taken = rows.take(pa.array(pick, pa.int64())).cast(ROW_TYPE)
        gone = mark_gone[pick]
        if gone.any():
            taken = pc.if_else(pa.array(gone), pa.nulls(len(pick), ROW_TYPE), taken)
        overlay = Overlay(
            hi[pick], lo[pick], taken, None if orders is None else orders[pick],
            gone, look.in_base[pick], look.base_index[pick],
        )
    else:
        o_index = look.overlay_index if look.overlay_index is not None else np.zeros(
            len(hi), np.intp)
        o_found = in_overlay
        drop = remove & ~look.in_base  # present only in the overlay (if at all)
        sources = merge_sources(len(ov), o_index, o_found, entries, drop)
        change_rows = rows.cast(ROW_TYPE)
        if mark_gone.any():
            change_rows = pc.if_else(pa.array(mark_gone), pa.nulls(len(hi), ROW_TYPE),
                                     change_rows)
        new_orders = None
        if ov.orders is not None and orders is not None:
            new_orders = concat_orders([ov.orders, orders])[sources]
        overlay = Overlay(
            np.concatenate([ov.hi, hi])[sources],
            np.concatenate([ov.lo, lo])[sources],
            _rows(ov.rows, change_rows, sources),
            new_orders,
            np.concatenate([ov.gone, mark_gone])[sources],
            np.concatenate([ov.in_base, look.in_base])[sources],
            np.concatenate([ov.base_index, look.base_index])[sources],
        )
    result = ColumnarState(state.hi, state.lo, state.rows, state.orders, overlay)
    if len(overlay) > max(FOLD_MIN_KEYS, FOLD_FRACTION * len(state.hi)):
        return fold(result)
    return result


def fold(state: ColumnarState) -> ColumnarState:
    """``state`` as a single level (the overlay merged into a new base)."""
    ov = state.overlay
    if ov is None:
        return state
    base = ColumnarState(state.hi, state.lo, state.rows, state.orders)
    return merge_changes(
        base, ov.base_index, ov.in_base, ov.hi, ov.lo, ov.rows, ov.orders, ~ov.gone, ov.gone
    )
