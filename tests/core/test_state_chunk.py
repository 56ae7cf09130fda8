"""Bulk consolidation (``tests.oracle.state.chunk``) equals the per-update fold.

The reference fold here is the definition: per key, start from ``to_consolidating()`` of
the stored value, ``merge_update`` each update in chunk order, restart from the empty
accumulator whenever ``merge_update`` reports all zero. The bulk fold must give the very
same accumulators (every field, ``xor_len`` included), the same decoded values, and
raise ``InvalidUpsertState`` for the same keys.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.oracle.backends import InMemoryBackend
from upsert_core.errors import InvalidUpsertState
from tests.oracle.state import StateValue, UpsertState
from tests.oracle.state.chunk import fold_groups, group_chunk

Update = tuple[bytes, bytes, int]

# A small pool so that updates cancel out often (restart points), with trailing zeros.
VALUES = [b"", b"a", b"a\x00", b"bb", b"bb\x00\x00", b"ccc", b"\x00"]
values = st.sampled_from(VALUES)


def _accumulator(history: list[tuple[bytes, int]]) -> StateValue:
    acc = StateValue.consolidating()
    for v, d in history:
        acc.merge_update(v, d)
    return acc


bases = st.one_of(
    st.none(),
    st.builds(StateValue.new_finalized_value, values, st.none()),
    st.builds(StateValue.finalized_tombstone, st.none()),
    st.builds(StateValue.new_provisional_value, values, st.integers(0, 3), st.just((1, 2))),
    st.builds(_accumulator, st.lists(st.tuples(values, st.integers(-2, 2)), max_size=4)),
)


def reference_fold(
    keys: list[bytes], bases: list[StateValue | None], chunk: list[Update], decode: bool
) -> list[StateValue | None]:
    accs = {
        k: None if b is None else b.to_consolidating() for k, b in zip(keys, bases, strict=True)
    }
    for key, value, diff in chunk:
        acc = accs[key] or StateValue.consolidating()
        accs[key] = None if acc.merge_update(value, diff) else acc
    out = [accs[k] for k in keys]
    if decode:
        for acc in out:
            if acc is not None:
                acc.ensure_decoded()
    return out


def _fields(v: StateValue | None) -> object:
    return None if v is None else (v._fields(), v.memory_size(), v.encode())


def _check(chunk: list[Update], base_of: dict[bytes, StateValue | None], decode: bool) -> None:
    groups = group_chunk(chunk)
    assert groups is not None
    assert sorted(groups.keys) == sorted(set(k for k, _, _ in chunk))
    bases = [base_of.get(k) for k in groups.keys]
    try:
        expected = reference_fold(groups.keys, bases, chunk, decode)
    except InvalidUpsertState as e:
        with pytest.raises(InvalidUpsertState) as got:
            fold_groups(groups, bases, decode)
        assert _fields(got.value.state) == _fields(e.state)
        return
    assert [_fields(v) for v in fold_groups(groups, bases, decode)] == [
        _fields(v) for v in expected
    ]
    assert groups.inserts == sum(d > 0 for _, _, d in chunk)
    assert groups.deletes == sum(d < 0 for _, _, d in chunk)


# Keys 0 and 1 share their first 8 bytes (the fold must not merge them); key 2 is short.
KEYS16 = [b"\x01" * 8 + b"\x00" * 8, b"\x01" * 8 + b"\x02" * 8, b"\x03" * 16, b"\x04" * 16]


@given(
    st.lists(st.tuples(st.sampled_from(KEYS16), values, st.integers(-3, 3)), max_size=30),
    st.fixed_dictionaries({k: bases for k in KEYS16}),
    st.booleans(),
)
def test_bulk_fold_equals_the_per_update_fold(
    chunk: list[Update], base_of: dict[bytes, StateValue | None], decode: bool
) -> None:
    _check(chunk, base_of, decode)


@given(
    st.lists(st.tuples(st.sampled_from([b"k", b"key-2", b""]), values, st.integers(-2, 2))),
    st.booleans(),
)
def test_keys_of_any_length_are_grouped_too(chunk: list[Update], decode: bool) -> None:
    _check(chunk, {}, decode)


@given(st.lists(st.tuples(values, st.sampled_from([-1, 1])), min_size=1, max_size=12))
def test_xor_len_restarts_where_the_accumulator_returns_to_zero(
    history: list[tuple[bytes, int]],
) -> None:
    # A long value inserted and retracted first: a restart forgets its length.
    key = KEYS16[2]
    chunk = [(key, b"long-value", 1), (key, b"long-value", -1)]
    chunk += [(key, v, d) for v, d in history]
    _check(chunk, {}, decode=False)


def test_a_single_value_decodes_to_itself_and_overflowing_diffs_fall_back() -> None:
    key = KEYS16[3]
    groups = group_chunk([(key, b"row\x00", 1)])
    assert groups is not None
    (value,) = fold_groups(groups, [None], decode=True)
    assert value == StateValue.new_finalized_value(b"row\x00", None)
    huge = [(key, b"x", 2**64 + 1), (key, b"x", -(2**64))]
    assert group_chunk(huge) is None
    state = UpsertState(InMemoryBackend())
    stats = state.consolidate_chunk(huge, completes_snapshot=True)
    assert dict(state.items()) == {key: StateValue.new_finalized_value(b"x", None)}
    assert stats.inserts == 1 and stats.deletes == 1 and stats.values_diff == 1
