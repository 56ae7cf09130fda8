"""Every SQL statement ``SqlConsensus`` sends uses bound parameters (SQLite and PostgreSQL).

A listener on the consensus driver (``SqlConsensus._listen``: SQLAlchemy's
``before_cursor_execute`` on PostgreSQL; on SQLite the one function through which every
``sqlite3`` statement is sent, pragmas and ``BEGIN``/``COMMIT`` included) records every
statement and its parameters while a whole workload runs (create, compare-and-set from nothing and
from a seqno, mismatches, head, scan, truncate, list of keys) with hostile keys and data
(quotes, ``; DROP TABLE``, comment markers, backslashes, Unicode). No test value ever
appears in a statement's text; each appears among the parameters instead; the keys are
stored and read back verbatim; the table is still there afterwards. Through the shard
API, a hostile shard name is rejected before any SQL is sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from upsert_core.errors import ConfigError
from upsert_core.persist.location import CasCommitted, CasMismatch, VersionedData
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_sql import SqlConsensus
from upsert_core.persist.shard import Shard

HOSTILE_KEYS = [
    "x'; DROP TABLE consensus; --",
    'q"uote"); DELETE FROM consensus; --',
    "back\\slash' OR '1'='1",
    "unicode-\u202e-\uff07-\u00e9-key",
    "percent %s %(shard)s :shard",
]
DATA_MARKER = b"DATA-MARKER'); DROP TABLE consensus; --"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def consensus(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[SqlConsensus, list[tuple[str, Any]]]]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'consensus.db'}"
    else:
        url = request.getfixturevalue("fresh_postgres_url")
    c = SqlConsensus(url)
    sent: list[tuple[str, Any]] = []

    def record(statement: str, params: Any) -> None:
        sent.append((statement, params))

    stop = c._listen(record)  # noqa: SLF001
    try:
        yield c, sent
    finally:
        stop()
        c.close()


def _flatten(params: Any) -> list[Any]:
    if isinstance(params, dict):
        return list(params.values())
    if isinstance(params, list | tuple):
        out: list[Any] = []
        for p in params:
            out.extend(_flatten(p) if isinstance(p, dict | list | tuple) else [p])
        return out
    return [params]


def _cas(c: SqlConsensus, key: str, expected: int | None, seqno: int, data: bytes) -> object:
    return c.compare_and_set(key, expected, VersionedData(seqno, data))


def test_statements_carry_values_only_as_parameters(
    consensus: tuple[SqlConsensus, list[tuple[str, Any]]],
) -> None:
    c, sent = consensus
    for i, key in enumerate(HOSTILE_KEYS):
        data = DATA_MARKER + str(i).encode()
        assert c.head(key) is None
        assert isinstance(_cas(c, key, None, 0, data), CasCommitted)
        assert isinstance(_cas(c, key, None, 0, data), CasMismatch)
        assert isinstance(_cas(c, key, 0, 1, data + b"1"), CasCommitted)
        assert isinstance(_cas(c, key, 0, 1, data), CasMismatch)
        assert isinstance(_cas(c, key, 1, 2, data + b"2"), CasCommitted)
        assert [v.seqno for v in c.scan(key, 0, 10)] == [0, 1, 2]
        assert c.truncate(key, 2) == 2
        head = c.head(key)
        assert head is not None and head.seqno == 2 and head.data == data + b"2"
    assert sorted(c.list_keys()) == sorted(HOSTILE_KEYS)  # stored verbatim, table intact

    assert len(sent) > 10 * len(HOSTILE_KEYS)
    values: list[Any] = []
    for statement, params in sent:
        for key in HOSTILE_KEYS:
            assert key not in statement, f"key formatted into SQL: {statement}"
        assert "DATA-MARKER" not in statement, f"data formatted into SQL: {statement}"
        assert "DROP TABLE" not in statement.upper()
        values.extend(_flatten(params))
    for key in HOSTILE_KEYS:
        assert key in values, f"{key!r} never sent as a parameter"
    assert any(isinstance(v, bytes | memoryview) and DATA_MARKER in bytes(v) for v in values)


def test_hostile_shard_names_are_rejected_before_any_sql(
    consensus: tuple[SqlConsensus, list[tuple[str, Any]]],
) -> None:
    c, sent = consensus
    for name in HOSTILE_KEYS:
        with pytest.raises(ConfigError, match="invalid shard name"):
            Shard.open(c, MemoryBlob(), name, create=True)
    assert not any(name in stmt for stmt, _ in sent for name in HOSTILE_KEYS)
    assert list(c.list_keys()) == []
