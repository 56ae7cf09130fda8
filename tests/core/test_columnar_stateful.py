"""Stateful property test: the columnar engine's lifecycle against the dict model.

Rules interleave what a bucket's state lives through in the ingest: drain a file
(``drain_to_upper``), fold the overlay, write and reload a checkpoint, rebuild from the
collection so far (rehydration), and rebuild from an earlier state plus the changes
since (replay, batch scope). After every step the state holds exactly the model's live
rows (and, in the global scope, its orders and tombstones), the collection accumulated
from the output equals the model's snapshot, and every file's output was consolidated
and sorted as parts store it.
"""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.core.test_columnar_engine import as_table, key_of, update_list
from tests.core.test_drain_support import collection
from tests.model import UpsertModel
from upsert_core.columnar import (
    ColumnarState,
    apply_changes,
    drain_to_upper,
    state_from_snapshot,
)
from upsert_core.columnar.checkpoint_format import decode_state, encode_state
from upsert_core.columnar.merge import fold
from upsert_core.order_scope import OrderScope

rows_st = st.lists(
    st.tuples(st.integers(0, 9), st.one_of(st.none(), st.sampled_from([b"a", b"b", b""])),
              st.integers(0, 4)),
    max_size=10,
)


class ColumnarMachine(RuleBasedStateMachine):
    scope = OrderScope.BATCH

    def __init__(self) -> None:
        super().__init__()
        self.model = UpsertModel(self.scope)
        self.state = ColumnarState.empty(keeps_orders=self.scope is OrderScope.GLOBAL)
        self.history: list[pa.Table] = []  # every file's output updates
        self.states: list[ColumnarState] = [self.state]  # the state as of each upper

    @property
    def ts(self) -> int:
        return len(self.history)

    @rule(rows=rows_st)
    def drain_a_file(self, rows: list[tuple[int, bytes | None, int]]) -> None:
        changes = self.model.apply_updates((key_of(k), v, o) for k, v, o in rows)
        result = drain_to_upper(self.state, as_table(rows), self.ts)
        got = update_list(result.updates)
        assert got == sorted(got, key=lambda u: (u[0], u[1]))
        assert len({(k, r) for k, r, _, _ in got}) == len(got)  # consolidated
        assert collection(got) == collection((k, r, self.ts, d) for k, r, d in changes)
        self.history.append(result.updates)
        self.state = result.state
        self.states.append(self.state)

    @rule()
    def fold_the_overlay(self) -> None:
        self.state = fold(self.state)
        assert self.state.overlay is None

    @rule()
    def reload_from_a_checkpoint(self) -> None:
        state, meta = decode_state(encode_state(self.state, {"upper": self.ts}))
        assert meta == {"upper": self.ts} and state.overlay is None
        self.state = state

    @precondition(lambda self: self.scope is OrderScope.BATCH)
    @rule()
    def rehydrate_from_the_collection(self) -> None:
        self.state = state_from_snapshot(self.history)

    @precondition(lambda self: self.scope is OrderScope.BATCH)
    @rule(data=st.data())
    def replay_from_an_earlier_state(self, data: st.DataObject) -> None:
        lower = data.draw(st.integers(0, self.ts), label="lower")
        self.state, applied = apply_changes(self.states[lower], self.history[lower:])
        assert applied == sum(t.num_rows for t in self.history[lower:])

    @invariant()
    def state_is_the_model(self) -> None:
        items = list(self.state.items())
        assert len(items) == len(self.state)
        live = {k: r for k, r, _ in items if r is not None}
        assert live == {k: v for k, (v, _o) in self.model.live.items()}
        if self.scope is OrderScope.GLOBAL:
            orders = {k: o for k, _r, o in items}
            expected = {k: o for k, (_v, o) in self.model.live.items()}
            expected.update(self.model.tombstones)
            assert orders == expected
        accumulated = Counter()
        for table in self.history:
            for k, r, _ts, d in update_list(table):
                accumulated[(k, r)] += d
        assert +accumulated == Counter(self.model.snapshot().items())


class GlobalColumnarMachine(ColumnarMachine):
    scope = OrderScope.GLOBAL


TestColumnarBatch = ColumnarMachine.TestCase
TestColumnarBatch.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)
TestColumnarGlobal = GlobalColumnarMachine.TestCase
TestColumnarGlobal.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)
