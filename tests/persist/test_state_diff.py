"""State diffs: a follower kept only by (encoded) diffs stays equal to its leader, and
diffs that do not apply fail loudly; the state codec round-trips and rejects garbage."""

from __future__ import annotations

import json

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from upsert_core.errors import CorruptData, InvalidStateDiff
from upsert_core.persist.state.codec_state import (
    decode_diff,
    decode_rollup,
    decode_state,
    encode_diff,
    encode_rollup,
    encode_state,
)
from upsert_core.persist.state.state import (
    BlobPart,
    ErrorBatch,
    HollowBatch,
    InlinePart,
    Part,
    ReaderState,
    RollupRef,
    ShardState,
    WriterState,
    initial_state,
)
from upsert_core.persist.state.state_diff import (
    Delete,
    FieldDiff,
    Insert,
    StateDiff,
    Update,
    apply_all,
)

NAMES = st.sampled_from(["a", "b", "c", "d"])
INTS = st.integers(min_value=0, max_value=10**12)
PARTS: st.SearchStrategy[Part] = st.one_of(
    st.builds(InlinePart, st.binary(max_size=12), st.integers(0, 50)),
    st.builds(
        BlobPart,
        st.text("abcdef0123456789", min_size=1, max_size=8).map(lambda s: f"s/part/{s}.parquet"),
        st.integers(0, 10**9),
        st.integers(0, 50),
    ),
)


