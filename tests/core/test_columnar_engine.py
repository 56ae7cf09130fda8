"""The columnar engine against the dict model and the per-key engine.

Each example drains a sequence of files (one timestamp each) through
``columnar.drain_to_upper`` and checks, after every file:

- the output updates equal the per-key engine's (``drain_staged_input`` with
  ``ToUpper`` then ``apply_feedback``) update for update, and the dict model's changes;
- the state equals the per-key engine's state key for key (rows and, in the global
  scope, orders and tombstones);
- the updates are sorted by ``(key, row)`` and consolidated;
- rehydrating the collection so far (``state_from_snapshot``) and replaying the changes
  since any earlier state (``apply_changes``) give the same state (batch scope);
- the checkpoint bytes round-trip.

Keys are drawn so that some share their first 8 bytes, which exercises the rare path
of ``locate``.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.core.test_drain_support import collection, fresh_state
from tests.model import UpsertModel
from tests.oracle.drain import (
    GLOBAL_POSITION,
    DrainOutput,
    OrderScope,
    Stash,
    ToUpper,
    apply_feedback,
    drain_staged_input,
)
from upsert_core.columnar import (
    ColumnarState,
    apply_changes,
    drain_to_upper,
    join_keys,
    locate,
    merge,
    split_keys,
    state_from_snapshot,
)
from upsert_core.columnar.checkpoint_format import decode_state, encode_state
from upsert_core.errors import CodecError, InvalidUpsertState
from upsert_core.ingest import tasks
from upsert_core.order_keys import order_keys, to_arrow
from upsert_core.persist.write.consolidate import UPDATE_SCHEMA

ROWS_SCHEMA = tasks.ROWS_SCHEMA.remove(tasks.ROWS_SCHEMA.get_field_index("bucket"))
"""One bucket's validated rows, as ``read_file`` hands them to the bucket step."""


def key_of(i: int) -> bytes:
    # Keys 0..3 share their first 8 bytes; the rest differ there.
    if i < 4:
        return b"\x07" * 8 + bytes([0] * 7 + [i])
    return bytes([i]) + b"\x00" * 7 + bytes([255 - i]) * 8


Row = tuple[int, bytes | None, int]  # key index, value (None: delete), order value

rows_st = st.tuples(
    st.integers(0, 9), st.one_of(st.none(), st.sampled_from([b"a", b"b", b"ab", b""])),
    st.integers(0, 5),
)
files_st = st.lists(st.lists(rows_st, max_size=12), min_size=1, max_size=6)


def as_table(rows: list[Row]) -> pa.Table:
    return pa.table(
        [
            pa.array([key_of(k) for k, _, _ in rows], pa.binary()),
            pa.array([v or b"" for _, v, _ in rows], pa.binary()),
            pa.array([v is None for _, v, _ in rows], pa.bool_()),
            pa.array([o for _, _, o in rows], pa.int64()),
            pa.array(range(len(rows)), pa.int64()),
        ],
        schema=ROWS_SCHEMA,
    )


def per_key_step(
    state, rows: list, ts: int, scope: OrderScope, *, key=None, positions=None  # noqa: ANN001
) -> list[tuple]:
    """One file through the per-key engine (drain then feedback); its sorted output.
    ``key`` maps a row's key field to key bytes (default ``key_of``); ``positions`` are
    the rows' positions (default 0, 1, ...)."""
    to_key = key_of if key is None else key
    stash = Stash(resume_upper=ts)
    if rows:
        stash.stage(
            ts,
            [to_key(k) for k, _, _ in rows],
            [v for _, v, _ in rows],
            np.array([o for _, _, o in rows], np.int64),
            np.arange(len(rows), dtype=np.int64) if positions is None else positions,
        )
    out = DrainOutput()
    drain_staged_input(stash, state, ToUpper(ts + 1, ts), out)
    apply_feedback(state, out, scope)
    return sorted(out.consolidated())


def per_key_items(state) -> list[tuple[bytes, bytes | None, int | None]]:
    items = []
    for k, v in state.items():
        order = v.finalized_order
        items.append((k, v.finalized_value, None if order is None else order[0]))
        if order is not None:
            assert order[1] == GLOBAL_POSITION
    return sorted(items)


