"""SqlConsensus on SQLite runs on the stdlib ``sqlite3`` module, not SQLAlchemy.

SQLAlchemy (~0.2 s to import) is loaded only for PostgreSQL, so ``upsertctl`` on the
default embedded stores starts fast. Checked here: opening and writing a SQLite
consensus never imports it; a database file made by the SQLAlchemy-based version opens,
reads and takes writes, and new files get the same table; the URL forms SQLAlchemy took;
the per-connection pragmas; failed writes; connections shared by threads and ``close()``.
The shared behaviour (compare-and-set, scan, truncate, races, locks) is in
``test_location_conformance``.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from upsert_core.errors import ConfigError, DeterminateError, IndeterminateError
from upsert_core.persist.location import CasCommitted, CasMismatch, VersionedData
from upsert_core.persist.location.consensus_sql import SqlConsensus

ROOT = Path(__file__).resolve().parents[2]


def v(seqno: int, data: bytes = b"x") -> VersionedData:
    return VersionedData(seqno, data)


def test_sqlite_consensus_never_imports_sqlalchemy(tmp_path: Path) -> None:
    script = """
import sys
from upsert_core.persist.location.consensus_sql import SqlConsensus
from upsert_core.persist.location import CasCommitted, VersionedData
c = SqlConsensus(sys.argv[1])
assert c.compare_and_set("k", None, VersionedData(1, b"a")) == CasCommitted()
assert c.head("k") == VersionedData(1, b"a")
c.close()
print(sorted(m for m in sys.modules if m.split(".")[0] == "sqlalchemy"))
"""
    out = subprocess.run(
        [sys.executable, "-c", script, f"sqlite:///{tmp_path / 'c.db'}"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def _sqlalchemy_made_db(path: Path) -> None:
    """A consensus file as the SQLAlchemy-based SqlConsensus made it: its table
    definition, created by SQLAlchemy, rows inserted through it, in WAL mode."""
    from sqlalchemy import (
        BigInteger,
        Column,
        LargeBinary,
        MetaData,
        Table,
        Text,
        create_engine,
        insert,
    )

    table = Table(
        "consensus",
        MetaData(),
        Column("shard", Text, primary_key=True),
        Column("sequence_number", BigInteger, primary_key=True, autoincrement=False),
        Column("data", LargeBinary, nullable=False),
    )
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        conn.exec_driver_sql("PRAGMA journal_mode = WAL")
        table.create(conn)
        conn.execute(
            insert(table),
            [
                {"shard": "s", "sequence_number": 1, "data": b"one"},
                {"shard": "s", "sequence_number": 2, "data": b"two"},
                {"shard": "t", "sequence_number": 7, "data": b"\x00\xff"},
            ],
        )
    engine.dispose()


def _table_sql(path: Path) -> str:
    with sqlite3.connect(path) as conn:
        row = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'consensus'").fetchone()
    conn.close()
    return str(row[0])


def test_a_file_made_by_the_sqlalchemy_version_keeps_working(tmp_path: Path) -> None:
    old = tmp_path / "old.db"
    _sqlalchemy_made_db(old)
    c = SqlConsensus(f"sqlite:///{old}")
    assert c.head("s") == v(2, b"two")
    assert c.scan("s", 0, 10) == [v(1, b"one"), v(2, b"two")]
    assert sorted(c.list_keys()) == ["s", "t"]
    assert c.head("t") == v(7, b"\x00\xff")
    assert c.compare_and_set("s", 1, v(3)) == CasMismatch(current=v(2, b"two"))
    assert c.compare_and_set("s", 2, v(3, b"three")) == CasCommitted()
    assert c.truncate("s", 3) == 2
    assert c.scan("s", 0, 10) == [v(3, b"three")]
    c.close()
    # A fresh file gets the very table the SQLAlchemy version created.
    new = tmp_path / "new.db"
    SqlConsensus(f"sqlite:///{new}").head("s")
    assert _table_sql(new) == _table_sql(old)


def test_url_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    forms = {
        "sqlite:///rel.db": tmp_path / "rel.db",
        "sqlite:///sub/../rel2.db": tmp_path / "rel2.db",
        f"sqlite:///{tmp_path}/abs.db": tmp_path / "abs.db",  # sqlite:////tmp/...
        f"sqlite+pysqlite:///{tmp_path}/driver.db": tmp_path / "driver.db",
        f"SQLite:///{tmp_path}/case.db": tmp_path / "case.db",
        f"sqlite:///file:{tmp_path}/uri.db?uri=true&cache=private": tmp_path / "uri.db",
        f"sqlite:///{tmp_path}/opts.db?timeout=1&cached_statements=10": tmp_path / "opts.db",
    }
    (tmp_path / "sub").mkdir()
    for url, path in forms.items():
        c = SqlConsensus(url)
        assert c.dialect == "sqlite"
        assert c.compare_and_set("k", None, v(1)) == CasCommitted(), url
        c.close()
        assert path.exists(), url
    # A relative path is resolved when opened, as SQLAlchemy did.
    c = SqlConsensus("sqlite:///rel.db")
    monkeypatch.chdir(tmp_path / "sub")
    assert c.head("k") == v(1)


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://",
        "sqlite:///",
        "sqlite:///:memory:",
        "sqlite+pysqlite:///file::memory:?uri=true",
        "sqlite://user:S3cret@/x.db",
        "sqlite://host/x.db",
        "sqlite:///x.db?uri=maybe",
        "sqlite:///x.db?cached_statements=many",
        "sqlite+aiosqlite:///x.db",
        "sqlite:/x.db",
    ],
)
def test_bad_sqlite_urls_are_config_errors(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        SqlConsensus(url)
    assert "S3cret" not in str(info.value)


def test_every_connection_gets_the_pragmas(tmp_path: Path) -> None:
    c = SqlConsensus(f"sqlite:///{tmp_path / 'c.db'}", busy_timeout_s=2.5)
    sent: list[str] = []
    stop = c._listen(lambda statement, _params: sent.append(statement))  # noqa: SLF001
    barrier = threading.Barrier(3)

    def hold_a_connection() -> None:
        barrier.wait()
        c.head("k")

    threads = [threading.Thread(target=hold_a_connection) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop()
    opened = sent.count("PRAGMA busy_timeout = 2500")
    assert opened >= 1
    assert sent.count("PRAGMA journal_mode = WAL") == opened
    assert sent.count("PRAGMA synchronous = FULL") == opened
    with sqlite3.connect(tmp_path / "c.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_writes_take_the_write_lock_first_and_reads_do_not(tmp_path: Path) -> None:
    c = SqlConsensus(f"sqlite:///{tmp_path / 'c.db'}")
    c.head("k")  # connect and create the table before listening
    sent: list[str] = []
    c._listen(lambda statement, _params: sent.append(statement))  # noqa: SLF001
    c.compare_and_set("k", None, v(1))
    assert sent[0] == "BEGIN IMMEDIATE" and sent[-1] == "COMMIT"
    sent.clear()
    c.head("k")
    assert sent[0] == "BEGIN" and sent[-1] == "COMMIT"
    sent.clear()
    c.truncate("k", 1)
    assert sent[0] == "BEGIN IMMEDIATE"


def test_a_failed_write_is_indeterminate_a_failed_read_determinate(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    c = SqlConsensus(f"sqlite:///{path}", max_retries=0)
    assert c.compare_and_set("k", None, v(1)) == CasCommitted()
    with sqlite3.connect(path) as conn:
        # The insert now fails when prepared: not a lock, not a constraint.
        conn.execute(
            "CREATE TRIGGER boom BEFORE INSERT ON consensus BEGIN SELECT no_such_fn(); END"
        )
    conn.close()
    with pytest.raises(IndeterminateError, match="no_such_fn"):
        c.compare_and_set("k", 1, v(2))
    assert c.head("k") == v(1)  # the store is still usable, the connection rolled back
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TRIGGER boom")
    conn.close()
    c.close()  # (SQLite: a cached schema whose trigger fails to compile is not reloaded)
    assert c.compare_and_set("k", 1, v(2)) == CasCommitted()
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE consensus")  # behind the consensus's back
    conn.close()
    with pytest.raises(DeterminateError, match="no such table") as info:
        c.head("k")
    assert not isinstance(info.value, IndeterminateError)


def test_unopenable_file_is_determinate_and_says_where(tmp_path: Path) -> None:
    c = SqlConsensus(f"sqlite:///{tmp_path / 'missing-dir' / 'c.db'}")
    with pytest.raises(DeterminateError, match="cannot connect to consensus sqlite:///") as info:
        c.head("k")
    assert not isinstance(info.value, IndeterminateError)


def test_threads_share_the_consensus_and_close_reconnects(tmp_path: Path) -> None:
    c = SqlConsensus(f"sqlite:///{tmp_path / 'c.db'}", max_retries=50)
    errors: list[BaseException] = []

    def writer(key: str) -> None:
        try:
            for i in range(1, 21):
                assert c.compare_and_set(key, None if i == 1 else i - 1, v(i)) == CasCommitted()
                if i == 10:
                    c.close()  # other threads' connections in use are closed on return
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(f"k{n}",)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(c.list_keys()) == ["k0", "k1", "k2", "k3"]
    assert all(c.head(f"k{n}") == v(20) for n in range(4))
    c.close()
    assert c.head("k0") == v(20)  # usable after close
