"""SQL-backed :class:`~upsert_core.persist.location.Consensus`: SQLite or PostgreSQL.

Table: ``consensus(shard TEXT, sequence_number BIGINT, data BLOB/BYTEA,
PRIMARY KEY (shard, sequence_number))``, created if missing.

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
  have committed). Any other failure of a read is determinate: reads have no effect.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Engine,
    LargeBinary,
    MetaData,
    Table,
    Text,
    create_engine,
    event,
    inspect,
    text,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, SQLAlchemyError

from upsert_core.errors import (
    ConfigError,
    DeterminateError,
    IndeterminateError,
    LocationError,
    LocationUnreachable,
)
from upsert_core.persist.consensus_memory import (
    check_cas_args,
    check_key,
    check_scan_args,
    check_seqno,
    truncate_error,
)
from upsert_core.persist.location import CasCommitted, CasMismatch, CasResult, SeqNo, VersionedData
from upsert_core.redact import redact_url

T = TypeVar("T")

_METADATA = MetaData()
CONSENSUS_TABLE = Table(
    "consensus",
    _METADATA,
    Column("shard", Text, primary_key=True),
    Column("sequence_number", BigInteger, primary_key=True, autoincrement=False),
    Column("data", LargeBinary, nullable=False),
)

_HEAD_SQL = text(
    "SELECT sequence_number, data FROM consensus WHERE shard = :shard"
    " ORDER BY sequence_number DESC LIMIT 1"
)
_CAS_SQL = text(
    "INSERT INTO consensus (shard, sequence_number, data)"
    " SELECT CAST(:shard AS TEXT), CAST(:seqno AS BIGINT), :data"
    " WHERE (SELECT MAX(sequence_number) FROM consensus WHERE shard = :shard) = :expected"
    " ON CONFLICT DO NOTHING"
)
_CAS_FROM_NONE_SQL = text(
    "INSERT INTO consensus (shard, sequence_number, data)"
    " SELECT CAST(:shard AS TEXT), CAST(:seqno AS BIGINT), :data"
    " WHERE NOT EXISTS (SELECT 1 FROM consensus WHERE shard = :shard)"
    " ON CONFLICT DO NOTHING"
)
_SCAN_SQL = text(
    "SELECT sequence_number, data FROM consensus"
    " WHERE shard = :shard AND sequence_number >= :from_seqno"
    " ORDER BY sequence_number ASC LIMIT :limit"
)
_TRUNCATE_SQL = text(
    "DELETE FROM consensus WHERE shard = :shard AND sequence_number < :seqno"
    " AND EXISTS (SELECT 1 FROM consensus WHERE shard = :shard AND sequence_number >= :seqno)"
)
_LIST_KEYS_SQL = text("SELECT DISTINCT shard FROM consensus ORDER BY shard")

# PostgreSQL SQLSTATEs. Class 08: connection exceptions; 57014: statement timeout or
# cancel; 57P01-03: server shutting down. 40001/40P01: serialization failure, deadlock.
_PG_RETRYABLE = frozenset({"40001", "40P01"})
_PG_UNCERTAIN = frozenset({"57014", "57P01", "57P02", "57P03"})


DEFAULT_RECONNECT_S = 15.0
_RECONNECT_BACKOFF_S = (0.05, 1.0)  # first and largest pause between connect attempts


# Connect failures worth retrying: the network or the server is between states (a
# restart, a failover, a full server). Anything else (authentication, an unknown
# database, role or host, a bad URL option, SSL settings) needs the user: fail at once.
_PG_TRANSIENT_CONNECT = (
    "connection refused", "connection reset", "timeout expired", "timed out",
    "server closed the connection", "could not receive data", "could not send data",
    "no route to host", "network is unreachable",
    "starting up", "shutting down", "in recovery", "not yet accepting connections",
    "too many clients", "remaining connection slots", "terminating connection",
    "consuming input failed", "eof detected", "ssl syscall error",
)


def pg_connect_is_transient(message: str) -> bool:
    """Whether a failed PostgreSQL connect may succeed if tried again shortly: refused,
    reset or timed out, or a server that is starting, stopping or full. Everything
    else (authentication, unknown database/role/host, bad options) needs the user."""
    lowered = message.lower()
    return any(phrase in lowered for phrase in _PG_TRANSIENT_CONNECT)


class _Retry(Exception):
    """Internal: the attempt definitely failed for a transient reason; try again."""


class _Unreachable(Exception):
    """Internal: no connection could be made (nothing was sent); try again for a while."""


def _sqlite_busy(exc: BaseException) -> bool:
    name = getattr(exc, "sqlite_errorname", "") or ""
    msg = str(exc).lower()
    return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in msg or "busy" in msg


def classify_db_error(exc: DBAPIError, *, dialect: str, wrote: bool) -> LocationError | _Retry:
    """Map a driver error raised after connecting into the location error hierarchy.

    ``wrote``: the failed call may have changed the database (compare-and-set,
    truncate). Returns an internal retry marker for transient, definitely-failed attempts.
    """
    orig = exc.orig if exc.orig is not None else exc
    if dialect == "sqlite":
        if _sqlite_busy(orig):
            return _Retry(str(orig))
        if wrote and not isinstance(exc, IntegrityError):
            return IndeterminateError(f"sqlite write failed, outcome unknown: {orig}")
        return DeterminateError(f"sqlite operation failed: {orig}")
    sqlstate: str | None = getattr(orig, "sqlstate", None)
    if sqlstate in _PG_RETRYABLE:
        return _Retry(str(orig))
    lost = sqlstate is None or sqlstate.startswith("08") or sqlstate in _PG_UNCERTAIN
    if wrote and (lost or exc.connection_invalidated):
        return IndeterminateError(
            f"postgres write failed after it was sent, outcome unknown: {orig}"
        )
    return DeterminateError(f"postgres operation failed: {orig}")


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
        # shows them through the one redaction (SQLAlchemy's ``hide_password`` misses the
        # query string).
        shown = redact_url(repr(url))
        try:
            parsed = make_url(url)
        except (ArgumentError, ValueError) as e:  # ValueError: e.g. a non-numeric port
            raise ConfigError(f"invalid consensus URL {shown}: {redact_url(str(e))}") from None
        self._dialect = parsed.get_backend_name()
        self._max_retries = max_retries
        self._backoff_s = backoff_s
        if not reconnect_s >= 0:  # also rejects NaN
            raise ConfigError(f"reconnect_s must be >= 0 seconds, got {reconnect_s!r}")
        self._reconnect_s = reconnect_s
        self._url_for_errors = redact_url(parsed.render_as_string(hide_password=False))
        if self._dialect == "sqlite":
            db = parsed.database or ""
            if db in ("", ":memory:") or db.startswith("file::memory:"):
                raise ConfigError(
                    f"in-memory SQLite cannot be shared between connections ({shown});"
                    " use a file (sqlite:///path/consensus.db) or mem://"
                )
            self._engine = _sqlite_engine(url, busy_timeout_s)
        elif self._dialect == "postgresql":
            if parsed.get_driver_name() != "psycopg":
                parsed = parsed.set(drivername="postgresql+psycopg")
            # Keep any libpq ``options`` from the URL (e.g. a search_path) and add ours.
            options = parsed.query.get("options", "")
            if isinstance(options, tuple):
                options = " ".join(options)
            parsed = parsed.difference_update_query(["options"])
            self._engine = _postgres_engine(
                parsed.render_as_string(False), connect_timeout_s, options
            )
        else:
            raise ConfigError(
                f"unsupported consensus URL {shown}: use sqlite:///... or postgresql+psycopg://..."
            )
        self._create_lock = threading.Lock()
        self._created = False

    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._dialect

    def close(self) -> None:
        """Close pooled connections (the object stays usable; it reconnects)."""
        self._engine.dispose()

    # --- the Consensus protocol -------------------------------------------------------

    def head(self, key: str) -> VersionedData | None:
        check_key(key)
        return self._run(lambda conn: _head(conn, key), wrote=False)

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

        def cas(conn: Connection) -> CasResult:
            try:
                inserted = conn.execute(stmt, params).rowcount
            except IntegrityError:
                # SUBTLE: a racing inserter of the same seqno that slipped past ON
                # CONFLICT (e.g. a driver without upsert support) lost the race: that is
                # an ordinary mismatch, not a failure.
                inserted = 0
            if inserted == 1:
                return CasCommitted()
            return CasMismatch(current=_head(conn, key))

        return self._run(cas, wrote=True)

    def scan(self, key: str, from_seqno: SeqNo, limit: int) -> list[VersionedData]:
        check_scan_args(key, from_seqno, limit)
        if limit == 0:
            return []
        params = {"shard": key, "from_seqno": from_seqno, "limit": limit}

        def scan(conn: Connection) -> list[VersionedData]:
            rows = conn.execute(_SCAN_SQL, params).all()
            return [VersionedData(int(r[0]), bytes(r[1])) for r in rows]

        return self._run(scan, wrote=False)

    def truncate(self, key: str, seqno: SeqNo) -> int:
        check_key(key)
        check_seqno(seqno)
        params = {"shard": key, "seqno": seqno}

        def truncate(conn: Connection) -> int:
            deleted = conn.execute(_TRUNCATE_SQL, params).rowcount
            if deleted > 0:
                return int(deleted)
            # Zero rows: either nothing lay below the bound, or no row at or above it
            # exists (the statement refused to remove the head). The head tells which.
            head = _head(conn, key)
            if head is None or head.seqno < seqno:
                raise truncate_error(key, seqno, head)
            # SUBTLE: on PostgreSQL (autocommit) the head may have reached the bound
            # between the two statements; deleting again makes this call linearize after
            # that append instead of leaving rows that a truncate "after" it would remove.
            return int(conn.execute(_TRUNCATE_SQL, params).rowcount)

        return self._run(truncate, wrote=True)

    def list_keys(self) -> Iterator[str]:
        rows = self._run(lambda conn: conn.execute(_LIST_KEYS_SQL).all(), wrote=False)
        return iter([str(r[0]) for r in rows])

    # --- plumbing -------------------------------------------------------------------

    def _ensure_table(self) -> None:
        if self._created:
            return
        with self._create_lock:
            if not self._created:
                self._retrying(self._create_table, wrote=False)
                self._created = True

    def _create_table(self, conn: Connection) -> None:
        try:
            CONSENSUS_TABLE.create(conn, checkfirst=True)
        except DBAPIError as e:
            # SUBTLE: two processes creating the table at once: PostgreSQL reports a
            # unique violation on its catalog for the loser. The table exists; go on.
            if not inspect(conn).has_table("consensus"):
                raise e

    def _run(self, op: Callable[[Connection], T], *, wrote: bool) -> T:
        self._ensure_table()
        return self._retrying(op, wrote=wrote)

    def _retrying(self, op: Callable[[Connection], T], *, wrote: bool) -> T:
        attempt = 0
        started = time.monotonic()
        pause = _RECONNECT_BACKOFF_S[0]
        while True:
            try:
                return self._run_once(op, wrote=wrote)
            except _Unreachable as u:
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
            except _Retry as r:
                attempt += 1
                if attempt > self._max_retries:
                    raise DeterminateError(
                        f"consensus {self._url_for_errors} still busy after"
                        f" {self._max_retries} retries: {redact_url(str(r))}"
                    ) from None
                delay = self._backoff_s * (2 ** (attempt - 1))
                time.sleep(delay * (0.5 + random.random()))

    def _run_once(self, op: Callable[[Connection], T], *, wrote: bool) -> T:
        try:
            conn = self._engine.connect()
        except DBAPIError as e:
            if self._dialect == "sqlite" and _sqlite_busy(e.orig or e):
                raise _Retry(str(e.orig)) from e
            if self._dialect == "postgresql" and pg_connect_is_transient(str(e.orig)):
                raise _Unreachable(str(e.orig)) from e
            raise DeterminateError(
                f"cannot connect to consensus {self._url_for_errors}: {redact_url(str(e.orig))}"
            ) from e
        except SQLAlchemyError as e:
            raise DeterminateError(
                f"cannot connect to consensus {self._url_for_errors}: {redact_url(str(e))}"
            ) from e
        with conn:
            try:
                if self._dialect == "sqlite" and wrote:
                    # SUBTLE: take SQLite's write lock before reading the head, so the
                    # read and the insert see the same database (and the busy timeout,
                    # not a snapshot conflict, handles waiting writers).
                    conn.execution_options(sqlite_begin="IMMEDIATE")
                with conn.begin():
                    return op(conn)
            except DBAPIError as e:
                err = classify_db_error(e, dialect=self._dialect, wrote=wrote)
                raise err from e


def _head(conn: Connection, key: str) -> VersionedData | None:
    row = conn.execute(_HEAD_SQL, {"shard": key}).first()
    return None if row is None else VersionedData(int(row[0]), bytes(row[1]))


def _sqlite_engine(url: str, busy_timeout_s: float) -> Engine:
    engine = create_engine(
        url, connect_args={"timeout": busy_timeout_s, "check_same_thread": False}
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # We issue BEGIN ourselves (below); the sqlite3 module must not.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            # WAL: readers never block the writer, several processes share the file.
            cur.execute("PRAGMA journal_mode = WAL")
            cur.execute("PRAGMA synchronous = FULL")
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        conn.exec_driver_sql("BEGIN IMMEDIATE" if mode == "IMMEDIATE" else "BEGIN")

    return engine


def _postgres_engine(url: str, connect_timeout_s: float, options: str) -> Engine:
    # SUBTLE: every statement runs in its own SERIALIZABLE transaction (autocommit with a
    # serializable default): the compare-and-set costs one round trip, and two racers
    # reading the same head cannot both insert, whatever seqnos they insert.
    return create_engine(
        url,
        isolation_level="AUTOCOMMIT",
        pool_pre_ping=True,
        connect_args={
            "connect_timeout": max(1, int(connect_timeout_s)),
            "options": f"{options} -c default_transaction_isolation=serializable".strip(),
        },
    )