def update_list(table: pa.Table) -> list[tuple]:
    return [tuple(r.values()) for r in table.to_pylist()]


@pytest.fixture(params=["overlay", "fold-every-time"])
def fold_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a state is written: changes kept in the overlay (the default for small
    states), or folded into the base after every change (what large overlays do)."""
    if request.param == "fold-every-time":
        monkeypatch.setattr(merge, "FOLD_MIN_KEYS", 0)
        monkeypatch.setattr(merge, "FOLD_FRACTION", 0.0)
    return str(request.param)


@pytest.mark.parametrize("scope", list(OrderScope))
@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(files=files_st)
def test_columnar_drain_equals_per_key_engine_and_model(
    scope: OrderScope, fold_mode: str, files: list[list[Row]]
) -> None:
    old = fresh_state()
    model = UpsertModel(scope)
    state = ColumnarState.empty(keeps_orders=scope is OrderScope.GLOBAL)
    history: list[pa.Table] = []
    states = [state]
    for ts, rows in enumerate(files):
        expected = per_key_step(old, rows, ts, scope)
        model_changes = model.apply_updates((key_of(k), v, o) for k, v, o in rows)
        result = drain_to_upper(state, as_table(rows), ts)
        got = update_list(result.updates)
        assert sorted(got) == expected
        assert got == sorted(got, key=lambda u: (u[0], u[1]))  # as batch parts store them
        assert collection(got) == collection((k, r, ts, d) for k, r, d in model_changes)
        state = result.state
        if fold_mode == "fold-every-time":
            assert state.overlay is None
        assert sorted(state.items()) == per_key_items(old)
        assert len(state) == len(per_key_items(old))
        assert result.inserts == sum(1 for u in got if u[3] == 1)
        assert result.retractions == sum(1 for u in got if u[3] == -1)
        history.append(result.updates)
        states.append(state)
        decoded, meta = decode_state(encode_state(state, {"upper": ts + 1}))
        assert meta == {"upper": ts + 1}
        assert list(decoded.items()) == list(state.items())

    live = Counter({(k, r): 1 for k, r, _ in state.items() if r is not None})
    assert live == Counter(model.snapshot().items())
    if scope is OrderScope.BATCH:
        rebuilt = state_from_snapshot(history)
        assert list(rebuilt.items()) == list(state.items())
        for lower in range(len(files)):
            replayed, n = apply_changes(states[lower], history[lower:])
            assert list(replayed.items()) == list(state.items())
            assert n == sum(t.num_rows for t in history[lower:])


def test_changes_go_to_the_overlay_and_fold_into_the_base(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = drain_to_upper(ColumnarState.empty(False), as_table(
        [(k, b"a", 1) for k in range(4, 10)]), 0).state
    assert state.overlay is None  # an initial load builds the base directly
    state = drain_to_upper(state, as_table([(5, b"b", 2), (6, None, 2), (2, b"n", 2)]), 1).state
    assert state.overlay is not None and len(state.overlay) == 3
    assert int(state.overlay.gone.sum()) == 1 and len(state) == 6
    expected = {key_of(k): b"a" for k in range(4, 10)} | {key_of(5): b"b", key_of(2): b"n"}
    del expected[key_of(6)]
    assert state.live_rows() == expected
    # Deleting the overlay-only key drops it from the overlay; re-adding 6 revives it.
    state = drain_to_upper(state, as_table([(2, None, 3), (6, b"c", 3)]), 2).state
    assert state.overlay is not None and key_of(2) not in state.live_rows()
    assert state.live_rows()[key_of(6)] == b"c" and len(state) == 6
    monkeypatch.setattr(merge, "FOLD_MIN_KEYS", 0)
    folded = drain_to_upper(state, as_table([(7, b"d", 4)]), 3).state
    assert folded.overlay is None and len(folded.hi) == len(folded) == 6
    assert folded.live_rows() == {**state.live_rows(), key_of(7): b"d"}


def test_locate_handles_keys_sharing_their_first_half() -> None:
    keys = sorted({key_of(i) for i in (0, 2, 3, 5, 7)})
    hi, lo = split_keys(pa.array(keys, pa.binary()))
    queries = [key_of(i) for i in range(10)]
    q_hi, q_lo = split_keys(pa.array(queries, pa.binary()))
    index, found = locate(hi, lo, q_hi, q_lo)
    for q, i, f in zip(queries, index.tolist(), found.tolist(), strict=True):
        assert f == (q in keys)
        import bisect

        assert i == bisect.bisect_left(keys, q)
    assert join_keys(hi, lo).to_pylist() == keys


def test_snapshot_that_is_not_an_upsert_collection_is_refused() -> None:
    k = key_of(5)

    def snap(rows: list[tuple[bytes, int]]) -> list[pa.Table]:
        return [pa.table(
            [pa.array([k] * len(rows)), pa.array([r for r, _ in rows]),
             pa.array([0] * len(rows), pa.int64()), pa.array([d for _, d in rows], pa.int64())],
            schema=UPDATE_SCHEMA,
        )]

    assert state_from_snapshot(snap([(b"a", 1), (b"b", 1), (b"b", -1)])).live_rows() == {
        k: b"a"
    }
    assert len(state_from_snapshot(snap([(b"a", 1), (b"a", -1)]))) == 0
    for bad in ([(b"a", 2)], [(b"a", -1)], [(b"a", 1), (b"b", 1)], [(b"a", 1), (b"a", 1)]):
        with pytest.raises(InvalidUpsertState):
            state_from_snapshot(snap(bad))


def test_replay_refuses_changes_that_do_not_fit() -> None:
    state = drain_to_upper(
        ColumnarState.empty(False), as_table([(5, b"a", 1), (6, b"b", 1)]), 0
    ).state

    def change(k: int, row: bytes, ts: int, diff: int) -> pa.Table:
        return pa.table([pa.array([key_of(k)]), pa.array([row]), pa.array([ts], pa.int64()),
                         pa.array([diff], pa.int64())], schema=UPDATE_SCHEMA)

    for bad in (change(5, b"x", 1, -1), change(5, b"x", 1, 1), change(7, b"x", 1, -1),
                change(5, b"a", 1, 2)):
        with pytest.raises(InvalidUpsertState):
            apply_changes(state, [bad])
    ok, _ = apply_changes(state, [change(5, b"a", 1, -1), change(5, b"c", 1, 1)])
    assert ok.live_rows() == {key_of(5): b"c", key_of(6): b"b"}


def test_corrupted_checkpoint_bytes_are_refused() -> None:
    state = drain_to_upper(ColumnarState.empty(True), as_table([(5, b"a", 1), (6, None, 2)]), 0)
    data = bytearray(encode_state(state.state, {"upper": 1}))
    for at in (3, 30, len(data) // 2, len(data) - 1):
        broken = bytearray(data)
        broken[at] ^= 0x10
        with pytest.raises(CodecError):
            decode_state(bytes(broken))
    with pytest.raises(CodecError):
        decode_state(bytes(data[: len(data) // 2]))


# --- orders of several columns (order keys) ------------------------------------------

TupleRow = tuple[int, bytes | None, tuple[str, int]]  # key index, value, (file, pos)

tuple_rows_st = st.tuples(
    st.integers(0, 9), st.one_of(st.none(), st.sampled_from([b"a", b"b", b"ab", b""])),
    st.tuples(st.sampled_from(["", "a", "a\x00", "ab", "b", "\xe9"]), st.integers(-2, 2)),
)
tuple_files_st = st.lists(st.lists(tuple_rows_st, max_size=12), min_size=1, max_size=6)


def as_tuple_table(rows: list[TupleRow]) -> pa.Table:
    """One bucket's rows whose order has two columns (a string, then an integer)."""
    keys = order_keys([pa.array([o[0] for _, _, o in rows], pa.string()),
                       pa.array([o[1] for _, _, o in rows], pa.int64())])
    schema = tasks.ROWS_SCHEMA_ORDER_KEYS.remove(
        tasks.ROWS_SCHEMA_ORDER_KEYS.get_field_index("bucket"))
    return pa.table(
        [
            pa.array([key_of(k) for k, _, _ in rows], pa.binary()),
            pa.array([v or b"" for _, v, _ in rows], pa.binary()),
            pa.array([v is None for _, v, _ in rows], pa.bool_()),
            to_arrow(keys) if rows else pa.array([], pa.binary()),
            pa.array(range(len(rows)), pa.int64()),
        ],
        schema=schema,
    )


