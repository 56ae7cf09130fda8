"""The two-level state (base + overlay) under every fold point, against a dict model.

``merge.with_changes``, ``merge.lookup`` and ``merge.fold`` are driven directly with
random sorted change sets (writes, removals, global-scope tombstones), fold thresholds
drawn per example so the overlay is folded at different points (never, always, after a
few keys, relative to the base), and keys that share their first 8 bytes or sit at the
ends of the key space. After every change:

- ``lookup`` of arbitrary (unsorted, repeated) keys answers as the model does;
- ``items()``, ``len()``, ``live_rows()`` equal the model, before and after ``fold``;
- the overlay's own invariants hold: sorted and unique, ``gone`` only for keys the base
  holds (batch scope only), ``in_base`` and ``base_index`` true of the base;
- the state the change was applied to still reads as before (nothing shared is
  modified).

The drain and the replay are also run with the same thresholds against the per-key
engine.
"""

from __future__ import annotations

import bisect

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.core.test_columnar_engine import (
    as_table,
    per_key_items,
    per_key_step,
    update_list,
)
from tests.core.test_drain_support import fresh_state
from upsert_core.columnar import (
    ColumnarState,
    apply_changes,
    drain_to_upper,
    join_keys,
    merge,
    split_keys,
)
from upsert_core.columnar.checkpoint_format import decode_state, encode_state
from upsert_core.columnar.state import strictly_increasing
from upsert_core.order_scope import OrderScope

N_KEYS = 24


def key(i: int) -> bytes:
    """Key ``i``: 0 and 1 are the ends of the key space, 2..11 share their first 8
    bytes (with 2 at the top of its run), 12..17 share them at the top of the space."""
    if i == 0:
        return b"\x00" * 16
    if i == 1:
        return b"\xff" * 16
    if i < 12:
        return b"\x07" * 8 + bytes([0] * 7 + [(i - 2) * 25 + 1])
    if i < 18:
        return b"\xff" * 8 + bytes([i * 9]) + b"\x00" * 7
    return bytes([i * 7 % 256, 1]) + b"\x00" * 6 + bytes([i]) * 8


thresholds_st = st.tuples(
    st.sampled_from([0, 1, 2, 3, 5, 8, 1 << 30]), st.sampled_from([0.0, 0.1, 0.25, 1.0, 4.0])
)
change_st = st.tuples(
    st.integers(0, N_KEYS - 1),
    st.sampled_from(["write", "remove", "keep"]),
    st.sampled_from([b"a", b"b", b"", None]),
    st.integers(-2, 5),
)
steps_st = st.lists(
    st.tuples(
        st.lists(change_st, max_size=12),
        st.lists(st.integers(0, N_KEYS - 1), max_size=8),  # keys to look up
        st.booleans(),  # fold explicitly afterwards
    ),
    min_size=1,
    max_size=12,
)


def check_levels(state: ColumnarState) -> None:
    assert strictly_increasing(state.hi, state.lo)
    if not state.keeps_orders:
        assert state.rows.null_count == 0
    ov = state.overlay
    if ov is None:
        return
    n = len(ov)
    assert len(ov.lo) == len(ov.rows) == len(ov.gone) == len(ov.in_base) == n
    assert len(ov.base_index) == n and (ov.orders is None) == (not state.keeps_orders)
    assert strictly_increasing(ov.hi, ov.lo)
    base = join_keys(state.hi, state.lo).to_pylist()
    for i, k in enumerate(join_keys(ov.hi, ov.lo).to_pylist()):
        assert bool(ov.in_base[i]) == (k in base)
        assert int(ov.base_index[i]) == bisect.bisect_left(base, k)
        if ov.gone[i]:
            assert ov.in_base[i] and not state.keeps_orders
            assert ov.rows[i].as_py() is None


def _numpy_columns(state: ColumnarState) -> list[np.ndarray]:
    """Copies of every numpy column of both levels."""
    columns = [state.hi, state.lo] + ([] if state.orders is None else [state.orders])
    ov = state.overlay
    if ov is not None:
        columns += [ov.hi, ov.lo, ov.gone, ov.in_base, ov.base_index]
        columns += [] if ov.orders is None else [ov.orders]
    return [c.copy() for c in columns]


def check_reads(state: ColumnarState, model: dict, queries: list[int]) -> None:
    expected = sorted((k, r, o) for k, (r, o) in model.items())
    assert list(state.items()) == expected
    assert len(state) == len(model)
    assert state.live_rows() == {k: r for k, (r, _o) in model.items() if r is not None}
    if not queries:
        return
    q_hi, q_lo = split_keys(pa.array([key(q) for q in queries], pa.binary()))
    look = merge.lookup(state, q_hi, q_lo)
    for j, q in enumerate(queries):
        held = model.get(key(q))
        assert bool(look.found[j]) == (held is not None)
        assert look.rows[j].as_py() == (None if held is None else held[0])
        if state.keeps_orders:
            assert look.orders is not None
            if held is not None:
                assert int(look.orders[j]) == held[1]


