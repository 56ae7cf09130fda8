"""Review checks of the columnar engine beyond ``test_columnar_engine``: richer keys
(several sharing their first or last 8 bytes, high bytes), arbitrary row bytes (high
bytes, prefixes of each other), orders with many ties, and states not built by the
drain (rehydrated global-scope states, states with tombstones)."""

from __future__ import annotations

import bisect

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.core.test_columnar_engine import ROWS_SCHEMA, per_key_items, update_list
from tests.core.test_columnar_engine import per_key_step as engine_step
from tests.core.test_drain_support import fresh_state
from tests.oracle.drain import (
    OrderScope,
)
from upsert_core.columnar import (
    ColumnarState,
    apply_changes,
    drain_to_upper,
    locate,
    split_keys,
    state_from_snapshot,
)
from upsert_core.columnar.merge import merge_changes
from upsert_core.persist.write.consolidate import UPDATE_SCHEMA, sort_updates

_HALVES = [b"\x00" * 8, b"\x7f" + b"\xff" * 7, b"\x80" + b"\x00" * 7, b"\xff" * 8, b"\x07" * 8]
KEYS = sorted({a + b for a in _HALVES for b in _HALVES[:3]})

rows_st = st.tuples(
    st.sampled_from(KEYS),
    st.one_of(st.none(), st.binary(max_size=3)),
    st.integers(-2, 2),
)
files_st = st.lists(st.lists(rows_st, max_size=14), min_size=1, max_size=5)


def as_table(rows: list[tuple[bytes, bytes | None, int]]) -> pa.Table:
    return pa.table(
        [
            pa.array([k for k, _, _ in rows], pa.binary()),
            pa.array([b"\xee" if v is None else v for _, v, _ in rows], pa.binary()),
            pa.array([v is None for _, v, _ in rows], pa.bool_()),
            pa.array([o for _, _, o in rows], pa.int64()),
            pa.array([3 * i + 1 for i in range(len(rows))], pa.int64()),
        ],
        schema=ROWS_SCHEMA,
    )


def per_key_step(state, rows, ts: int, scope: OrderScope) -> list[tuple]:  # noqa: ANN001
    positions = np.array([3 * i + 1 for i in range(len(rows))], np.int64)
    return engine_step(state, rows, ts, scope, key=lambda k: k, positions=positions)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files=files_st, scope=st.sampled_from(list(OrderScope)))
def test_drain_equals_per_key_engine_with_rich_keys_and_rows(files, scope) -> None:
    old = fresh_state()
    state = ColumnarState.empty(keeps_orders=scope is OrderScope.GLOBAL)
    history: list[pa.Table] = []
    states = [state]
    for ts, rows in enumerate(files):
        expected = per_key_step(old, rows, ts, scope)
        result = drain_to_upper(state, as_table(rows), ts)
        got = update_list(result.updates)
        assert sorted(got) == expected
        # Exactly the order a part is stored in (the presorted write skips the sort).
        assert update_list(sort_updates(result.updates)) == got
        state = result.state
        assert sorted(state.items()) == per_key_items(old)
        history.append(result.updates)
        states.append(state)
    if scope is OrderScope.BATCH:
        assert list(state_from_snapshot(history).items()) == list(state.items())
        for lower in range(len(files)):
            replayed, _ = apply_changes(states[lower], history[lower:])
            assert list(replayed.items()) == list(state.items())
            # Shuffled parts (the unmerged read concatenates parts in any order).
            shuffled = [t for t in reversed(history[lower:])]
            replayed, _ = apply_changes(states[lower], shuffled)
            assert list(replayed.items()) == list(state.items())


@settings(max_examples=200, deadline=None)
@given(
    stored=st.sets(st.sampled_from(KEYS)),
    queries=st.lists(st.sampled_from(KEYS), max_size=12),
)
def test_locate_equals_bisect(stored, queries) -> None:
    keys = sorted(stored)
    hi, lo = split_keys(pa.array(keys, pa.binary()))
    q_hi, q_lo = split_keys(pa.array(queries, pa.binary()))
    index, found = locate(hi, lo, q_hi, q_lo)
    for q, i, f in zip(queries, index.tolist(), found.tolist(), strict=True):
        assert f == (q in stored)
        assert i == bisect.bisect_left(keys, q)


