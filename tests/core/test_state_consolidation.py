"""Snapshot and feedback consolidation through ``UpsertState.consolidate_chunk``.

Properties: any well-formed update history of a key (its current value at +1, earlier
values as +1/-1 pairs, shuffled, possibly with equal updates coalesced into one diff,
cut into arbitrary chunks) consolidates to the current value or to absence; a corrupted
history (a missing retraction, a duplicated insertion, a flipped byte, a wrong length)
raises ``InvalidUpsertState`` and is never decoded into a value.
"""

from __future__ import annotations

import random
from collections import Counter
from contextlib import closing
from dataclasses import dataclass

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from tests.core.conftest import BACKEND_KINDS, MakeBackend
from upsert_core.codec import encode_datums, key_digest
from upsert_core.errors import InvalidUpsertState, SnapshotAlreadyCompleted
from tests.oracle.state import PutValue, StateBackend, StateValue, UpsertState

Update = tuple[bytes, bytes, int]

# Encoded rows of a few datums: realistic values, including ones with trailing zeros.
row_values = st.one_of(
    st.binary(max_size=24),
    st.lists(
        st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=6)),
        max_size=3,
    ).map(encode_datums),
)

CORRUPTIONS = ("missing_retraction", "duplicated_insertion", "flipped_byte", "wrong_length")


@dataclass
class History:
    current: bytes | None
    updates: list[tuple[bytes, int]]


def _well_formed(updates: list[tuple[bytes, int]]) -> bool:
    """Whether the updates consolidate to nothing or to a single value at +1."""
    net: Counter[bytes] = Counter()
    for v, d in updates:
        net[v] += d
    nonzero = sorted(d for d in net.values() if d != 0)
    return nonzero in ([], [1])


@st.composite
def histories(draw: st.DrawFn, corruption: str | None = None) -> History:
    olds = draw(st.lists(row_values, max_size=4))
    current = draw(st.none() | row_values)
    if corruption in ("missing_retraction", "duplicated_insertion"):
        # Without a current value these look exactly like a valid history of another
        # current value, so they are only detectable (and only tested) with one.
        current = current if current is not None else draw(row_values)
    if corruption in ("missing_retraction", "flipped_byte", "wrong_length"):
        olds = olds or [draw(row_values)]
    updates = [(v, 1) for v in olds] + [(v, -1) for v in olds]
    if current is not None:
        updates.append((current, 1))
    if corruption == "missing_retraction":
        updates.remove((draw(st.sampled_from(olds)), -1))
    elif corruption == "duplicated_insertion":
        updates.append(draw(st.sampled_from([u for u in updates if u[1] > 0])))
    elif corruption in ("flipped_byte", "wrong_length"):
        # Corrupt one side of an old +1/-1 pair.
        candidates = list(range(2 * len(olds)))
        if corruption == "flipped_byte":
            candidates = [i for i in candidates if updates[i][0]]
            assume(candidates)
        i = draw(st.sampled_from(candidates))
        v, d = updates[i]
        if corruption == "flipped_byte":
            pos = draw(st.integers(0, len(v) - 1))
            mask = draw(st.integers(1, 255))
            v = v[:pos] + bytes([v[pos] ^ mask]) + v[pos + 1 :]
        else:
            v = v + b"\x00" if draw(st.booleans()) or not v or v[-1] != 0 else v[:-1]
        updates[i] = (v, d)
    if corruption is not None:
        # A corruption can happen to produce another well-formed history (retracting an
        # empty old value instead of b"\x00" is the same as b"\x00" being current):
        # nothing can tell those apart, so only truly ill-formed ones are kept.
        assume(not _well_formed(updates))
    if draw(st.booleans()):
        # Coalesce equal updates into one with the summed diff (persist may do this).
        counts = Counter(updates)
        updates = [(v, d * n) for (v, d), n in counts.items()]
    if corruption is None:
        assert _well_formed(updates)
    return History(current, updates)


def _keys(n: int) -> list[bytes]:
    return [key_digest(encode_datums(["key", i])) for i in range(n)]


