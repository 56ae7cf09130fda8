"""Writing a sorted set of key changes into a :class:`ColumnarState`, vectorised.

Both the drain's feedback and the replay of the shard's changes end the same way: a
sorted, unique set of keys, each either written (a row, or null for a tombstone, and
an order) or removed. :func:`merge_changes` builds the new state from the old one with
a handful of numpy and Arrow passes (one ``take`` over the rows); nothing is done per
key in Python.

Invariants:

- The result is sorted and unique again: a written key absent from the state is
  inserted at the position ``locate`` found for it; present keys keep their place.
- The input state is not modified (a new state is returned).
- Removing an absent key is a no-op; writing and removing the same key is refused.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from upsert_core.columnar.state import I64, ROW_TYPE, U64, ColumnarState, Index, Mask
from upsert_core.errors import InvalidUsage


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
    """``state`` with query key ``j`` (``hi[j], lo[j]``, sorted and unique, located by
    ``locate`` as ``index[j], found[j]``) set to ``rows[j]`` (and ``orders[j]``) where
    ``write[j]``, and removed where ``remove[j]``."""
    if np.any(write & remove):
        raise InvalidUsage("a key cannot be written and removed by one merge")
    n = len(state)
    replace = write & found
    insert = write & ~found
    drop = remove & found
    if not (replace.any() or insert.any() or drop.any()):
        return state
    if n == 0 and not state.rows.null_count:
        # Into an empty state (an initial load): the written keys are the state.
        picked = np.flatnonzero(insert)
        whole = len(picked) == len(hi)
        take = None if whole else pa.array(picked, pa.int64())
        new_rows = rows.cast(ROW_TYPE) if whole else rows.take(take).cast(ROW_TYPE)
        new_orders = None if orders is None or state.orders is None else orders[picked]
        if state.orders is not None and new_orders is None:
            raise InvalidUsage("a state that keeps orders needs the changes' orders")
        return ColumnarState(hi[picked], lo[picked], new_rows, new_orders)
    at = index[insert]  # ascending, since the query keys are sorted
    k = len(at)
    shift = np.searchsorted(at, np.arange(n), side="right") if k else 0
    state_final = np.arange(n, dtype=np.intp) + shift
    sources = np.empty(n + k, dtype=np.intp)
    sources[state_final] = np.arange(n, dtype=np.intp)
    inserted = np.flatnonzero(insert)
    sources[at + np.arange(k)] = n + inserted
    replaced = np.flatnonzero(replace)
    sources[state_final[index[replaced]]] = n + replaced
    if drop.any():
        keep = np.ones(n + k, dtype=bool)
        keep[state_final[index[drop]]] = False
        sources = sources[keep]
    all_hi = np.concatenate([state.hi, hi])
    all_lo = np.concatenate([state.lo, lo])
    both = pa.concat_arrays([state.rows, rows.cast(ROW_TYPE)])
    new_rows = both.take(pa.array(sources, pa.int64()))
    new_orders = None
    if state.orders is not None:
        if orders is None:
            raise InvalidUsage("a state that keeps orders needs the changes' orders")
        new_orders = np.concatenate([state.orders, orders])[sources]
    return ColumnarState(all_hi[sources], all_lo[sources], new_rows, new_orders)