class LeaderFollower(RuleBasedStateMachine):
    """The leader changes its state at random; the follower only sees encoded diffs."""

    def __init__(self) -> None:
        super().__init__()
        self.leader = initial_state("shard-1")
        self.follower = self.leader
        self.diffs_applied = 0
        self.chain: list[StateDiff] = []  # every diff, applied at once by apply_all

    def commit(self, new: ShardState) -> None:
        new = new.evolve(seqno=self.leader.seqno + 1)
        new.check_invariants()
        diff = StateDiff.from_states(self.leader, new)
        decoded = decode_diff(encode_diff(diff, nonce="n"))
        assert decoded == diff
        before = self.follower
        self.follower = decoded.apply(self.follower)
        self.chain.append(decoded)
        self.leader = new
        self.diffs_applied += 1
        if diff.changes:
            # Replaying a diff on the state it produced is a diff whose every `from`
            # is wrong (or whose inserts exist): it must fail, never half-apply.
            with pytest.raises(InvalidStateDiff):
                diff.apply(self.follower.evolve(seqno=before.seqno))

    @rule(
        width=st.integers(1, 5),
        parts=st.lists(PARTS, min_size=1, max_size=3),
        file=st.none() | NAMES,
        errors=st.integers(0, 2),
    )
    def append(self, width: int, parts: list[Part], file: str | None, errors: int) -> None:
        s = self.leader
        batch = HollowBatch(s.upper, s.upper + width, 0, tuple(parts))
        new_errors = tuple(ErrorBatch(s.upper, parts[0], n + 1) for n in range(errors))
        files = dict(s.ingested_files)
        if file is not None:
            files[f"{file}-{s.upper}.csv"] = s.upper
        self.commit(
            s.evolve(
                upper=s.upper + width,
                batches=(*s.batches, batch),
                errors=s.errors + new_errors,
                ingested_files=files,
            )
        )

    @precondition(lambda self: len(self.leader.batches) >= 2)
    @rule(data=st.data())
    def compact_adjacent(self, data: st.DataObject) -> None:
        s = self.leader
        i = data.draw(st.integers(0, len(s.batches) - 2))
        a, b = s.batches[i], s.batches[i + 1]
        merged_parts = data.draw(st.sampled_from([a.parts + b.parts, (a.parts + b.parts)[:1]]))
        merged = HollowBatch(a.lower, b.upper, s.since, merged_parts)
        self.commit(s.evolve(batches=(*s.batches[:i], merged, *s.batches[i + 2 :])))

    @precondition(lambda self: len(self.leader.batches) >= 1)
    @rule(data=st.data(), part=PARTS)
    def rewrite_batch(self, data: st.DataObject, part: Part) -> None:
        s = self.leader
        i = data.draw(st.integers(0, len(s.batches) - 1))
        b = s.batches[i]
        new = HollowBatch(b.lower, b.upper, min(s.since, b.upper), (part,))
        self.commit(s.evolve(batches=(*s.batches[:i], new, *s.batches[i + 1 :])))

    @rule(data=st.data())
    def advance_since(self, data: st.DataObject) -> None:
        s = self.leader
        self.commit(s.evolve(since=data.draw(st.integers(s.since, s.upper))))

    @rule(size=st.integers(0, 10**6))
    def add_rollup(self, size: int) -> None:
        s = self.leader
        ref = RollupRef(s.seqno, f"shard-1/rollup/{s.seqno:020d}-x", size)
        self.commit(s.evolve(rollups={**s.rollups, s.seqno: ref}))

    @precondition(lambda self: len(self.leader.rollups) >= 1)
    @rule(data=st.data())
    def remove_rollup(self, data: st.DataObject) -> None:
        s = self.leader
        seqno = data.draw(st.sampled_from(sorted(s.rollups)))
        self.commit(s.evolve(rollups={k: v for k, v in s.rollups.items() if k != seqno}))

    @rule(name=NAMES, heartbeat=INTS, lease=INTS)
    def upsert_writer(self, name: str, heartbeat: int, lease: int) -> None:
        s = self.leader
        writers = {**s.writers, name: WriterState(heartbeat, lease)}
        self.commit(s.evolve(writers=writers))

    @rule(name=NAMES)
    def remove_writer(self, name: str) -> None:
        s = self.leader
        self.commit(s.evolve(writers={k: v for k, v in s.writers.items() if k != name}))

    @rule(name=NAMES, data=st.data(), heartbeat=INTS)
    def upsert_reader(self, name: str, data: st.DataObject, heartbeat: int) -> None:
        s = self.leader
        since = data.draw(st.integers(s.since, s.upper))
        reader = ReaderState(since, data.draw(st.integers(1, s.seqno)), heartbeat, 1000)
        self.commit(s.evolve(leased_readers={**s.leased_readers, name: reader}))

    @rule(name=NAMES)
    def remove_reader(self, name: str) -> None:
        s = self.leader
        readers = {k: v for k, v in s.leased_readers.items() if k != name}
        self.commit(s.evolve(leased_readers=readers))

    @rule(name=NAMES, value=st.text(max_size=6))
    def set_config(self, name: str, value: str) -> None:
        s = self.leader
        self.commit(s.evolve(config={**s.config, name: value}))

    @rule(name=NAMES)
    def remove_config(self, name: str) -> None:
        s = self.leader
        self.commit(s.evolve(config={k: v for k, v in s.config.items() if k != name}))

    @precondition(lambda self: len(self.leader.errors) >= 1)
    @rule(data=st.data())
    def remove_error(self, data: st.DataObject) -> None:
        s = self.leader
        i = data.draw(st.integers(0, len(s.errors) - 1))
        self.commit(s.evolve(errors=s.errors[:i] + s.errors[i + 1 :]))

    @rule(step=st.integers(0, 10**6))
    def tick(self, step: int) -> None:
        self.commit(self.leader.evolve(walltime_ms=self.leader.walltime_ms + step))

    @precondition(lambda self: self.leader.seqno >= 1)
    @rule(data=st.data())
    def corrupted_from_fails(self, data: st.DataObject) -> None:
        """A diff whose `from` was tampered with is rejected naming the field."""
        s = self.leader
        new = s.evolve(
            seqno=s.seqno + 1,
            walltime_ms=s.walltime_ms + 1,
            config={**s.config, "a": s.config.get("a", "") + "x"},
        )
        diff = StateDiff.from_states(s, new)
        i = data.draw(st.integers(0, len(diff.changes) - 1))
        change = diff.changes[i]
        op = change.change
        if isinstance(op, Update):
            bad: Insert | Update | Delete = Update("<corrupt>", op.after)
        elif isinstance(op, Delete):
            bad = Delete("<corrupt>")
        else:
            bad = Update("<corrupt>", op.value)  # an update of a key that does not exist
        tampered = FieldDiff(change.field, change.key, bad)
        changes = (*diff.changes[:i], tampered, *diff.changes[i + 1 :])
        corrupted = StateDiff(s.shard_id, s.seqno, s.seqno + 1, diff.latest_rollup_key, changes)
        with pytest.raises(InvalidStateDiff, match=f"field '{change.field}'"):
            corrupted.apply(self.follower)

    @invariant()
    def follower_equals_leader(self) -> None:
        assert self.follower == self.leader
        # The whole chain at once (each field copied once) gives what diff by diff does,
        # error batches renumbered at one ts included.
        assert apply_all(initial_state("shard-1"), self.chain) == self.leader
        assert decode_state(encode_state(self.leader)) == self.leader