def _chunks(data: st.DataObject, updates: list[Update]) -> list[list[Update]]:
    shuffled = data.draw(st.permutations(updates))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(shuffled)), max_size=6)))
    bounds = [0, *cuts, len(shuffled)]
    return [list(shuffled[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]


def _feed(state: UpsertState, chunks: list[list[Update]], complete: bool = True) -> None:
    for i, chunk in enumerate(chunks):
        state.consolidate_chunk(chunk, completes_snapshot=complete and i == len(chunks) - 1)


def _decoded(state: UpsertState) -> dict[bytes, bytes | None]:
    out = {}
    for key, sv in state.items():
        assert not sv.is_consolidating  # completion decoded everything
        out[key] = sv.finalized_value
    return out


def _snapshot(state: UpsertState) -> dict[bytes, bytes]:
    return {k: v.encode() for k, v in state.items()}


@pytest.mark.parametrize("kind", BACKEND_KINDS)
@given(st.lists(histories(), min_size=1, max_size=12), st.data())
def test_well_formed_histories_consolidate_to_the_current_values(
    kind: str, make_backend: MakeBackend, hists: list[History], data: st.DataObject
) -> None:
    keys = _keys(len(hists))
    updates = [(k, v, d) for k, h in zip(keys, hists, strict=True) for v, d in h.updates]
    with closing(make_backend(kind)) as backend:
        state = UpsertState(backend)
        _feed(state, _chunks(data, updates))
        assert state.snapshot_completed
        expected = {k: h.current for k, h in zip(keys, hists, strict=True)}
        assert _decoded(state) == {k: v for k, v in expected.items() if v is not None}
        # Merge stats add up to what the state holds.
        assert state.merge_stats.values_diff == len(state)
        assert state.merge_stats.updates == len(updates)
        assert state.merge_stats.inserts == sum(1 for u in updates if u[2] > 0)


@pytest.mark.parametrize("corruption", CORRUPTIONS)
@given(st.data())
def test_a_corrupted_history_is_never_decoded(
    corruption: str, make_backend: MakeBackend, data: st.DataObject
) -> None:
    hist = data.draw(histories(corruption))
    (key,) = _keys(1)
    with closing(make_backend("memory")) as backend:
        state = UpsertState(backend)
        chunks = _chunks(data, [(key, v, d) for v, d in hist.updates])
        _feed(state, chunks[:-1], complete=False)
        before = _snapshot(state)
        with pytest.raises(InvalidUpsertState) as info:
            state.consolidate_chunk(chunks[-1], completes_snapshot=True)
        # Completion decodes everything or nothing: the state is exactly as it was.
        assert isinstance(info.value.state, StateValue) and info.value.state.is_consolidating
        assert _snapshot(state) == before
        assert not state.snapshot_completed
        # Without completion the key stays an accumulator that refuses to decode (what
        # the drain meets if it reads the key before the snapshot is complete).
        state.consolidate_chunk(chunks[-1], completes_snapshot=False)
        stored = dict(state.items())
        with pytest.raises(InvalidUpsertState):
            stored[key].ensure_decoded()
        assert stored[key].is_consolidating


@given(
    st.lists(histories(), min_size=1, max_size=10),
    st.lists(st.sampled_from(CORRUPTIONS).flatmap(lambda c: histories(c)), min_size=1, max_size=4),
    st.data(),
)
def test_many_keys_only_the_corrupted_ones_fail(
    make_backend: MakeBackend,
    good: list[History],
    bad: list[History],
    data: st.DataObject,
) -> None:
    keys = _keys(len(good) + len(bad))
    good_keys, bad_keys = keys[: len(good)], keys[len(good) :]
    updates = [(k, v, d) for k, h in zip(keys, good + bad, strict=True) for v, d in h.updates]
    with closing(make_backend("memory")) as backend:
        state = UpsertState(backend)
        _feed(state, _chunks(data, updates), complete=False)
        stored = dict(state.items())
        for k in bad_keys:
            with pytest.raises(InvalidUpsertState):
                stored[k].ensure_decoded()
        for k, h in zip(good_keys, good, strict=True):
            if h.current is None:
                assert k not in stored
            else:
                stored[k].ensure_decoded()
                assert stored[k] == StateValue.finalized_value(h.current, None)
        # Completing the snapshot refuses the whole state and writes nothing.
        before = _snapshot(state)
        with pytest.raises(InvalidUpsertState):
            state.consolidate_chunk([], completes_snapshot=True)
        assert _snapshot(state) == before and not state.snapshot_completed


# --- deterministic behaviour, over every backend --------------------------------------

K1, K2, K3 = _keys(3)


def test_second_completion_raises(backend: StateBackend) -> None:
    state = UpsertState(backend)
    state.consolidate_chunk([(K1, b"a", 1)], completes_snapshot=True)
    with pytest.raises(SnapshotAlreadyCompleted):
        state.consolidate_chunk([], completes_snapshot=True)
    # Feedback chunks after completion are fine.
    state.consolidate_chunk(iter([(K1, b"a", -1), (K1, b"b", 1)]), completes_snapshot=False)
    assert dict(state.items()) == {K1: StateValue.finalized_value(b"b", None)}


def test_feedback_after_completion_replaces_finalized_and_provisional_values(
    backend: StateBackend,
) -> None:
    state = UpsertState(backend)
    state.consolidate_chunk([(K1, b"a", 1), (K2, b"b", 1)], completes_snapshot=True)
    # A partial drain wrote provisional values; feedback then brings the final truth.
    got = state.multi_get([K1, K2])
    state.multi_put(
        [
            (K1, PutValue(got[0].value.into_provisional_value(b"p", 5, (1, 0)), got[0].metadata)),  # type: ignore[union-attr]
            (K2, PutValue(got[1].value.into_provisional_tombstone(5, (1, 0)), got[1].metadata)),  # type: ignore[union-attr]
        ]
    )
    stats = state.consolidate_chunk(
        [(K1, b"a", -1), (K1, b"c", 1), (K2, b"b", -1), (K3, b"d", 1)],
        completes_snapshot=False,
    )
    assert dict(state.items()) == {
        K1: StateValue.finalized_value(b"c", None),
        K3: StateValue.finalized_value(b"d", None),
    }
    assert (stats.updates, stats.inserts, stats.deletes) == (4, 2, 2)
    assert stats.values_diff == 0  # K2 deleted, K3 inserted


def test_invalid_feedback_after_completion_raises_and_changes_nothing(
    backend: StateBackend,
) -> None:
    state = UpsertState(backend)
    state.consolidate_chunk([(K1, b"a", 1)], completes_snapshot=True)
    before = _snapshot(state)
    merge_before = (state.merge_stats.updates, state.merge_stats.values_diff)
    with pytest.raises(InvalidUpsertState):
        # Retracts a value that is not there (b"z" instead of b"a").
        state.consolidate_chunk([(K1, b"z", -1), (K1, b"b", 1), (K2, b"x", 1)], False)
    assert _snapshot(state) == before
    assert (state.merge_stats.updates, state.merge_stats.values_diff) == merge_before
    got = state.multi_get([K1])[0]
    assert got.value == StateValue.finalized_value(b"a", None)


def test_consolidation_deletes_keys_that_return_to_zero_mid_snapshot(
    backend: StateBackend,
) -> None:
    state = UpsertState(backend)
    state.consolidate_chunk([(K1, b"a", 1), (K2, b"b", 1)], completes_snapshot=False)
    assert len(state) == 2
    stats = state.consolidate_chunk([(K1, b"a", -1)], completes_snapshot=False)
    assert len(state) == 1 and stats.values_diff == -1 and stats.size_diff < 0
    # Before completion untouched keys stay accumulators ...
    (value,) = [v for _, v in state.items()]
    assert value.is_consolidating
    # ... and completing (even with an empty chunk) decodes them all.
    done = state.consolidate_chunk([], completes_snapshot=True)
    assert dict(state.items()) == {K2: StateValue.finalized_value(b"b", None)}
    assert done.values_diff == 0 and done.size_diff < 0  # decoded values are smaller


def test_merge_stats_sizes_match_the_backend(backend: StateBackend) -> None:
    state = UpsertState(backend)
    rng = random.Random(7)
    keys = _keys(30)
    for _ in range(5):
        chunk = [(rng.choice(keys), bytes(rng.randrange(4)) * rng.randrange(5), 1)]
        chunk += [(k, b"x" * rng.randrange(10), 1) for k in rng.sample(keys, 5)]
        state.consolidate_chunk(chunk, completes_snapshot=False)
    got = state.multi_get(keys)
    sizes = [g.metadata.size for g in got if g.metadata is not None]
    assert state.merge_stats.size_diff == sum(sizes)
    assert state.merge_stats.values_diff == len(sizes) == len(state)
