"""``SqliteBackend``: the upsert state in one SQLite file, for state larger than memory.

Why SQLite (stdlib ``sqlite3``) and not another embedded store: it ships with Python,
so the state backend adds no native dependency to the Spark workers; a ``WITHOUT
ROWID`` table keyed by the 16-byte upsert key is a clustered B-tree, so a lookup is one
tree descent and the file holds only keys and encoded values; WAL journaling with
``synchronous=NORMAL`` makes every ``multi_put`` one atomic transaction that survives a
process crash (a power loss can drop the last transactions, which is acceptable because
the state can always be rebuilt from the output shard by rehydration; pass
``synchronous="FULL"`` to also survive that). RocksDB or LMDB bindings would write
faster but bring native wheels, tuning knobs (LMDB's fixed map size) and no stronger
guarantee that this use needs.

Invariants:

- One table ``upsert_state(key BLOB PRIMARY KEY, value BLOB) WITHOUT ROWID``; ``value``
  is ``StateValue.encode()``; a key is stored at most once.
- The file records its state format version in ``upsert_state_meta``; opening a file
  of another version raises :class:`~upsert_core.errors.StateBackendError`.
- ``multi_put`` is all-or-nothing: one ``BEGIN IMMEDIATE ... COMMIT`` with batched
  ``executemany``; the last put of a repeated key wins. On failure it rolls back.
- The stored size of a value is ``len(value.encode())``, which equals
  ``value.memory_size()``, so sizes match the in-memory backend exactly.
- Every ``sqlite3`` failure and every undecodable stored value surfaces as
  ``StateBackendError`` naming the file.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from types import TracebackType

from upsert_core.codec import UpsertKey
from upsert_core.errors import CodecError, StateBackendError
from tests.oracle.state.stats import (
    ABSENT,
    GetStats,
    PutStats,
    PutValue,
    ValueAndSize,
    ValueMetadata,
)
from tests.oracle.state.value import STATE_FORMAT_VERSION, StateValue

# Keys per ``IN (...)`` query: well under SQLite's host-parameter limit (32766).
_GET_CHUNK = 900
_SYNCHRONOUS_MODES = ("NORMAL", "FULL", "EXTRA")

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS upsert_state ("
    " key BLOB PRIMARY KEY NOT NULL, value BLOB NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS upsert_state_meta (name TEXT PRIMARY KEY NOT NULL,"
    " value TEXT NOT NULL)",
)


class SqliteBackend:
    """A blind on-disk map from upsert key to state value (see the module docstring)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "NORMAL",
        busy_timeout_ms: int = 30_000,
    ) -> None:
        if synchronous.upper() not in _SYNCHRONOUS_MODES:
            raise StateBackendError(
                f"synchronous must be one of {', '.join(_SYNCHRONOUS_MODES)}, not {synchronous!r}"
            )
        self.path = os.fspath(path)
        try:
            # isolation_level=None: we issue BEGIN/COMMIT ourselves.
            self._conn = sqlite3.connect(self.path, isolation_level=None)
        except sqlite3.Error as e:
            raise StateBackendError(f"cannot open upsert state {self.path}: {e}") from e
        try:
            self._conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
            self._conn.execute("BEGIN IMMEDIATE")
            for ddl in _SCHEMA:
                self._conn.execute(ddl)
            self._conn.execute(
                "INSERT OR IGNORE INTO upsert_state_meta(name, value) VALUES (?, ?)",
                ("state_format_version", str(STATE_FORMAT_VERSION)),
            )
            (version,) = self._conn.execute(
                "SELECT value FROM upsert_state_meta WHERE name = 'state_format_version'"
            ).fetchone()
            self._conn.execute("COMMIT")
        except sqlite3.Error as e:
            self._conn.close()
            raise StateBackendError(f"cannot initialise upsert state {self.path}: {e}") from e
        if version != str(STATE_FORMAT_VERSION):
            self._conn.close()
            raise StateBackendError(
                f"upsert state {self.path} has state format version {version}, this code "
                f"reads version {STATE_FORMAT_VERSION}; delete the file to rehydrate"
            )

    # --- reads --------------------------------------------------------------------

    def _decode(self, key: bytes, blob: bytes) -> StateValue:
        try:
            return StateValue.decode(blob)
        except CodecError as e:
            raise StateBackendError(
                f"upsert state {self.path}: undecodable value for key {key.hex()}: {e}"
            ) from e

    def multi_get(self, keys: Sequence[UpsertKey]) -> tuple[list[ValueAndSize], GetStats]:
        found: dict[bytes, bytes] = {}
        execute = self._conn.execute
        # Sorted chunks each cover one key range, so they touch few B-tree pages.
        ordered = sorted(set(keys)) if len(keys) > _GET_CHUNK else list(keys)
        try:
            for start in range(0, len(ordered), _GET_CHUNK):
                chunk = ordered[start : start + _GET_CHUNK]
                sql = (
                    "SELECT key, value FROM upsert_state WHERE key IN ("
                    + ",".join("?" * len(chunk))
                    + ")"
                )
                found.update(execute(sql, chunk).fetchall())
        except sqlite3.Error as e:
            raise StateBackendError(f"upsert state {self.path}: read failed: {e}") from e
        results: list[ValueAndSize] = []
        append = results.append
        returned = total = 0
        for key in keys:
            blob = found.get(key)
            if blob is None:
                append(ABSENT)
                continue
            value = self._decode(key, blob)
            size = len(blob)
            returned += 1
            total += size
            append(ValueAndSize(value, ValueMetadata(size, value.is_tombstone)))
        return results, GetStats(
            processed_gets=len(results), processed_gets_size=total, returned_gets=returned
        )

    def __len__(self) -> int:
        try:
            (n,) = self._conn.execute("SELECT COUNT(*) FROM upsert_state").fetchone()
        except sqlite3.Error as e:
            raise StateBackendError(f"upsert state {self.path}: count failed: {e}") from e
        return int(n)

    def items(self) -> Iterator[tuple[UpsertKey, StateValue]]:
        try:
            cursor = self._conn.execute("SELECT key, value FROM upsert_state ORDER BY key")
            while rows := cursor.fetchmany(10_000):
                for key, blob in rows:
                    yield key, self._decode(key, blob)
        except sqlite3.Error as e:
            raise StateBackendError(f"upsert state {self.path}: scan failed: {e}") from e

    # --- writes -------------------------------------------------------------------

    def multi_put(self, puts: Iterable[tuple[UpsertKey, PutValue]]) -> PutStats:
        stats = PutStats()
        # Last put of a key wins; a dict keeps exactly that one.
        final: dict[bytes, bytes | None] = {}
        for key, (value, prev) in puts:
            if value is None:
                stats.adjust(None, None, prev)
                final[key] = None
            else:
                try:
                    blob = value.encode()
                except CodecError as e:
                    raise StateBackendError(
                        f"upsert state {self.path}: cannot encode value for key {key.hex()}: {e}"
                    ) from e
                stats.adjust(value, len(blob), prev)
                final[key] = blob
        if not final:
            return stats
        # Key order turns random B-tree inserts into mostly sequential page writes.
        writes = sorted((k, b) for k, b in final.items() if b is not None)
        deletes = sorted((k,) for k, b in final.items() if b is None)
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                if writes:
                    conn.executemany(
                        "INSERT OR REPLACE INTO upsert_state(key, value) VALUES (?, ?)", writes
                    )
                if deletes:
                    conn.executemany("DELETE FROM upsert_state WHERE key = ?", deletes)
                conn.execute("COMMIT")
            except BaseException:
                # SUBTLE: roll back before re-raising so a failed batch leaves nothing
                # half-written and the connection usable.
                conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as e:
            raise StateBackendError(f"upsert state {self.path}: write failed: {e}") from e
        return stats

    # --- lifecycle ----------------------------------------------------------------

    def close(self) -> None:
        """Close the connection; the data stays in the file for the next open."""
        try:
            self._conn.close()
        except sqlite3.Error as e:
            raise StateBackendError(f"upsert state {self.path}: close failed: {e}") from e

    def __enter__(self) -> SqliteBackend:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