TestLeaderFollower = LeaderFollower.TestCase


# --- strict application, examples ------------------------------------------------------


def _two_states() -> tuple[ShardState, ShardState]:
    old = initial_state("s").evolve(
        config={"k": "v", "gone": "x"}, writers={"w": WriterState(1, 2)}, walltime_ms=5
    )
    new = old.evolve(
        seqno=2, config={"k": "v2", "added": "y"}, writers={"w": WriterState(3, 2)}
    )
    return old, new


def test_diff_lists_inserts_updates_deletes_per_key() -> None:
    old, new = _two_states()
    diff = StateDiff.from_states(old, new)
    assert set(diff.changes) == {
        FieldDiff("config", "k", Update("v", "v2")),
        FieldDiff("config", "gone", Delete("x")),
        FieldDiff("config", "added", Insert("y")),
        FieldDiff("writers", "w", Update(WriterState(1, 2), WriterState(3, 2))),
    }
    assert (diff.seqno_from, diff.seqno_to) == (1, 2)
    assert diff.apply(old) == new


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (FieldDiff("config", "k", Update("wrong", "v2")), "field 'config' key 'k': update"),
        (FieldDiff("config", "gone", Delete("wrong")), "field 'config' key 'gone': delete"),
        (FieldDiff("config", "nokey", Delete("x")), "found no such key"),
        (FieldDiff("config", "k", Insert("v")), "insert of an existing key"),
        (FieldDiff("walltime_ms", None, Update(4, 9)), "field 'walltime_ms'"),
        (FieldDiff("since", None, Insert(3)), "a scalar field cannot Insert"),
        (FieldDiff("nonsense", "x", Insert(3)), "unknown field"),
    ],
)
def test_strict_application_names_field_and_key(change: FieldDiff, message: str) -> None:
    old, _ = _two_states()
    diff = StateDiff("s", 1, 2, None, (change,))
    with pytest.raises(InvalidStateDiff, match=message):
        diff.apply(old)


def test_diff_must_start_at_the_states_seqno_and_shard() -> None:
    old, new = _two_states()
    diff = StateDiff.from_states(old, new)
    with pytest.raises(InvalidStateDiff, match="applied to the state at seqno 2"):
        diff.apply(new)
    with pytest.raises(InvalidStateDiff, match="applied to shard 'other'"):
        diff.apply(initial_state("other"))


def test_compaction_is_two_deletes_and_an_insert_keyed_by_range() -> None:
    p = InlinePart(b"x", 1)
    old = initial_state("s").evolve(
        upper=4, batches=(HollowBatch(0, 2, 0, (p,)), HollowBatch(2, 4, 0, (p,)))
    )
    new = old.evolve(seqno=2, batches=(HollowBatch(0, 4, 0, (p, p)),))
    diff = StateDiff.from_states(old, new)
    kinds = sorted((c.key, type(c.change).__name__) for c in diff.changes)
    assert kinds == [((0, 2), "Delete"), ((0, 4), "Insert"), ((2, 4), "Delete")]
    assert diff.apply(old) == new


