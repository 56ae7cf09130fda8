"""SQL-backed :class:`~upsert_core.persist.location.Consensus`: SQLite or PostgreSQL.

Table: ``consensus(shard TEXT, sequence_number BIGINT, data BLOB/BYTEA,
PRIMARY KEY (shard, sequence_number))``, created if missing.

Drivers: SQLite runs on the stdlib ``sqlite3`` module (here); PostgreSQL on SQLAlchemy
with psycopg 3 (:mod:`~upsert_core.persist.location.consensus_postgres`), imported only when a
PostgreSQL URL is opened, so a process on the default embedded stores never pays
SQLAlchemy's ~0.2 s import. Both share the statements and the retry loop below and the
error classification in :mod:`~upsert_core.persist.location.sql_driver`; each attempt sees the
database through a small session (``read``/``write``/``create_table``).

SQLite URLs take the forms SQLAlchemy takes: ``sqlite:///relative.db`` (relative to the
working directory when opened), ``sqlite:////abs/path.db``, ``sqlite+pysqlite:///...``,
with pysqlite's query options (``uri=true`` makes the path a SQLite URI and passes the
other options to it; ``cached_statements`` is honoured; ``timeout``,
``check_same_thread``, ``isolation_level`` and ``detect_types`` are fixed by this module
and ignored). An existing file made by the SQLAlchemy-based version opens as it is.
Each connection sets ``busy_timeout``, ``journal_mode = WAL`` (readers never block the
writer; several processes share the file) and ``synchronous = FULL``. Connections are
pooled: a thread takes one for one attempt and puts it back, so threads never share one
at the same time.

Invariants kept:

- ``compare_and_set`` is ONE conditional statement: insert the new row only if the
  current maximum seqno of the key equals the expectation (or, for ``None``, no row
  exists), ``ON CONFLICT DO NOTHING``. The rowcount decides committed vs mismatch.
  Both databases run it serializably: SQLite takes the write lock first
  (``BEGIN IMMEDIATE``), PostgreSQL connections default to ``SERIALIZABLE`` isolation,
  so even racers that insert *different* new seqnos against the same head cannot both
  commit (one gets a serialization failure, which is retried and then sees a mismatch).
- ``truncate`` is ONE statement that deletes rows below the bound only if a row at or
  above it exists, so the head is never removed.
- Only bound parameters reach the database; no value is formatted into SQL text.

Errors (``upsert_core.errors``):

- Failing to connect to PostgreSQL (refused, reset, timed out: a restart, a failover,
  a network blip) is retried with capped, jittered exponential backoff until
  ``reconnect_s`` seconds (default 15) have passed since the call started, then
  reported as :class:`LocationUnreachable` saying how long it tried (callers do not
  retry that again): nothing was sent either way. One attempt that hangs (packets
  dropped) can add up to ``connect_timeout_s`` on top. A pooled connection the server
  dropped is found by a ping at checkout and replaced. Refusals that need the user
  (authentication, unknown database, role or host, bad options) and SQLite failing to
  open its file are reported at once.
- SQLite "database is locked"/"busy" and PostgreSQL serialization failures or
  deadlocks are retried with backoff, then reported as :class:`DeterminateError`.
- A write whose connection dropped or timed out after the statement was sent is an
  :class:`IndeterminateError` (PostgreSQL runs each statement in autocommit, so it may
  have committed), as is any SQLite write that failed for another reason than a busy
  lock or a constraint. Any other failure of a read is determinate: reads have no effect.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from upsert_core.errors import ConfigError, DeterminateError, LocationUnreachable
from upsert_core.persist.location import CasCommitted, CasMismatch, CasResult, SeqNo, VersionedData
from upsert_core.persist.location.consensus_memory import (
    check_cas_args,
    check_key,
    check_scan_args,
    check_seqno,
    truncate_error,
)
from upsert_core.persist.location.sql_driver import (
    Driver,
    Retry,
    Session,
    StatementObserver,
    Unreachable,
    classify_db_error,
    sqlite_busy,
)
from upsert_core.redact import redact_url

T = TypeVar("T")

_HEAD_SQL = (
    "SELECT sequence_number, data FROM consensus WHERE shard = :shard"
    " ORDER BY sequence_number DESC LIMIT 1"
)
_CAS_SQL = (
    "INSERT INTO consensus (shard, sequence_number, data)"
    " SELECT CAST(:shard AS TEXT), CAST(:seqno AS BIGINT), :data"
    " WHERE (SELECT MAX(sequence_number) FROM consensus WHERE shard = :shard) = :expected"
    " ON CONFLICT DO NOTHING"
)
_CAS_FROM_NONE_SQL = (
    "INSERT INTO consensus (shard, sequence_number, data)"
    " SELECT CAST(:shard AS TEXT), CAST(:seqno AS BIGINT), :data"
    " WHERE NOT EXISTS (SELECT 1 FROM consensus WHERE shard = :shard)"
    " ON CONFLICT DO NOTHING"
)
_SCAN_SQL = (
    "SELECT sequence_number, data FROM consensus"
    " WHERE shard = :shard AND sequence_number >= :from_seqno"
    " ORDER BY sequence_number ASC LIMIT :limit"
)
_TRUNCATE_SQL = (
    "DELETE FROM consensus WHERE shard = :shard AND sequence_number < :seqno"
    " AND EXISTS (SELECT 1 FROM consensus WHERE shard = :shard AND sequence_number >= :seqno)"
)
_LIST_KEYS_SQL = "SELECT DISTINCT shard FROM consensus ORDER BY shard"

# The DDL SQLAlchemy emitted for the table on SQLite, kept byte for byte so databases
# made by either version look the same.
_SQLITE_HAS_TABLE_SQL = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'consensus'"
_SQLITE_CREATE_SQL = (
    "CREATE TABLE IF NOT EXISTS consensus (\n\tshard TEXT NOT NULL, "
    "\n\tsequence_number BIGINT NOT NULL, \n\tdata BLOB NOT NULL, "
    "\n\tPRIMARY KEY (shard, sequence_number)\n)"
)

DEFAULT_RECONNECT_S = 15.0
_RECONNECT_BACKOFF_S = (0.05, 1.0)  # first and largest pause between connect attempts


# How SQLAlchemy splits a URL (``sqlalchemy.engine.url._parse_url``): the same URLs
# parse the same way without importing it.
_URL = re.compile(
    r"""
        (?P<name>[\w\+]+)://
        (?:
            (?P<username>[^:/]*)
            (?::(?P<password>[^@]*))?
        @)?
        (?:
            (?:
                \[(?P<ipv6host>[^/\?]+)\] |
                (?P<ipv4host>[^/:\?]+)
            )?
            (?::(?P<port>[^/\?]*))?
        )?
        (?:/(?P<database>[^\?]*))?
        (?:\?(?P<query>.*))?
    """,
    re.X,
)


class SqlConsensus:
    """A durable consensus on SQLite (file URLs) or PostgreSQL (``postgresql+psycopg``).

    ``busy_timeout_s``: how long one SQLite attempt waits for the write lock;
    ``max_retries``: how many times a transiently failed attempt (lock, serialization
    failure) is retried with jittered exponential backoff before a DeterminateError;
    ``reconnect_s``: how long a call keeps trying to connect to PostgreSQL (0: once).
    """

    def __init__(
        self,
        url: str,
        *,
        busy_timeout_s: float = 5.0,
        connect_timeout_s: float = 10.0,
        max_retries: int = 6,
        backoff_s: float = 0.02,
        reconnect_s: float = DEFAULT_RECONNECT_S,
    ) -> None:
        # URLs may hold a password (userinfo or ``?password=``), so every message below
        # shows them through the one redaction.
        shown = redact_url(repr(url))
        match = _URL.match(url) if isinstance(url, str) else None
        if match is None:
            raise ConfigError(f"invalid consensus URL {shown}")
        scheme = match["name"].lower()
        self._dialect = scheme.split("+", 1)[0]
        self._max_retries = max_retries
        self._backoff_s = backoff_s
        if not reconnect_s >= 0:  # also rejects NaN
            raise ConfigError(f"reconnect_s must be >= 0 seconds, got {reconnect_s!r}")
        self._reconnect_s = reconnect_s
        self._driver: Driver
        if scheme in ("sqlite", "sqlite+pysqlite"):
            self._driver = _SqliteDriver(match, redact_url(url), busy_timeout_s)
        elif self._dialect == "postgresql":
            # heavy: SQLAlchemy (~0.2 s to import), loaded only for PostgreSQL.
            from upsert_core.persist.location.consensus_postgres import PostgresDriver

            self._driver = PostgresDriver(url, shown, connect_timeout_s)
        else:
            raise ConfigError(
                f"unsupported consensus URL {shown}: use sqlite:///... or postgresql+psycopg://..."
            )
        self._url_for_errors = self._driver.url_for_errors
        self._create_lock = threading.Lock()
        self._created = False

    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._dialect

    def close(self) -> None:
        """Close pooled connections (the object stays usable; it reconnects)."""
        self._driver.close()

    def _listen(self, observer: StatementObserver) -> Callable[[], None]:
        """Test hook: call ``observer(statement, parameters)`` before every statement sent
        to the database; returns the function that stops it."""
        return self._driver.listen(observer)

    # --- the Consensus protocol -------------------------------------------------------

    def head(self, key: str) -> VersionedData | None:
        check_key(key)
        return self._run(lambda s: _head(s, key), wrote=False)

    def compare_and_set(
        self, key: str, expected: SeqNo | None, new: VersionedData
    ) -> CasResult:
        check_cas_args(key, expected, new)
        params: dict[str, Any] = {"shard": key, "seqno": new.seqno, "data": new.data}
        if expected is None:
            stmt = _CAS_FROM_NONE_SQL
        else:
            stmt = _CAS_SQL
            params["expected"] = expected

        def cas(session: Session) -> CasResult:
            try:
                inserted = session.write(stmt, params)
            except session.integrity_error:
                # SUBTLE: a racing inserter of the same seqno that slipped past ON
                # CONFLICT (e.g. a driver without upsert support) lost the race: that is
                # an ordinary mismatch, not a failure.
                inserted = 0
            if inserted == 1:
                return CasCommitted()
            return CasMismatch(current=_head(session, key))

        return self._run(cas, wrote=True)

    def scan(self, key: str, from_seqno: SeqNo, limit: int) -> list[VersionedData]:
        check_scan_args(key, from_seqno, limit)
        if limit == 0:
            return []
        params = {"shard": key, "from_seqno": from_seqno, "limit": limit}

        def scan(session: Session) -> list[VersionedData]:
            rows = session.read(_SCAN_SQL, params)
            return [VersionedData(int(r[0]), bytes(r[1])) for r in rows]

        return self._run(scan, wrote=False)

    def truncate(self, key: str, seqno: SeqNo) -> int:
        check_key(key)
        check_seqno(seqno)
        params = {"shard": key, "seqno": seqno}

        def truncate(session: Session) -> int:
            deleted = session.write(_TRUNCATE_SQL, params)
            if deleted > 0:
                return deleted
            # Zero rows: either nothing lay below the bound, or no row at or above it
            # exists (the statement refused to remove the head). The head tells which.
            head = _head(session, key)
            if head is None or head.seqno < seqno:
                raise truncate_error(key, seqno, head)
            # SUBTLE: on PostgreSQL (autocommit) the head may have reached the bound
            # between the two statements; deleting again makes this call linearize after
            # that append instead of leaving rows that a truncate "after" it would remove.
            return session.write(_TRUNCATE_SQL, params)

        return self._run(truncate, wrote=True)

    def list_keys(self) -> Iterator[str]:
        rows = self._run(lambda s: s.read(_LIST_KEYS_SQL), wrote=False)
        return iter([str(r[0]) for r in rows])

    # --- plumbing -------------------------------------------------------------------

    def _ensure_table(self) -> None:
        if self._created:
            return
        with self._create_lock:
            if not self._created:
                self._retrying(lambda s: s.create_table(), wrote=False)
                self._created = True

    def _run(self, op: Callable[[Session], T], *, wrote: bool) -> T:
        self._ensure_table()
        return self._retrying(op, wrote=wrote)

    def _retrying(self, op: Callable[[Session], T], *, wrote: bool) -> T:
        attempt = 0
        started = time.monotonic()
        pause = _RECONNECT_BACKOFF_S[0]
        while True:
            try:
                return self._driver.run_once(op, wrote=wrote)
            except Unreachable as u:
                waited = time.monotonic() - started
                if waited >= self._reconnect_s:
                    tried = f" (retried for {waited:.1f} s)" if self._reconnect_s > 0 else ""
                    raise LocationUnreachable(
                        f"cannot connect to consensus {self._url_for_errors}{tried}:"
                        f" {redact_url(str(u))}"
                    ) from None
                jittered = pause * (0.5 + random.random() / 2)
                time.sleep(min(jittered, self._reconnect_s - waited))
                pause = min(pause * 2, _RECONNECT_BACKOFF_S[1])
            except Retry as r:
                attempt += 1
                if attempt > self._max_retries:
                    raise DeterminateError(
                        f"consensus {self._url_for_errors} still busy after"
                        f" {self._max_retries} retries: {redact_url(str(r))}"
                    ) from None
                delay = self._backoff_s * (2 ** (attempt - 1))
                time.sleep(delay * (0.5 + random.random()))


def _head(session: Session, key: str) -> VersionedData | None:
    rows = session.read(_HEAD_SQL, {"shard": key})
    return None if not rows else VersionedData(int(rows[0][0]), bytes(rows[0][1]))


# --- SQLite on the stdlib sqlite3 module ----------------------------------------------

_TRUE = frozenset({"true", "yes", "on", "y", "t", "1"})
_FALSE = frozenset({"false", "no", "off", "n", "f", "0"})
# pysqlite's connect arguments that SQLAlchemy took from the URL's query string.
_PYSQLITE_OPTIONS = (
    "uri", "timeout", "isolation_level", "detect_types", "check_same_thread",
    "cached_statements",
)


class _SqliteSession:
    integrity_error: type[Exception] = sqlite3.IntegrityError

    def __init__(self, driver: _SqliteDriver, conn: sqlite3.Connection) -> None:
        self._driver = driver
        self._conn = conn

    def read(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        cur = self._driver.execute(self._conn, sql, params)
        try:
            return cur.fetchall()
        finally:
            cur.close()

    def write(self, sql: str, params: Mapping[str, Any] | None = None) -> int:
        cur = self._driver.execute(self._conn, sql, params)
        try:
            return int(cur.rowcount)
        finally:
            cur.close()

    def create_table(self) -> None:
        if not self.read(_SQLITE_HAS_TABLE_SQL):
            self.write(_SQLITE_CREATE_SQL)


class _SqliteDriver:
    """Pooled ``sqlite3`` connections to one database file.

    A thread takes an idle connection (or opens one) for one attempt and puts it back;
    ``check_same_thread=False`` lets the next attempt run on another thread.
    ``close()`` closes the idle ones; one in use is closed when it comes back.
    """

    def __init__(self, url: re.Match[str], url_for_errors: str, busy_timeout_s: float) -> None:
        shown = repr(url_for_errors)
        if any(url[part] for part in ("username", "password", "ipv4host", "ipv6host", "port")):
            raise ConfigError(
                f"invalid SQLite URL {shown}: it takes no user, password, host or port;"
                " use sqlite:///relative/path.db or sqlite:////absolute/path.db"
            )
        query: dict[str, str] = dict(parse_qsl(url["query"] or ""))
        db = url["database"] or ""
        if db in ("", ":memory:") or db.startswith("file::memory:"):
            raise ConfigError(
                f"in-memory SQLite cannot be shared between connections ({shown});"
                " use a file (sqlite:///path/consensus.db) or mem://"
            )
        uri = _url_flag(query, "uri", shown)
        if uri:
            extra = {k: v for k, v in query.items() if k not in _PYSQLITE_OPTIONS}
            if extra:
                db += "?" + "&".join(f"{k}={extra[k]}" for k in sorted(extra))
        else:
            db = os.path.abspath(db)
        self._connect_args: dict[str, Any] = {"uri": uri}
        if "cached_statements" in query:
            try:
                self._connect_args["cached_statements"] = int(query["cached_statements"])
            except ValueError:
                raise ConfigError(
                    f"invalid SQLite URL {shown}: cached_statements must be an integer"
                ) from None
        self._database = db
        self._busy_timeout_s = busy_timeout_s
        self.url_for_errors = url_for_errors
        self._lock = threading.Lock()
        self._idle: list[sqlite3.Connection] = []
        self._generation = 0  # close() bumps it: connections of older ones are closed
        self._pid = os.getpid()
        self._observers: list[StatementObserver] = []

    def execute(
        self, conn: sqlite3.Connection, sql: str, params: Mapping[str, Any] | None = None
    ) -> sqlite3.Cursor:
        for observer in self._observers:
            observer(sql, params)
        return conn.execute(sql, params or {})

    def listen(self, observer: StatementObserver) -> Callable[[], None]:
        with self._lock:
            self._observers = [*self._observers, observer]

        def stop() -> None:
            with self._lock:
                self._observers = [o for o in self._observers if o is not observer]

        return stop

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
            self._generation += 1
        for conn in idle:
            conn.close()

    def _connect(self) -> sqlite3.Connection:
        # We issue BEGIN ourselves (isolation_level=None); the sqlite3 module must not.
        conn = sqlite3.connect(
            self._database,
            timeout=self._busy_timeout_s,
            isolation_level=None,
            check_same_thread=False,
            **self._connect_args,
        )
        try:
            self.execute(conn, f"PRAGMA busy_timeout = {int(self._busy_timeout_s * 1000)}")
            # WAL: readers never block the writer, several processes share the file.
            self.execute(conn, "PRAGMA journal_mode = WAL").close()
            self.execute(conn, "PRAGMA synchronous = FULL")
        except BaseException:
            conn.close()
            raise
        return conn

    def _checkout(self) -> tuple[sqlite3.Connection, int]:
        with self._lock:
            if self._pid != os.getpid():
                # SUBTLE: a forked child must not use (or close) its parent's connections.
                self._pid, self._idle = os.getpid(), []
            generation = self._generation
            if self._idle:
                return self._idle.pop(), generation
        return self._connect(), generation

    def _checkin(self, conn: sqlite3.Connection, generation: int) -> None:
        with self._lock:
            if generation == self._generation and self._pid == os.getpid():
                self._idle.append(conn)
                return
        conn.close()

    def run_once(self, op: Callable[[_SqliteSession], T], *, wrote: bool) -> T:
        try:
            conn, generation = self._checkout()
        except sqlite3.Error as e:
            if sqlite_busy(e):
                raise Retry(str(e)) from e
            raise DeterminateError(
                f"cannot connect to consensus {self.url_for_errors}: {redact_url(str(e))}"
            ) from e
        keep = True
        try:
            # SUBTLE: a write takes SQLite's write lock before reading the head, so the
            # read and the insert see the same database (and the busy timeout, not a
            # snapshot conflict, handles waiting writers).
            self.execute(conn, "BEGIN IMMEDIATE" if wrote else "BEGIN")
            try:
                result = op(_SqliteSession(self, conn))
                self.execute(conn, "COMMIT")
            finally:
                if conn.in_transaction:  # op or COMMIT failed: undo, keep its error
                    with contextlib.suppress(sqlite3.Error):
                        self.execute(conn, "ROLLBACK")
            return result
        except sqlite3.Error as e:
            if not sqlite_busy(e):
                # SUBTLE: a connection that failed otherwise may be the cause (e.g. a
                # schema it cached that failed to compile): the next attempt opens a new one.
                keep = False
            raise classify_db_error(e, dialect="sqlite", wrote=wrote) from e
        finally:
            if keep and not conn.in_transaction:
                self._checkin(conn, generation)
            else:  # failed, or could not roll back: do not hand it out again
                conn.close()


def _url_flag(query: Mapping[str, str], name: str, shown: str) -> bool:
    raw = query.get(name)
    if raw is None:
        return False
    value = raw.strip().lower()
    if value not in _TRUE | _FALSE:
        raise ConfigError(f"invalid SQLite URL {shown}: {name} must be true or false")
    return value in _TRUE