@settings(max_examples=300, deadline=None)
@given(
    stored=st.dictionaries(st.sampled_from(KEYS), st.binary(max_size=2)),
    changes=st.dictionaries(
        st.sampled_from(KEYS), st.one_of(st.none(), st.binary(max_size=2))
    ),
    keep_orders=st.booleans(),
)
def test_merge_changes_equals_dict_update(stored, changes, keep_orders) -> None:
    keys = sorted(stored)
    hi, lo = split_keys(pa.array(keys, pa.binary(16)))
    orders = np.arange(len(keys), dtype=np.int64) if keep_orders else None
    state = ColumnarState.checked(
        hi, lo, pa.array([stored[k] for k in keys], pa.large_binary()), orders
    )
    q = sorted(changes)
    q_hi, q_lo = split_keys(pa.array(q, pa.binary(16)))
    index, found = locate(state.hi, state.lo, q_hi, q_lo)
    new_rows = pa.array([changes[k] or b"" for k in q], pa.large_binary())
    write = np.array([changes[k] is not None for k in q], bool)
    remove = ~write
    q_orders = np.arange(100, 100 + len(q), dtype=np.int64)
    merged = merge_changes(
        state, index, found, q_hi, q_lo, new_rows, q_orders if keep_orders else None,
        write, remove,
    )
    expected = dict(stored)
    expected_orders = {k: i for i, k in enumerate(keys)}
    for j, k in enumerate(q):
        if changes[k] is None:
            expected.pop(k, None)
        else:
            expected[k] = changes[k]
            expected_orders[k] = 100 + j
    got = list(merged.items())
    assert [k for k, _, _ in got] == sorted(expected)
    assert {k: r for k, r, _ in got} == expected
    if keep_orders:
        assert {k: o for k, _, o in got} == {k: expected_orders[k] for k in expected}
    ColumnarState.checked(merged.hi, merged.lo, merged.rows, merged.orders)  # invariants hold


def test_updates_empty_table_schema() -> None:
    state = ColumnarState.empty(False)
    result = drain_to_upper(state, as_table([(KEYS[0], None, 1)]), 0)
    assert result.updates.schema == UPDATE_SCHEMA and result.updates.num_rows == 0


def test_split_keys_refuses_fixed_width_keys_of_another_width() -> None:
    # A 32-byte fixed-width key column was read as 16-byte keys (the first half of
    # the first keys), an 8-byte one failed with a ValueError.
    import pytest

    from upsert_core.errors import InvalidUpsertState

    for width in (8, 32):
        keys = pa.array([bytes(range(width))] * 3, pa.binary(width)).slice(1)
        with pytest.raises(InvalidUpsertState):
            split_keys(keys)
    keys = pa.array([bytes(range(16)), bytes(range(1, 17))] * 2, pa.binary(16)).slice(1)
    hi, lo = split_keys(keys)
    assert [int(h).to_bytes(8, "big") + int(x).to_bytes(8, "big")
            for h, x in zip(hi, lo, strict=True)] == keys.to_pylist()


def _model_replay(stored: dict[bytes, bytes], changes) -> dict[bytes, bytes] | None:
    """Consolidate per (key, row, ts), then apply per key in time order, retraction
    first, strictly; None where the consolidated changes are not a valid chain."""
    sums: dict[tuple[bytes, bytes, int], int] = {}
    for k, r, t, d in changes:
        sums[(k, r, t)] = sums.get((k, r, t), 0) + d
    out = dict(stored)
    for k, r, _t, d in sorted(((k, r, t, d) for (k, r, t), d in sums.items() if d),
                             key=lambda c: (c[0], c[2], c[3])):
        if d == -1 and out.get(k) == r:
            del out[k]
        elif d == 1 and k not in out:
            out[k] = r
        else:
            return None
    return out


change_st = st.tuples(
    st.sampled_from(KEYS[:6]), st.sampled_from([b"", b"a", b"b", b"\x80"]),
    st.integers(0, 2), st.sampled_from([-1, 1, 1, -1, 2]),
)


@settings(max_examples=500, deadline=None)
@given(
    stored=st.dictionaries(st.sampled_from(KEYS[:6]), st.sampled_from([b"", b"a", b"b"])),
    changes=st.lists(change_st, max_size=10),
)
def test_apply_changes_never_accepts_what_the_consolidated_chain_refuses(
    stored, changes
) -> None:
    keys = sorted(stored)
    hi, lo = split_keys(pa.array(keys, pa.binary(16)))
    state = ColumnarState.checked(
        hi, lo, pa.array([stored[k] for k in keys], pa.large_binary()), None
    )
    table = pa.table(
        [pa.array([c[0] for c in changes], pa.binary()),
         pa.array([c[1] for c in changes], pa.binary()),
         pa.array([c[2] for c in changes], pa.int64()),
         pa.array([c[3] for c in changes], pa.int64())],
        schema=UPDATE_SCHEMA,
    )
    expected = _model_replay(stored, changes)
    try:
        got, _ = apply_changes(state, [table])
    except Exception as exc:  # noqa: BLE001
        from upsert_core.errors import InvalidUpsertState

        assert isinstance(exc, InvalidUpsertState)
        return  # refusing costs a fallback / rehydration only
    assert expected is not None, "an invalid change sequence was applied"
    assert got.live_rows() == expected
