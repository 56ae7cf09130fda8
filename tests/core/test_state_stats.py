"""Stats invariants: cumulative put and merge stats equal what the backend holds.

A hypothesis state machine drives ``UpsertState`` over each backend with random
``multi_put`` (values, tombstones, provisional states, accumulators, deletes),
``multi_get``, ``consolidate_chunk`` and the drain's uncounted-provisional-write then
counted-feedback protocol, next to a plain dict model. After every step the backend
holds exactly the model, and ``values_diff``, ``tombstones_diff`` and ``size_diff``
summed over puts and merges equal the number of values, of tombstones and the total
size actually stored.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.oracle.backends import InMemoryBackend, SqliteBackend
from upsert_core.errors import InvalidUpsertState
from tests.oracle.state import (
    GetStats,
    PutValue,
    StateBackend,
    StateValue,
    UpsertState,
    ValueMetadata,
)

KEYS = [bytes([i]) * 16 for i in range(8)]
small_values = st.binary(max_size=12)
orders = st.tuples(st.integers(-5, 5), st.integers(0, 5))


def _accumulator(updates: list[tuple[bytes, int]]) -> StateValue:
    acc = StateValue.consolidating()
    for v, d in updates:
        acc.merge_update(v, d)
    return acc


new_values: st.SearchStrategy[StateValue | None] = st.one_of(
    st.none(),
    st.builds(StateValue.new_finalized_value, small_values, st.none() | orders),
    st.builds(StateValue.finalized_tombstone, st.none() | orders),
    st.builds(StateValue.new_provisional_value, small_values, st.integers(0, 3), orders),
    st.builds(StateValue.new_provisional_tombstone, st.integers(0, 3), orders),
    st.builds(_accumulator, st.lists(st.tuples(small_values, st.integers(-2, 2)), max_size=3)),
)
key_batches = st.lists(st.sampled_from(KEYS), min_size=1, max_size=6, unique=True)


def _metadata(value: StateValue) -> ValueMetadata:
    return ValueMetadata(value.memory_size(), value.is_tombstone)


class StatsMachine(RuleBasedStateMachine):
    kind = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="upsert-stats-"))
        backend: StateBackend = (
            InMemoryBackend() if self.kind == "memory" else SqliteBackend(self.tmp / "s.db")
        )
        self.state = UpsertState(backend)
        # key -> (value as stored, metadata it was stored and counted with)
        self.model: dict[bytes, tuple[StateValue, ValueMetadata]] = {}
        self.gets = GetStats()
        self.uncounted_puts = 0

    def teardown(self) -> None:
        self.state.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    @rule(keys=key_batches, data=st.data())
    def put(self, keys: list[bytes], data: st.DataObject) -> None:
        current = self.state.multi_get(keys)
        self._count_gets(keys)
        puts = []
        for key, cur in zip(keys, current, strict=True):
            value = data.draw(new_values)
            puts.append((key, PutValue(value, cur.metadata)))
            self._model_put(key, value)
        stats = self.state.multi_put(puts)
        assert stats.processed_puts == len(keys)
        assert stats.processed_puts == stats.inserts + stats.updates + stats.deletes

    @rule(keys=key_batches)
    def get(self, keys: list[bytes]) -> None:
        got = self.state.multi_get(keys)
        self._count_gets(keys)
        for key, g in zip(keys, got, strict=True):
            if key in self.model:
                value, meta = self.model[key]
                assert g.value == value
                assert g.metadata == meta
            else:
                assert g.value is None and g.metadata is None

    @rule(
        updates=st.lists(
            st.tuples(st.sampled_from(KEYS), small_values, st.sampled_from([-1, 1, 2])),
            max_size=8,
        )
    )
    def consolidate(self, updates: list[tuple[bytes, bytes, int]]) -> None:
        # The model replays the same merges (decoding them once the snapshot is
        # complete). Random updates are rarely well-formed histories, so after completion
        # this mostly checks that an invalid chunk raises and changes nothing.
        accs: dict[bytes, StateValue | None] = {}
        for key, value, diff in updates:
            if key not in accs:
                accs[key] = self.model[key][0].to_consolidating() if key in self.model else None
            acc = accs[key] or StateValue.consolidating()
            accs[key] = None if acc.merge_update(value, diff) else acc
        if self.state.snapshot_completed and not self._decode_all(accs.values()):
            event("feedback refused")
            self._expect_refusal(lambda: self.state.consolidate_chunk(updates, False))
            return
        event("feedback after completion" if self.state.snapshot_completed else "snapshot chunk")
        self.state.consolidate_chunk(updates, completes_snapshot=False)
        for key, acc in accs.items():
            self._model_put(key, acc)

    @precondition(lambda self: not self.state.snapshot_completed)
    @rule()
    def complete_snapshot(self) -> None:
        decoded = {
            k: v.to_consolidating() for k, (v, _) in self.model.items() if v.is_consolidating
        }
        if not self._decode_all(decoded.values()):
            event("completion refused")
            self._expect_refusal(lambda: self.state.consolidate_chunk([], True))
            return
        event("completion accepted")
        self.state.consolidate_chunk([], completes_snapshot=True)
        for key, acc in decoded.items():
            self._model_put(key, None if acc.is_tombstone else acc)
        assert not any(v.is_consolidating for _, v in self.state.items())

    def _decode_all(self, accs: Iterable[StateValue | None]) -> bool:
        """Decode in place when the snapshot is (or is being) completed; False if invalid."""
        try:
            for acc in accs:
                if acc is not None:
                    acc.ensure_decoded()
        except InvalidUpsertState:
            return False
        return True

    def _expect_refusal(self, call: Callable[[], object]) -> None:
        before = {k: v.encode() for k, v in self.state.items()}
        stats = (replace(self.state.merge_stats), self.state.snapshot_completed)
        with pytest.raises(InvalidUpsertState):
            call()
        assert {k: v.encode() for k, v in self.state.items()} == before
        assert (self.state.merge_stats, self.state.snapshot_completed) == stats

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data(), ts=st.integers(0, 3))
    def provisional_then_feedback(self, data: st.DataObject, ts: int) -> None:
        # The drain's protocol: an uncounted provisional write, then the counted final
        # write against the metadata from before the uncounted one.
        keys = data.draw(st.lists(st.sampled_from(sorted(self.model)), min_size=1, unique=True))
        before = self.state.multi_get(keys)
        self._count_gets(keys)
        provisional = []
        for key, b in zip(keys, before, strict=True):
            sv = b.value
            assert sv is not None
            prov = (
                StateValue.new_provisional_value(b"p", ts, (9, 9))
                if sv.is_consolidating
                else sv.into_provisional_value(b"p", ts, (9, 9))
            )
            provisional.append((key, PutValue(prov, b.metadata)))
        self.state.multi_put(provisional, update_per_record_stats=False)
        self.uncounted_puts += len(keys)
        final = []
        for key, b in zip(keys, before, strict=True):
            value = data.draw(new_values)
            final.append((key, PutValue(value, b.metadata)))
            self._model_put(key, value)
        self.state.multi_put(final, update_per_record_stats=True)

    def _model_put(self, key: bytes, value: StateValue | None) -> None:
        if value is None:
            self.model.pop(key, None)
        else:
            self.model[key] = (value, _metadata(value))

    def _count_gets(self, keys: list[bytes]) -> None:
        self.gets.processed_gets += len(keys)
        found = [self.model[k][1].size for k in keys if k in self.model]
        self.gets.returned_gets += len(found)
        self.gets.processed_gets_size += sum(found)

    @invariant()
    def backend_holds_the_model(self) -> None:
        stored = dict(self.state.items())
        assert stored.keys() == self.model.keys()
        for key, (value, _) in self.model.items():
            assert stored[key] == value
        assert len(self.state) == len(self.model)

    @invariant()
    def cumulative_stats_match_the_backend(self) -> None:
        put, merge = self.state.put_stats, self.state.merge_stats
        metas = [m for _, m in self.model.values()]
        values = sum(1 for m in metas if not m.is_tombstone)
        tombstones = sum(1 for m in metas if m.is_tombstone)
        size = sum(m.size for m in metas)
        assert put.values_diff + merge.values_diff == values
        assert put.tombstones_diff + merge.tombstones_diff == tombstones
        assert put.size_diff + merge.size_diff == size
        assert put.processed_puts == put.inserts + put.updates + put.deletes + self.uncounted_puts
        assert self.state.get_stats == self.gets


StatsMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=12)
TestStatsInMemory = StatsMachine.TestCase


class SqliteStatsMachine(StatsMachine):
    kind = "sqlite"


SqliteStatsMachine.TestCase.settings = settings(max_examples=20, stateful_step_count=10)
TestStatsSqlite = SqliteStatsMachine.TestCase
