"""The PostgreSQL driver behind :class:`~upsert_core.persist.location.consensus_sql.SqlConsensus`.

Runs on SQLAlchemy (psycopg 3). Only :class:`SqlConsensus` imports this module, and only
when it opens a ``postgresql+psycopg://`` URL: SQLAlchemy takes ~0.2 s to import, which a
SQLite consensus (stdlib ``sqlite3``, the default embedded store) never pays.

The statements and the retry loop are shared with SQLite and live in
:mod:`~upsert_core.persist.location.consensus_sql`, the driver contract and the error
classification in :mod:`~upsert_core.persist.location.sql_driver` (this module imports only the
latter, so the two never import each other); this module connects, runs one attempt on
a pooled connection and maps driver errors (see ``consensus_sql``'s docstring).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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
    TextClause,
    create_engine,
    event,
    inspect,
    text,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, SQLAlchemyError

from upsert_core.errors import ConfigError, DeterminateError
from upsert_core.persist.location.sql_driver import (
    StatementObserver,
    Unreachable,
    classify_db_error,
    pg_connect_is_transient,
)
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


class _PostgresSession:
    """One attempt's view of a pooled connection (see ``sql_driver.Session``)."""

    integrity_error: type[Exception] = IntegrityError

    def __init__(self, conn: Connection, texts: dict[str, TextClause]) -> None:
        self._conn = conn
        self._texts = texts

    def _text(self, sql: str) -> TextClause:
        clause = self._texts.get(sql)
        if clause is None:
            clause = self._texts[sql] = text(sql)
        return clause

    def read(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._conn.execute(self._text(sql), dict(params or {})).all()]

    def write(self, sql: str, params: Mapping[str, Any] | None = None) -> int:
        return int(self._conn.execute(self._text(sql), dict(params or {})).rowcount)

    def create_table(self) -> None:
        try:
            CONSENSUS_TABLE.create(self._conn, checkfirst=True)
        except DBAPIError as e:
            # SUBTLE: two processes creating the table at once: PostgreSQL reports a
            # unique violation on its catalog for the loser. The table exists; go on.
            if not inspect(self._conn).has_table("consensus"):
                raise e


class PostgresDriver:
    """Connections to one PostgreSQL database for :class:`SqlConsensus`."""

    def __init__(self, url: str, shown: str, connect_timeout_s: float) -> None:
        try:
            parsed = make_url(url)
        except (ArgumentError, ValueError) as e:  # ValueError: e.g. a non-numeric port
            raise ConfigError(f"invalid consensus URL {shown}: {redact_url(str(e))}") from None
        # SQLAlchemy's ``hide_password`` misses a ``?password=``: redact_url covers both.
        self.url_for_errors = redact_url(parsed.render_as_string(hide_password=False))
        if parsed.get_driver_name() != "psycopg":
            parsed = parsed.set(drivername="postgresql+psycopg")
        # Keep any libpq ``options`` from the URL (e.g. a search_path) and add ours.
        options = parsed.query.get("options", "")
        if isinstance(options, tuple):
            options = " ".join(options)
        parsed = parsed.difference_update_query(["options"])
        self._engine = _postgres_engine(parsed.render_as_string(False), connect_timeout_s, options)
        self._texts: dict[str, TextClause] = {}

    def close(self) -> None:
        self._engine.dispose()

    def listen(self, observer: StatementObserver) -> Callable[[], None]:
        def before(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
            observer(statement, params)

        event.listen(self._engine, "before_cursor_execute", before)
        return lambda: event.remove(self._engine, "before_cursor_execute", before)

    def run_once(self, op: Callable[[_PostgresSession], T], *, wrote: bool) -> T:
        try:
            conn = self._engine.connect()
        except DBAPIError as e:
            if pg_connect_is_transient(str(e.orig)):
                raise Unreachable(str(e.orig)) from e
            raise DeterminateError(
                f"cannot connect to consensus {self.url_for_errors}: {redact_url(str(e.orig))}"
            ) from e
        except SQLAlchemyError as e:
            raise DeterminateError(
                f"cannot connect to consensus {self.url_for_errors}: {redact_url(str(e))}"
            ) from e
        with conn:
            try:
                with conn.begin():
                    return op(_PostgresSession(conn, self._texts))
            except DBAPIError as e:
                raise classify_db_error(e, dialect="postgresql", wrote=wrote) from e


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
