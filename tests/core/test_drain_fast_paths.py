"""The drain's fast paths agree with the plain definitions.

- ``winners`` (single timestamp: one-column sort and per-group maxima) keeps, per key,
  the update with the greatest ``(order, position)``, the last staged one on exact
  ties, in key order; also when distinct keys share their first 8 bytes.
- The single-timestamp ``ToUpper`` drain emits the same updates and decisions as the
  general per-winner path, over state cells of every shape (absent, finalized value or
  tombstone with and without an order, provisional at this or another ts, and an
  undecoded accumulator).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.oracle.backends import InMemoryBackend
from tests.oracle.drain import DrainOutput, Stash, ToUpper, winners
from tests.oracle.drain.operator import _drain_final_single_ts, _drain_general
from tests.oracle.state import PutValue, StateValue, UpsertState

# Keys 0 and 1 share their first 8 bytes.
KEYS = [b"\x07" * 8 + b"\x00" * 8, b"\x07" * 8 + b"\x01" * 8, b"\x02" * 16, b"\x09" * 16]
ROWS = [b"r1", b"r2", b"r3\x00"]

staged = st.lists(
    st.tuples(
        st.sampled_from(KEYS),
        st.none() | st.sampled_from(ROWS),
        st.integers(0, 3),  # order
        st.integers(0, 3),  # position: ties with equal order happen
    ),
    min_size=1,
    max_size=25,
)


def _stash(batches: list[list[tuple[bytes, bytes | None, int, int]]], ts: int) -> Stash:
    stash = Stash()
    for batch in batches:
        if batch:
            keys, values, orders, positions = (list(c) for c in zip(*batch, strict=True))
            stash.stage(ts, keys, values, orders, positions)
    return stash


@given(st.lists(staged, min_size=1, max_size=3))
def test_single_ts_winners_match_the_definition(
    batches: list[list[tuple[bytes, bytes | None, int, int]]],
) -> None:
    stash = _stash(batches, ts=4)
    block, _ = stash.take(ToUpper(5, 4).eligible)
    expected: dict[bytes, tuple[tuple[int, int], bytes | None]] = {}
    for k, v, o, p in (u for batch in batches for u in batch):
        if k not in expected or (o, p) >= expected[k][0]:  # >=: the later staged wins ties
            expected[k] = ((o, p), v)
    win = winners(block)
    got = {
        k: ((o, p), v)
        for k, v, o, p in zip(
            win.keys.tolist(),
            win.values.tolist(),
            win.orders.tolist(),
            win.positions.tolist(),
            strict=True,
        )
    }
    assert got == expected
    assert win.keys.tolist() == sorted(expected)


def _accumulator(value: bytes) -> StateValue:
    acc = StateValue.consolidating()
    acc.merge_update(value, 1)
    return acc


cells = st.one_of(
    st.none(),
    st.builds(
        StateValue.new_finalized_value,
        st.sampled_from(ROWS),
        st.none() | st.tuples(st.integers(0, 3), st.integers(0, 3)),
    ),
    st.builds(
        StateValue.finalized_tombstone, st.none() | st.tuples(st.integers(0, 3), st.integers(0, 3))
    ),
    st.builds(
        StateValue.new_provisional_value,
        st.sampled_from(ROWS),
        st.sampled_from([3, 4]),
        st.tuples(st.integers(0, 3), st.integers(0, 3)),
    ),
    st.builds(_accumulator, st.sampled_from(ROWS)),
)


def _state(cells_of: dict[bytes, StateValue | None]) -> UpsertState:
    state = UpsertState(InMemoryBackend())
    state.multi_put(
        [(k, PutValue(v, None)) for k, v in cells_of.items() if v is not None],
        update_per_record_stats=False,
    )
    return state


@given(staged, st.fixed_dictionaries({k: cells for k in KEYS}))
def test_single_ts_drain_equals_the_general_path(
    batch: list[tuple[bytes, bytes | None, int, int]],
    cells_of: dict[bytes, StateValue | None],
) -> None:
    outs = []
    for drain in (_drain_final_single_ts, _drain_general):
        state = _state(
            {k: None if v is None else StateValue.decode(v.encode()) for k, v in cells_of.items()}
        )
        block, _ = _stash([batch], ts=4).take(ToUpper(5, 4).eligible)
        out = DrainOutput()
        if drain is _drain_general:
            _drain_general(winners(block), state, ToUpper(5, 4), out)
        else:
            _drain_final_single_ts(winners(block), state, out)
        outs.append(out)
    fast, general = outs
    assert sorted(fast.updates) == sorted(general.updates)
    assert fast.decisions() == general.decisions()
