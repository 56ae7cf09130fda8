"""The backend conformance suite: every ``StateBackend`` runs these (see conftest).

Plus what only the on-disk backend promises: surviving close and reopen (also across
processes), refusing files of another format, atomic batches, clear errors.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.core.conftest import MakeBackend
from tests.oracle.backends import InMemoryBackend, SqliteBackend
from upsert_core.codec import encode_datums, key_digest
from upsert_core.errors import StateBackendError
from tests.oracle.state import (
    ABSENT,
    GetStats,
    PutStats,
    PutValue,
    StateBackend,
    StateValue,
    ValueAndSize,
    ValueMetadata,
)


def _key(i: int) -> bytes:
    return key_digest(encode_datums([i]))


def _acc(*updates: tuple[bytes, int]) -> StateValue:
    acc = StateValue.consolidating()
    for v, d in updates:
        acc.merge_update(v, d)
    return acc


SHAPES = [
    StateValue.finalized_value(b"row", None),
    StateValue.finalized_value(b"", (3, 4)),
    StateValue.finalized_tombstone(None),
    StateValue.finalized_tombstone((1, 2)),
    StateValue.new_provisional_value(b"p", 7, (1, 1)),
    StateValue.new_provisional_tombstone(7, (1, 1)),
    StateValue.finalized_value(b"f", (0, 0)).into_provisional_value(b"p", 2, (5, 5)),
    _acc((b"a", 1), (b"bb", 1), (b"a", -1)),
    _acc((b"x\x00\x00", 3)),
]


def _meta(v: StateValue) -> ValueMetadata:
    return ValueMetadata(v.memory_size(), v.is_tombstone)


def test_backends_satisfy_the_protocol(backend: StateBackend) -> None:
    assert isinstance(backend, StateBackend)


def test_empty_backend(backend: StateBackend) -> None:
    results, stats = backend.multi_get([_key(1), _key(2)])
    assert results == [ABSENT, ABSENT]
    assert stats == GetStats(processed_gets=2, processed_gets_size=0, returned_gets=0)
    assert backend.multi_get([]) == ([], GetStats())
    assert len(backend) == 0
    assert list(backend.items()) == []
    assert backend.multi_put([]) == PutStats()


def test_every_shape_round_trips_with_its_size(backend: StateBackend) -> None:
    keys = [_key(i) for i in range(len(SHAPES))]
    stats = backend.multi_put((k, PutValue(v, None)) for k, v in zip(keys, SHAPES, strict=True))
    assert stats.processed_puts == stats.inserts == len(SHAPES)
    assert stats.tombstones_diff == 2
    assert stats.values_diff == len(SHAPES) - 2
    assert stats.size_diff == sum(v.memory_size() for v in SHAPES)
    # Results come back in the order asked, absent keys included.
    ask = [_key(100), *reversed(keys), _key(101)]
    results, gstats = backend.multi_get(ask)
    assert results[0] == ABSENT and results[-1] == ABSENT
    for got, want in zip(results[1:-1], reversed(SHAPES), strict=True):
        assert got == ValueAndSize(want, _meta(want))
    assert gstats == GetStats(
        processed_gets=len(ask),
        processed_gets_size=stats.size_diff,
        returned_gets=len(SHAPES),
    )
    assert len(backend) == len(SHAPES)
    assert dict(backend.items()) == dict(zip(keys, SHAPES, strict=True))


def test_updates_and_deletes_adjust_stats_from_previous_metadata(backend: StateBackend) -> None:
    k1, k2, k3 = _key(1), _key(2), _key(3)
    v1 = StateValue.finalized_value(b"one", None)
    t2 = StateValue.finalized_tombstone((1, 1))
    backend.multi_put([(k1, PutValue(v1, None)), (k2, PutValue(t2, None))])
    (g1, g2, g3), _ = backend.multi_get([k1, k2, k3])
    assert g2.metadata == ValueMetadata(t2.memory_size(), True)
    v1b = StateValue.finalized_value(b"one, longer", None)
    v2 = StateValue.finalized_value(b"two", (2, 2))
    stats = backend.multi_put(
        [
            (k1, PutValue(v1b, g1.metadata)),  # value -> value
            (k2, PutValue(v2, g2.metadata)),  # tombstone -> value
            (k3, PutValue(None, g3.metadata)),  # delete of an absent key
        ]
    )
    assert stats == PutStats(
        processed_puts=3,
        values_diff=1,
        tombstones_diff=-1,
        size_diff=v1b.memory_size() - v1.memory_size() + v2.memory_size() - t2.memory_size(),
        inserts=0,
        updates=2,
        deletes=1,
    )
    (g1, g2), _ = backend.multi_get([k1, k2])
    stats = backend.multi_put(
        [(k1, PutValue(None, g1.metadata)), (k2, PutValue(None, g2.metadata))]
    )
    assert stats.values_diff == -2 and stats.size_diff == -(v1b.memory_size() + v2.memory_size())
    assert stats.deletes == 2 and len(backend) == 0


def test_last_put_of_a_repeated_key_wins(backend: StateBackend) -> None:
    k = _key(1)
    backend.multi_put(
        [
            (k, PutValue(StateValue.finalized_value(b"first", None), None)),
            (k, PutValue(StateValue.finalized_value(b"second", None), None)),
        ]
    )
    (got,), _ = backend.multi_get([k])
    assert got.value == StateValue.finalized_value(b"second", None)
    backend.multi_put(
        [
            (k, PutValue(None, got.metadata)),
            (k, PutValue(StateValue.finalized_tombstone(None), None)),
        ]
    )
    (got,), _ = backend.multi_get([k])
    assert got.value == StateValue.finalized_tombstone(None)


def test_many_keys_across_query_chunks(backend: StateBackend) -> None:
    keys = [_key(i) for i in range(2500)]
    values = [StateValue.finalized_value(b"v%d" % i, (i, 0)) for i in range(2500)]
    backend.multi_put((k, PutValue(v, None)) for k, v in zip(keys, values, strict=True))
    ask = keys[::-1] + [_key(-1)]
    results, stats = backend.multi_get(ask)
    assert [r.value for r in results] == values[::-1] + [None]
    assert stats.returned_gets == 2500 and len(backend) == 2500


def test_stored_metadata_is_what_was_accounted(backend: StateBackend) -> None:
    # The drain decodes accumulators it got from multi_get in place; the size the backend
    # reports for the key must stay the size it was stored and accounted at.
    k = _key(1)
    acc = _acc((b"value", 1))
    backend.multi_put([(k, PutValue(acc, None))])
    (got,), _ = backend.multi_get([k])
    assert got.value is not None
    got.value.ensure_decoded()
    (again,), _ = backend.multi_get([k])
    assert again.metadata == _meta(_acc((b"value", 1)))


def test_backends_report_identical_sizes(make_backend: MakeBackend) -> None:
    memory, disk = make_backend("memory"), make_backend("sqlite")
    keys = [_key(i) for i in range(len(SHAPES))]
    puts = [(k, PutValue(v, None)) for k, v in zip(keys, SHAPES, strict=True)]
    assert memory.multi_put(puts) == disk.multi_put(puts)
    assert memory.multi_get(keys) == disk.multi_get(keys)
    disk.close()


# --- the on-disk backend ---------------------------------------------------------------


def test_sqlite_survives_close_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    keys = [_key(i) for i in range(len(SHAPES))]
    with SqliteBackend(path) as b:
        b.multi_put((k, PutValue(v, None)) for k, v in zip(keys, SHAPES, strict=True))
    with SqliteBackend(path, synchronous="FULL") as b:
        assert dict(b.items()) == dict(zip(keys, SHAPES, strict=True))


def test_sqlite_state_written_by_one_process_is_read_by_another(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    writer = textwrap.dedent(
        f"""
        from tests.oracle.backends import SqliteBackend
        from upsert_core.codec import encode_datums, key_digest
        from tests.oracle.state import PutValue, StateValue, UpsertState
        with UpsertState(SqliteBackend({str(path)!r})) as state:
            state.consolidate_chunk(
                [(key_digest(encode_datums([i])), b"row%d" % i, 1) for i in range(50)],
                completes_snapshot=True,
            )
            k = key_digest(encode_datums([0]))
            (got,) = state.multi_get([k])
            state.multi_put([(k, PutValue(None, got.metadata))])
        """
    )
    subprocess.run([sys.executable, "-c", writer], check=True, cwd=Path(__file__).parents[2])
    with SqliteBackend(path) as b:
        stored = dict(b.items())
    assert len(stored) == 49 and _key(0) not in stored
    assert stored[_key(7)] == StateValue.finalized_value(b"row7", None)


def test_sqlite_refuses_another_format_version(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    SqliteBackend(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE upsert_state_meta SET value = '999'")
    conn.close()
    with pytest.raises(StateBackendError, match="format version 999"):
        SqliteBackend(path)


def test_sqlite_reports_undecodable_values(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    with SqliteBackend(path) as b:
        b.multi_put([(_key(1), PutValue(StateValue.finalized_value(b"ok", None), None))])
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE upsert_state SET value = x'01ff00'")
    conn.close()
    with SqliteBackend(path) as b:
        with pytest.raises(StateBackendError, match=_key(1).hex()):
            b.multi_get([_key(1)])
        with pytest.raises(StateBackendError):
            list(b.items())


def test_sqlite_batches_are_all_or_nothing(tmp_path: Path) -> None:
    with SqliteBackend(tmp_path / "state.sqlite") as b:
        good = StateValue.finalized_value(b"good", None)
        unencodable = StateValue.finalized_value(b"bad", (2**64, 0))
        with pytest.raises(StateBackendError, match="cannot encode"):
            b.multi_put([(_key(1), PutValue(good, None)), (_key(2), PutValue(unencodable, None))])
        assert len(b) == 0
        # The connection is still usable afterwards.
        b.multi_put([(_key(1), PutValue(good, None))])
        assert len(b) == 1


def test_sqlite_errors_are_state_backend_errors(tmp_path: Path) -> None:
    with pytest.raises(StateBackendError, match="synchronous"):
        SqliteBackend(tmp_path / "x.sqlite", synchronous="OFF")
    with pytest.raises(StateBackendError, match="cannot open"):
        SqliteBackend(tmp_path / "missing-dir" / "x.sqlite")
    b = SqliteBackend(tmp_path / "closed.sqlite")
    b.close()
    with pytest.raises(StateBackendError):
        b.multi_get([_key(1)])
    with pytest.raises(StateBackendError):
        len(b)


def test_in_memory_backend_returns_stored_objects_without_copying() -> None:
    b = InMemoryBackend()
    v = StateValue.finalized_value(b"x", None)
    b.multi_put([(_key(1), PutValue(v, None))])
    (got,), _ = b.multi_get([_key(1)])
    assert got.value is v