@pytest.mark.parametrize("scope", list(OrderScope))
@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(files=tuple_files_st)
def test_columnar_drain_with_order_keys_equals_model(
    scope: OrderScope, fold_mode: str, files: list[list[TupleRow]]
) -> None:
    """The drain on order keys: the in-batch winner (greatest tuple, ties to the later
    row), the global scope's skip rule and tombstones, compared with the model's tuples;
    the state remembers exactly the model's stored orders (as keys), and checkpoints and
    tombstone sets carry them byte for byte."""
    model = UpsertModel(scope)
    # an empty global state starts as int64 (as ``new_state`` makes it) and takes the
    # rows' kind on the first drain
    state = ColumnarState.empty(keeps_orders=scope is OrderScope.GLOBAL)
    for ts, rows in enumerate(files):
        model_changes = model.apply_updates((key_of(k), v, o) for k, v, o in rows)
        result = drain_to_upper(state, as_tuple_table(rows), ts)
        got = update_list(result.updates)
        assert got == sorted(got, key=lambda u: (u[0], u[1]))
        assert collection(got) == collection((k, r, ts, d) for k, r, d in model_changes)
        state = result.state
        live = {k: r for k, r, _ in state.items() if r is not None}
        assert live == model.snapshot()
        if scope is OrderScope.GLOBAL:
            remembered = {k: o for k, _, o in state.items()}
            expected = {k: model.stored_order(k) for k in [*model.live, *model.tombstones]}
            assert set(remembered) == set(expected)
            for k, o in expected.items():
                encoded = order_keys([pa.array([o[0]], pa.string()), pa.array([o[1]])])
                assert remembered[k] == encoded.tolist()[0]
        decoded, _ = decode_state(encode_state(state, {"upper": ts + 1}))
        assert list(decoded.items()) == list(state.items())


