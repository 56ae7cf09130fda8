"""Stateful property test: the upsert operator (stage, partial AtTime drains, ToUpper,
feedback) against a dict model, in both order scopes.

After every committed timestamp: the committed output accumulates to the model's snapshot,
each timestamp's changes are exactly the model's changes (so identical rows produce no
change and the output is consolidated), each key has at most one live row, the state
holds the model's finalized values/orders, its per-record stats match the model, and
(batch scope) rehydrating a fresh state from the output gives the same values.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.core.test_drain_support import collection, fresh_state, key
from tests.model import UpsertModel
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
from tests.oracle.state import UpsertState

KEYS = [key(i) for i in range(5)]
VALUES = [b"a", b"b", b"c", b""]

update_strategy = st.tuples(
    st.sampled_from(KEYS),
    st.one_of(st.none(), st.sampled_from(VALUES)),
    st.integers(0, 3),  # order value: small, so ties are frequent
    st.integers(0, 50),  # position rank: random relative to staging order
    st.integers(0, 2),  # ts offset from the current upper
)


class DrainMachine(RuleBasedStateMachine):
    scope = OrderScope.BATCH

    def __init__(self) -> None:
        super().__init__()
        self.state = fresh_state()
        self.model = UpsertModel(self.scope)
        self.stash = Stash()
        self.upper = 0  # the persist upper: every ts below it is committed and fed back
        self.pending: list[SourceUpdate] = []  # model copy of the stash
        self.out = DrainOutput()  # drains of ts == upper not yet committed
        self.committed: list[tuple[bytes, bytes, int, int]] = []
        self.drained_at_upper: list[SourceUpdate] = []  # taken by partial drains of upper
        self.serial = 0

    @rule(rows=st.lists(update_strategy, min_size=1, max_size=8))
    def stage(self, rows: list[tuple[bytes, bytes | None, int, int, int]]) -> None:
        batch = []
        for k, v, order, rank, offset in rows:
            self.serial += 1
            # Positions are unique; their order is unrelated to the staging order.
            position = rank * 1000 + self.serial
            batch.append(SourceUpdate(k, v, (order, position), self.upper + offset))
        assert self.stash.stage_updates(batch) == len(batch)
        self.pending += batch

    @precondition(lambda self: len(self.stash) > 0)
    @rule()
    def partial_drain(self) -> None:
        before = len(self.out.updates)
        remaining = drain_staged_input(
            self.stash, self.state, AtTime(self.upper, self.upper), self.out
        )
        drained = [u for u in self.pending if u.ts == self.upper]
        self._check_one_drain(self.out.updates[before:])
        self.drained_at_upper.extend(drained)
        self.pending = [u for u in self.pending if u.ts != self.upper]
        assert remaining == min((u.ts for u in self.pending), default=None)

    @rule(extra=st.integers(0, 2))
    def commit(self, extra: int) -> None:
        before = len(self.out.updates)
        # The source may have closed more times than the state has learnt; only
        # ts == upper is eligible since persist_upper == upper.
        remaining = drain_staged_input(
            self.stash, self.state, ToUpper(self.upper + 1 + extra, self.upper), self.out
        )
        self._check_one_drain(self.out.updates[before:])
        batch = self.drained_at_upper + [u for u in self.pending if u.ts == self.upper]
        self.pending = [u for u in self.pending if u.ts != self.upper]
        assert remaining == min((u.ts for u in self.pending), default=None)

        changes = self.out.consolidated()
        # Positions are row numbers: the model takes the batch in file (position) order.
        in_file_order = sorted(batch, key=lambda u: u.order[1])
        expected = self.model.apply_updates((u.key, u.value, u.order[0]) for u in in_file_order)
        assert sorted((k, r, d) for k, r, _t, d in changes) == sorted(expected)
        assert all(t == self.upper for _k, _r, t, _d in changes)
        self.committed += changes

        apply_feedback(self.state, self.out, self.scope)
        self.out = DrainOutput()
        self.drained_at_upper = []
        self.upper += 1
        self._check_state()

    # --- checks ------------------------------------------------------------------------

    def _check_one_drain(self, updates: list[tuple[bytes, bytes, int, int]]) -> None:
        """A single drain's output is consolidated and has at most +-1 per (ts, key)."""
        rows = [(k, r, t) for k, r, t, _d in updates]
        assert len(rows) == len(set(rows))
        per_key = Counter((k, t, d) for k, _r, t, d in updates)
        assert all(c == 1 for c in per_key.values())

    def _check_state(self) -> None:
        items = dict(self.state.items())
        if self.scope is OrderScope.GLOBAL:
            expect_keys = set(self.model.live) | set(self.model.tombstones)
        else:
            expect_keys = set(self.model.live)
        assert set(items) == expect_keys
        assert len(self.state) == len(expect_keys)
        for k, sv in items.items():
            if k in self.model.live:
                row, order = self.model.live[k]
                assert sv.finalized_value == row and not sv.is_tombstone
            else:
                order = self.model.tombstones[k]
                assert sv.is_tombstone and sv.finalized_value is None
            expected_order = (order, GLOBAL_POSITION) if self.scope is OrderScope.GLOBAL else None
            assert sv.finalized_order == expected_order
            # No provisional part survives feedback: the value seen later is the final one.
            assert sv.provisional_value_ref(self.upper) == sv.finalized_value

        stats = self.state.put_stats
        assert stats.values_diff == len(self.model.live)
        assert stats.tombstones_diff == len(self.model.tombstones)
        assert stats.size_diff == self.state_size()

        if self.scope is OrderScope.BATCH:
            rehydrated = fresh_state_unsnapshotted()
            rehydrated.consolidate_chunk([(k, r, d) for k, r, _t, d in self.committed], True)
            assert {k: v.finalized_value for k, v in rehydrated.items()} == {
                k: v for k, (v, _o) in self.model.live.items()
            }

    def state_size(self) -> int:
        return sum(v.memory_size() for _k, v in self.state.items())

    @invariant()
    def committed_output_is_the_model_snapshot(self) -> None:
        acc = collection(self.committed)
        assert acc == Counter(self.model.snapshot().items())
        assert all(c == 1 for c in acc.values())
        live_keys = [k for k, _r in acc]
        assert len(live_keys) == len(set(live_keys))  # at most one live row per key


def fresh_state_unsnapshotted() -> UpsertState:
    from tests.oracle.backends import InMemoryBackend

    return UpsertState(InMemoryBackend())


class GlobalDrainMachine(DrainMachine):
    scope = OrderScope.GLOBAL


DrainMachine.TestCase.settings = settings(stateful_step_count=30)
GlobalDrainMachine.TestCase.settings = settings(stateful_step_count=30)
TestBatchScopeDrain = DrainMachine.TestCase
TestGlobalScopeDrain = GlobalDrainMachine.TestCase