def test_two_error_batches_at_one_ts_stay_distinct() -> None:
    e1, e2 = ErrorBatch(0, InlinePart(b"a", 1), 1), ErrorBatch(0, InlinePart(b"b", 1), 1)
    old = initial_state("s").evolve(upper=1, batches=(HollowBatch(0, 1, 0, ()),))
    both = old.evolve(seqno=2, errors=(e1, e2))
    only_second = both.evolve(seqno=3, errors=(e2,))
    assert StateDiff.from_states(old, both).apply(old) == both
    assert StateDiff.from_states(both, only_second).apply(both) == only_second


def test_a_chain_renumbers_error_batches_between_its_diffs() -> None:
    """Error batches at one ts are keyed by their position there, so after the first of
    two is removed the second is keyed as the first: a chain applied at once must key
    each diff's changes as the state before that diff does."""
    e1, e2, e3 = (ErrorBatch(0, InlinePart(bytes([n]), 1), 1) for n in range(3))
    s0 = initial_state("s").evolve(upper=1, batches=(HollowBatch(0, 1, 0, ()),),
                                   errors=(e1, e2))
    s1 = s0.evolve(seqno=s0.seqno + 1, errors=(e2,))
    s2 = s1.evolve(seqno=s1.seqno + 1, errors=(e3,))  # replaces the one now at (0, 0)
    s3 = s2.evolve(seqno=s2.seqno + 1, errors=(e3, e1))
    chain = [StateDiff.from_states(a, b) for a, b in ((s0, s1), (s1, s2), (s2, s3))]
    assert apply_all(s0, chain) == s3
    assert apply_all(s0, chain[:2]) == s2
    assert apply_all(s0, []) is s0


# --- codec -------------------------------------------------------------------------------


def test_self_referential_rollup_restores_its_own_entry() -> None:
    base = initial_state("s").evolve(config={"a": "b"})
    key = "s/rollup/00000000000000000001-" + "0" * 32
    data = encode_rollup(base.evolve(rollups={1: RollupRef(1, key, 0)}))
    state = base.evolve(rollups={1: RollupRef(1, key, len(data))})
    assert encode_rollup(state) == data
    assert decode_rollup(data, key) == state


def test_plain_rollup_round_trips() -> None:
    state = initial_state("s").evolve(seqno=7, rollups={1: RollupRef(1, "k1", 10)})
    assert decode_rollup(encode_rollup(state), "k7") == state


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff\xfe",
        b"not json",
        b"[1, 2]",
        b'{"v": 99, "t": "diff"}',
        b'{"v": 1, "t": "state"}',
        b'{"v": 1, "t": "diff", "shard": "s", "from": 1, "to": 2, "rollup": null, "c": 3}',
        b'{"v": 1, "t": "diff", "shard": "s", "from": "1", "to": 2, "rollup": null, "c": []}',
        b'{"v": 1, "t": "diff", "shard": "s", "from": 1, "to": 2, "rollup": null,'
        b' "c": [["config", "k", "x", "v"]]}',
        b'{"v": 1, "t": "diff", "shard": "s", "from": 1, "to": 2, "rollup": null,'
        b' "c": [["upper", null, "i", 3]]}',
        b'{"v": 1, "t": "diff", "shard": "s", "from": 1, "to": 2, "rollup": null,'
        b' "c": [["batches", [0, 1], "i", [0, 1, 0, [{"d": "!!!", "n": 1}]]]]}',
    ],
)
def test_decode_garbage_is_corrupt_data(data: bytes) -> None:
    with pytest.raises(CorruptData):
        decode_diff(data)


def test_decode_checks_kind_and_version() -> None:
    state = initial_state("s")
    encoded = encode_state(state)
    with pytest.raises(CorruptData, match="expected a diff encoding"):
        decode_diff(encoded)
    newer = json.loads(encoded)
    newer["v"] = 2
    with pytest.raises(CorruptData, match="format version 2"):
        decode_state(json.dumps(newer).encode())
    with pytest.raises(CorruptData):
        decode_state(encoded[: len(encoded) // 2])
    with pytest.raises(CorruptData):
        decode_rollup(encoded, "k")