def test_a_state_of_the_other_order_kind_is_refused() -> None:
    ints = drain_to_upper(ColumnarState.empty(True), as_table([(5, b"a", 1)]), 0).state
    with pytest.raises(InvalidUpsertState, match="order keys"):
        drain_to_upper(ints, as_tuple_table([(5, b"b", ("a", 1))]), 1)
    keyed = drain_to_upper(ColumnarState.empty(True), as_tuple_table([(5, b"a", ("a", 1))]),
                           0).state
    with pytest.raises(InvalidUpsertState, match="int64"):
        drain_to_upper(keyed, as_table([(5, b"b", 2)]), 1)


def test_checkpoint_with_order_keys_needs_its_marker() -> None:
    keyed = drain_to_upper(ColumnarState.empty(True), as_tuple_table(
        [(5, b"a", ("a", 1)), (6, None, ("b", 2))]), 0).state
    data = encode_state(keyed, {"upper": 1})
    assert decode_state(data)[0].has_order_keys
    ints = drain_to_upper(ColumnarState.empty(True), as_table([(5, b"a", 1)]), 0).state
    plain = encode_state(ints, {"upper": 1})
    assert b"upsert.order_keys" not in plain  # int64 checkpoints are as before
    # The same columns without the marker are refused, never read as int64 orders.
    table = pa.ipc.open_file(pa.py_buffer(data[24:])).read_all()
    meta = {k: v for k, v in table.schema.metadata.items() if k != b"upsert.order_keys"}
    stripped = table.replace_schema_metadata(meta)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, stripped.schema) as writer:
        writer.write_table(stripped)
    body = sink.getvalue().to_pybytes()
    import xxhash

    forged = b"UPSCKPT2" + xxhash.xxh3_128_digest(body) + body
    with pytest.raises(CodecError, match="order is binary"):
        decode_state(forged)
