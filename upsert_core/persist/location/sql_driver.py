"""What :class:`~upsert_core.persist.location.consensus_sql.SqlConsensus` asks of a database
driver, and how driver errors map to location errors.

Shared by the SQLite driver (in ``consensus_sql``) and the PostgreSQL one
(:mod:`~upsert_core.persist.location.consensus_postgres`, loaded only for PostgreSQL URLs), so
neither driver module imports the other. Stdlib only: importing it costs nothing.

- A :class:`Driver` runs one attempt (one transaction) through a :class:`Session` and
  raises :class:`Retry` (definitely failed, transient: try again), :class:`Unreachable`
  (no connection could be made, nothing was sent: try again for a while) or a
  :class:`~upsert_core.errors.LocationError`.
- :func:`classify_db_error` is the one mapping of a driver error raised after
  connecting to determinate / indeterminate / retry (see ``consensus_sql``'s docstring).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from upsert_core.errors import DeterminateError, IndeterminateError, LocationError

T = TypeVar("T")


# PostgreSQL SQLSTATEs. Class 08: connection exceptions; 57014: statement timeout or
# cancel; 57P01-03: server shutting down. 40001/40P01: serialization failure, deadlock.
_PG_RETRYABLE = frozenset({"40001", "40P01"})
_PG_UNCERTAIN = frozenset({"57014", "57P01", "57P02", "57P03"})

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


StatementObserver = Callable[[str, Any], None]
"""Called with each statement's text and its parameters just before a driver sends it."""


class Session(Protocol):
    """What one attempt may do with its connection (one transaction)."""

    integrity_error: type[Exception]

    def read(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """Rows of a query."""

    def write(self, sql: str, params: Mapping[str, Any] | None = None) -> int:
        """The rowcount of a statement that changes rows."""

    def create_table(self) -> None:
        """Create the consensus table unless it exists."""


class Driver(Protocol):
    url_for_errors: str

    def run_once(self, op: Callable[[Session], T], *, wrote: bool) -> T:
        """Run ``op`` in one transaction; raise :class:`Retry`, :class:`Unreachable`
        or a :class:`LocationError` when it fails."""

    def listen(self, observer: StatementObserver) -> Callable[[], None]:
        """Call ``observer`` before every statement; returns the function that stops it."""

    def close(self) -> None:
        """Close idle connections."""


class Retry(Exception):
    """Internal: the attempt definitely failed for a transient reason; try again."""


class Unreachable(Exception):
    """Internal: no connection could be made (nothing was sent); try again for a while."""


def sqlite_busy(exc: BaseException) -> bool:
    name = getattr(exc, "sqlite_errorname", "") or ""
    msg = str(exc).lower()
    return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in msg or "busy" in msg


def classify_db_error(exc: BaseException, *, dialect: str, wrote: bool) -> LocationError | Retry:
    """Map a driver error raised after connecting into the location error hierarchy.

    ``exc``: a ``sqlite3.Error``, or a SQLAlchemy ``DBAPIError`` wrapping the driver's
    error (its ``orig``). ``wrote``: the failed call may have changed the database
    (compare-and-set, truncate). Returns an internal retry marker for transient,
    definitely-failed attempts.
    """
    orig = getattr(exc, "orig", None) or exc
    if dialect == "sqlite":
        if sqlite_busy(orig):
            return Retry(str(orig))
        if wrote and not isinstance(orig, sqlite3.IntegrityError):
            return IndeterminateError(f"sqlite write failed, outcome unknown: {orig}")
        return DeterminateError(f"sqlite operation failed: {orig}")
    sqlstate: str | None = getattr(orig, "sqlstate", None)
    if sqlstate in _PG_RETRYABLE:
        return Retry(str(orig))
    lost = sqlstate is None or sqlstate.startswith("08") or sqlstate in _PG_UNCERTAIN
    if wrote and (lost or getattr(exc, "connection_invalidated", False)):
        return IndeterminateError(
            f"postgres write failed after it was sent, outcome unknown: {orig}"
        )
    return DeterminateError(f"postgres operation failed: {orig}")
