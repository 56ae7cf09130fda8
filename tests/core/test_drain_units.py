"""Unit tests of staging and draining: errors, filtering, tie and skip rules, no-op updates,
remaining times, and feedback in both order scopes, on both state backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.core.test_drain_support import collection, fresh_state, is_consolidated, key, val
from tests.oracle.drain import (
    GLOBAL_POSITION,
    AtTime,
    DrainOutput,
    OrderScope,
    SourceUpdate,
    Stash,
    ToUpper,
    apply_feedback,
    drain_staged_input,
)
from upsert_core.errors import InvalidSourceUpdate
from tests.oracle.state import UpsertState

K1, K2, K3 = key(1), key(2), key(3)


@pytest.fixture(params=["memory", "sqlite"])
def state(request: pytest.FixtureRequest, tmp_path: Path) -> UpsertState:
    return fresh_state(request.param, tmp_path)


def commit_batch(
    state: UpsertState,
    ts: int,
    rows: list[SourceUpdate],
    scope: OrderScope = OrderScope.BATCH,
) -> list[tuple[bytes, bytes, int, int]]:
    """Stage rows at ts, drain ToUpper, apply feedback; return the consolidated output."""
    stash = Stash(resume_upper=ts)
    assert stash.stage_updates([r._replace(ts=ts) for r in rows]) == len(rows)
    out = DrainOutput()
    assert drain_staged_input(stash, state, ToUpper(ts + 1, ts), out) is None
    apply_feedback(state, out, scope)
    return out.consolidated()


def up(k: bytes, v: str | None, order: int, pos: int = 0, ts: int = 0, diff: int = 1):
    return SourceUpdate(k, None if v is None else val(v), (order, pos), ts, diff)


# --- staging -------------------------------------------------------------------------


@pytest.mark.parametrize("bad_diff", [0, -1])
def test_non_positive_diff_is_an_error_and_stages_nothing(bad_diff: int) -> None:
    stash = Stash()
    with pytest.raises(InvalidSourceUpdate, match="diff"):
        stash.stage_updates([up(K1, "a", 1), up(K2, "b", 1, diff=bad_diff)])
    assert len(stash) == 0


def test_key_must_be_16_bytes() -> None:
    with pytest.raises(InvalidSourceUpdate, match="16 bytes"):
        Stash().stage([0], [b"short"], [b"v"], [1], [0])


def test_mismatched_columns_are_an_error() -> None:
    with pytest.raises(InvalidSourceUpdate):
        Stash().stage([0, 0], [K1, K2], [b"v", b"w"], [1], [0, 1])
    with pytest.raises(InvalidSourceUpdate):
        Stash().stage(0, [K1], [b"v"], [2**64], [0])


def test_staging_drops_updates_before_resume_upper() -> None:
    stash = Stash(resume_upper=5)
    kept = stash.stage([3, 4, 5, 6], [K1, K2, K3, K1], [b"a", b"b", b"c", b"d"], 1, [0, 1, 2, 3])
    assert kept == 2
    assert len(stash) == 2
    assert stash.min_time() == 5


def test_columnar_and_per_row_staging_agree(state: UpsertState) -> None:
    rows = [up(K1, "a", 2, 0), up(K1, "b", 2, 1), up(K2, "c", 1, 2)]
    a, b = Stash(), Stash()
    a.stage_updates(rows)
    b.stage(0, [r.key for r in rows], [r.value for r in rows], [2, 2, 1], [0, 1, 2])
    out_a, out_b = DrainOutput(), DrainOutput()
    drain_staged_input(a, state, ToUpper(1, 0), out_a)
    drain_staged_input(b, state, ToUpper(1, 0), out_b)
    assert out_a.consolidated() == out_b.consolidated()


# --- eligibility and remaining time -----------------------------------------------


def test_to_upper_drains_only_complete_times_at_the_persist_upper(state: UpsertState) -> None:
    stash = Stash()
    stash.stage_updates([up(K1, "a", 1, ts=0), up(K2, "b", 1, ts=1), up(K3, "c", 1, ts=2)])
    out = DrainOutput()
    # Source closed ts 0 and 1, but the state only knows times before 0: drain ts 0.
    assert drain_staged_input(stash, state, ToUpper(input_upper=2, persist_upper=0), out) == 1
    assert [(u[0], u[2]) for u in out.updates] == [(K1, 0)]
    assert len(stash) == 2
    # Source has not closed ts 2: only ts 1 drains.
    out = DrainOutput()
    assert drain_staged_input(stash, state, ToUpper(input_upper=2, persist_upper=5), out) == 2
    assert [(u[0], u[2]) for u in out.updates] == [(K2, 1)]
    out = DrainOutput()
    assert drain_staged_input(stash, state, ToUpper(input_upper=3, persist_upper=2), out) is None
    assert len(stash) == 0


def test_at_time_drains_up_to_time_and_reports_min_remaining(state: UpsertState) -> None:
    stash = Stash()
    stash.stage_updates([up(K1, "a", 1, ts=3), up(K2, "b", 1, ts=1), up(K3, "c", 1, ts=1)])
    out = DrainOutput()
    assert drain_staged_input(stash, state, AtTime(time=1, persist_upper=1), out) == 3
    assert sorted(u[0] for u in out.updates) == [K2, K3]
    # Nothing eligible: the stash is untouched and the min remaining time is reported.
    assert drain_staged_input(stash, state, AtTime(time=2, persist_upper=2), out) == 3
    assert len(stash) == 1


def test_empty_stash_has_no_remaining_time(state: UpsertState) -> None:
    assert drain_staged_input(Stash(), state, ToUpper(10, 10), DrainOutput()) is None


# --- tie, skip and no-op rules ------------------------------------------------------


def test_greatest_order_wins_then_greatest_position(state: UpsertState) -> None:
    # Staged in an order unrelated to (order, position).
    out = commit_batch(
        state,
        0,
        [
            up(K1, "late-row", 5, pos=9),
            up(K1, "early-row", 5, pos=2),
            up(K1, "low-order", 4, pos=20),
            up(K2, "high-order", 7, pos=1),
            up(K2, "higher-position", 6, pos=30),
        ],
    )
    assert out == [(K1, val("late-row"), 0, 1), (K2, val("high-order"), 0, 1)]


def test_winning_delete_in_a_batch(state: UpsertState) -> None:
    commit_batch(state, 0, [up(K1, "a", 1)])
    out = commit_batch(state, 1, [up(K1, "b", 3, pos=0), up(K1, None, 3, pos=1)])
    assert out == [(K1, val("a"), 1, -1)]
    # A delete of an absent key emits nothing.
    assert commit_batch(state, 2, [up(K2, None, 1)]) == []


def test_skip_rule_against_provisional_order(state: UpsertState) -> None:
    stash = Stash()
    stash.stage_updates([up(K1, "first", 5, pos=3)])
    out = DrainOutput()
    drain_staged_input(stash, state, AtTime(0, 0), out)
    assert out.updates == [(K1, val("first"), 0, 1)]
    # Lower order and an equal (order, position) are skipped: no output, no decision.
    stash.stage_updates([up(K1, "lower", 4, pos=99), up(K2, "other", 1)])
    drain_staged_input(stash, state, AtTime(0, 0), out)
    stash.stage_updates([up(K1, "equal", 5, pos=3)])
    drain_staged_input(stash, state, AtTime(0, 0), out)
    assert [u for u in out.updates if u[0] == K1] == [(K1, val("first"), 0, 1)]
    # A greater position with the same order value wins and retracts the provisional row.
    stash.stage_updates([up(K1, "later", 5, pos=4)])
    drain_staged_input(stash, state, ToUpper(1, 0), out)
    assert collection(out.updates) == {(K1, val("later")): 1, (K2, val("other")): 1}
    apply_feedback(state, out, OrderScope.BATCH)
    assert dict((k, v.finalized_value) for k, v in state.items()) == {
        K1: val("later"),
        K2: val("other"),
    }


def test_to_upper_overrides_provisional_delete(state: UpsertState) -> None:
    commit_batch(state, 0, [up(K1, "a", 1)])
    stash = Stash()
    stash.stage_updates([up(K1, None, 1, ts=1)])
    out = DrainOutput()
    drain_staged_input(stash, state, AtTime(1, 1), out)
    assert out.updates == [(K1, val("a"), 1, -1)]
    stash.stage_updates([up(K1, "b", 2, ts=1)])
    drain_staged_input(stash, state, ToUpper(2, 1), out)
    # The provisional tombstone hides "a": the later row is inserted without a retraction.
    assert out.consolidated() == [(K1, val("a"), 1, -1), (K1, val("b"), 1, 1)]


def test_identical_value_produces_no_change(state: UpsertState) -> None:
    commit_batch(state, 0, [up(K1, "same", 1)])
    assert commit_batch(state, 1, [up(K1, "same", 0)]) == []
    # Also across a partial drain that changed it provisionally.
    stash = Stash()
    stash.stage_updates([up(K1, "other", 1, pos=0, ts=2)])
    out = DrainOutput()
    drain_staged_input(stash, state, AtTime(2, 2), out)
    assert len(out.updates) == 2
    stash.stage_updates([up(K1, "same", 1, pos=1, ts=2)])
    drain_staged_input(stash, state, ToUpper(3, 2), out)
    assert out.consolidated() == []
    assert not is_consolidated(out.updates)  # the raw updates cancel; consolidated() is empty
    apply_feedback(state, out, OrderScope.BATCH)
    assert [v.finalized_value for _k, v in state.items()] == [val("same")]


# --- order scopes ---------------------------------------------------------------------


def test_batch_scope_later_batch_always_overrides(state: UpsertState) -> None:
    commit_batch(state, 0, [up(K1, "new", 10)])
    assert commit_batch(state, 1, [up(K1, "old", 1)]) == [
        (K1, val("new"), 1, -1),
        (K1, val("old"), 1, 1),
    ]
    # A batch-scope delete removes the key entirely: no tombstone is kept.
    commit_batch(state, 2, [up(K1, None, 1)])
    assert len(state) == 0


def test_global_scope_ignores_orders_not_greater_whatever_the_position(
    state: UpsertState,
) -> None:
    g = OrderScope.GLOBAL
    commit_batch(state, 0, [up(K1, "v10", 10, pos=0)], g)
    (stored,) = [v for _k, v in state.items()]
    assert stored.finalized_order == (10, GLOBAL_POSITION)
    assert commit_batch(state, 1, [up(K1, "v9", 9, pos=5)], g) == []
    assert commit_batch(state, 2, [up(K1, "v10-later-row", 10, pos=10**9)], g) == []
    assert commit_batch(state, 3, [up(K1, "v11", 11, pos=0)], g) == [
        (K1, val("v10"), 3, -1),
        (K1, val("v11"), 3, 1),
    ]


def test_global_scope_tombstone_of_unseen_key_blocks_late_data(state: UpsertState) -> None:
    g = OrderScope.GLOBAL
    assert commit_batch(state, 0, [up(K2, None, 7)], g) == []
    ((k, tomb),) = list(state.items())
    assert k == K2 and tomb.is_tombstone and tomb.finalized_order == (7, GLOBAL_POSITION)
    assert commit_batch(state, 1, [up(K2, "late", 7, pos=3)], g) == []
    assert commit_batch(state, 2, [up(K2, "newer", 8)], g) == [(K2, val("newer"), 2, 1)]


def test_global_scope_provisional_respects_finalized_order(state: UpsertState) -> None:
    g = OrderScope.GLOBAL
    commit_batch(state, 0, [up(K1, "v5", 5)], g)
    stash = Stash()
    stash.stage_updates([up(K1, "v4", 4, ts=1)])
    out = DrainOutput()
    drain_staged_input(stash, state, AtTime(1, 1), out)
    assert out.updates == [] and out.decisions() == []
    stash.stage_updates([up(K1, "v6", 6, ts=1)])
    drain_staged_input(stash, state, ToUpper(2, 1), out)
    apply_feedback(state, out, g)
    (stored,) = [v for _k, v in state.items()]
    assert (stored.finalized_value, stored.finalized_order) == (val("v6"), (6, GLOBAL_POSITION))


# --- feedback and rehydration ---------------------------------------------------------


def test_feedback_finalizes_provisional_values(state: UpsertState) -> None:
    stash = Stash()
    stash.stage_updates([up(K1, "a", 1), up(K2, None, 1)])
    out = DrainOutput()
    drain_staged_input(stash, state, AtTime(0, 0), out)
    provisional = dict(state.items())
    assert provisional[K1].provisional_value_ref(0) == val("a")
    assert provisional[K1].finalized_value is None
    drain_staged_input(stash, state, ToUpper(1, 0), out)
    apply_feedback(state, out, OrderScope.BATCH)
    final = dict(state.items())
    assert list(final) == [K1]
    assert final[K1].finalized_value == val("a") and final[K1].finalized_order is None
    assert final[K1].provisional_value_ref(1) == val("a")


def test_batch_feedback_equals_rehydration_from_output(state: UpsertState) -> None:
    from tests.oracle.backends import InMemoryBackend

    committed: list[tuple[bytes, bytes, int, int]] = []
    committed += commit_batch(state, 0, [up(K1, "a", 1), up(K2, "b", 1), up(K3, "c", 1)])
    committed += commit_batch(state, 1, [up(K1, None, 1), up(K2, "b2", 0), up(K3, "c", 5)])
    committed += commit_batch(state, 2, [up(K1, "a3", 1), up(K2, None, 1)])
    rehydrated = UpsertState(InMemoryBackend())
    rehydrated.consolidate_chunk([(k, row, d) for k, row, _t, d in committed], True)

    def live(s: UpsertState) -> dict[bytes, bytes | None]:
        return {k: v.finalized_value for k, v in s.items() if v.finalized_value is not None}

    assert live(state) == live(rehydrated) == {K1: val("a3"), K3: val("c")}