@pytest.mark.parametrize("keeps_orders", [False, True], ids=["batch", "global"])
@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(thresholds=thresholds_st, steps=steps_st)
def test_with_changes_lookup_fold_equal_the_model(
    keeps_orders: bool, thresholds: tuple[int, float], steps: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(merge, "FOLD_MIN_KEYS", thresholds[0])
    monkeypatch.setattr(merge, "FOLD_FRACTION", thresholds[1])
    state = ColumnarState.empty(keeps_orders)
    model: dict[bytes, tuple[bytes | None, int | None]] = {}
    for changes, queries, fold_after in steps:
        by_key = {}
        for k, what, row, order in changes:
            by_key[key(k)] = (what, row, order)
        keys = sorted(by_key)
        whats = [by_key[k][0] for k in keys]
        rows = [by_key[k][1] for k in keys]
        orders = [by_key[k][2] for k in keys]
        if not keeps_orders:
            # Batch scope: a written key holds a row; a removal never writes a tombstone.
            rows = [b"r" if r is None else r for r in rows]
            whats = ["remove" if w == "write" and by_key[k][1] is None else w
                     for k, w in zip(keys, whats, strict=True)]
        write = np.array([w == "write" for w in whats], bool)
        remove = np.array([w == "remove" for w in whats], bool)
        if keeps_orders:
            remove[:] = False  # the global scope stores tombstones, it never removes
        hi, lo = split_keys(pa.array(keys, pa.binary()))
        look = merge.lookup(state, hi, lo)
        before = list(state.items())
        arrays = _numpy_columns(state)
        look_arrays = [a.copy() for a in (look.found, look.base_index, look.in_base)]
        new = merge.with_changes(
            state, look, hi, lo, pa.array(rows, pa.binary()),
            np.array(orders, np.int64) if keeps_orders else None, write, remove,
        )
        assert list(state.items()) == before  # the old state is untouched
        assert all(np.array_equal(a, b) for a, b in zip(arrays, _numpy_columns(state),
                                                         strict=True))
        assert all(np.array_equal(a, b) for a, b in zip(
            look_arrays, (look.found, look.base_index, look.in_base), strict=True))
        for j, k in enumerate(keys):
            if write[j]:
                model[k] = (rows[j], orders[j] if keeps_orders else None)
            elif remove[j]:
                model.pop(k, None)
        state = new
        check_levels(state)
        check_reads(state, model, queries)
        folded = merge.fold(state)
        assert folded.overlay is None
        check_levels(folded)
        check_reads(folded, model, queries)
        if fold_after:
            state = folded


files_st = st.lists(
    st.lists(
        st.tuples(st.integers(0, N_KEYS - 1),
                  st.one_of(st.none(), st.sampled_from([b"a", b"b", b""])),
                  st.integers(0, 4)),
        max_size=14,
    ),
    min_size=1,
    max_size=8,
)


@pytest.mark.parametrize("scope", list(OrderScope))
@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(thresholds=thresholds_st, files=files_st)
def test_drain_and_replay_equal_the_per_key_engine_at_every_fold_point(
    scope: OrderScope, thresholds: tuple[int, float], files: list,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(merge, "FOLD_MIN_KEYS", thresholds[0])
    monkeypatch.setattr(merge, "FOLD_FRACTION", thresholds[1])
    import tests.core.test_columnar_engine as engine

    monkeypatch.setattr(engine, "key_of", key)
    old = fresh_state()
    state = ColumnarState.empty(keeps_orders=scope is OrderScope.GLOBAL)
    history: list[pa.Table] = []
    states = [state]
    for ts, rows in enumerate(files):
        expected = per_key_step(old, rows, ts, scope)
        result = drain_to_upper(state, as_table(rows), ts)
        assert sorted(update_list(result.updates)) == expected
        state = result.state
        check_levels(state)
        assert sorted(state.items()) == per_key_items(old)
        assert len(state) == len(per_key_items(old))
        decoded, _meta = decode_state(encode_state(state, {"upper": ts + 1}))
        assert list(decoded.items()) == list(state.items())
        history.append(result.updates)
        states.append(state)
    if scope is OrderScope.BATCH:
        for lower in range(len(files)):
            replayed, _ = apply_changes(states[lower], history[lower:])
            check_levels(replayed)
            assert list(replayed.items()) == list(state.items())
