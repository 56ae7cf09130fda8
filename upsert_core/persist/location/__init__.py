"""Storage contracts the shard is built on: ``Consensus`` and ``Blob``.

Both must be linearizable. The implementations are this package's modules
(``consensus_sql`` with its PostgreSQL driver ``consensus_postgres``,
``consensus_memory``, ``blob_local``, ``blob_s3``, ``blob_memory``) and all pass
``tests/persist/test_location_conformance.py``; ``unreliable`` wraps any of them with
injected faults, and ``urls`` opens one from a URL.

The package is the shard's storage and knows nothing of shards (Materialize's
``persist`` crate beside its ``persist-client``): its modules import only each other,
``upsert_core.errors`` and ``upsert_core.redact``, never the rest of
``upsert_core.persist`` (``tests/test_layering.py`` checks). This module imports none of
its submodules, so importing one of them costs only what it imports itself.

Consensus invariants (per key):

- Versions form a strictly increasing sequence of ``SeqNo``; ``head`` is the newest.
- ``compare_and_set(key, expected, new)`` writes ``new`` iff the current head's seqno
  equals ``expected`` (``None``: the key has no versions); ``new.seqno`` must be greater
  than ``expected``. It is one atomic step: of two racing callers with the same
  expectation exactly one commits.
- A mismatch is a *value* (:class:`CasMismatch`), not an exception: it is an expected
  outcome of racing writers. Exceptions are for failures of the store itself, split into
  determinate and indeterminate errors (``upsert_core.errors``).
- ``truncate(key, seqno)`` deletes versions below ``seqno`` and never the head: it is an
  error to truncate when no version at or above ``seqno`` exists.

Blob invariants:

- ``set`` is atomic: a reader sees the old bytes or the new bytes, never a prefix.
- ``delete`` is idempotent: deleting a missing key succeeds (returns ``None``).
- ``list_keys(prefix)`` yields every key with that prefix, with its size.

Ranged reads (optional, :class:`RangedBlob`): a store that can read part of a blob
without fetching all of it offers ``open_reader(key)``, a seekable binary file-like
over the bytes ``get(key)`` would return at that moment (``None`` when missing).
Readers use :func:`open_blob_reader`, which falls back to ``get`` for stores without
the capability, so ``Blob`` itself is unchanged. A reader sees ONE version of the
blob: if the blob is deleted (or replaced) while the reader is open, reading either
still returns the bytes of the version it opened or raises ``FileNotFoundError``;
it never mixes versions nor returns short data silently.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

SeqNo = int
"""A version number in a consensus log; strictly increasing per key."""


@dataclass(frozen=True, slots=True)
class VersionedData:
    """One version of a consensus key: its seqno and opaque bytes."""

    seqno: SeqNo
    data: bytes


@dataclass(frozen=True, slots=True)
class CasCommitted:
    """``compare_and_set`` wrote the new version."""


@dataclass(frozen=True, slots=True)
class CasMismatch:
    """``compare_and_set`` did not write: the head was not the expected one.

    ``current`` is the head seen when the mismatch was detected, when the
    implementation could read it cheaply (otherwise ``None``: call ``head``).
    """

    current: VersionedData | None = None


CasResult = CasCommitted | CasMismatch


@dataclass(frozen=True, slots=True)
class BlobMetadata:
    """A key returned by ``Blob.list_keys`` with its size in bytes."""

    key: str
    size_in_bytes: int


@runtime_checkable
class Consensus(Protocol):
    """A durable, linearizable map from key to a log of versions."""

    def head(self, key: str) -> VersionedData | None:
        """The newest version of ``key``, or ``None`` when it has none."""
        ...

    def compare_and_set(
        self, key: str, expected: SeqNo | None, new: VersionedData
    ) -> CasResult:
        """Append ``new`` iff the head's seqno is ``expected`` (``None``: no versions).

        Raises ``ValueError`` when ``new.seqno <= expected``.
        """
        ...

    def scan(self, key: str, from_seqno: SeqNo, limit: int) -> list[VersionedData]:
        """Up to ``limit`` versions with ``seqno >= from_seqno``, in seqno order."""
        ...

    def truncate(self, key: str, seqno: SeqNo) -> int:
        """Delete versions with ``seqno < seqno``; returns how many were deleted.

        Raises ``upsert_core.errors.InvalidUsage`` when no version ``>= seqno`` exists
        (truncation must never remove the head).
        """
        ...

    def list_keys(self) -> Iterator[str]:
        """Every key that has at least one version (for listing shards)."""
        ...


@runtime_checkable
class Blob(Protocol):
    """A durable, linearizable key-value store of immutable-ish byte strings."""

    def get(self, key: str) -> bytes | None:
        """The bytes stored at ``key``, or ``None`` when missing."""
        ...

    def set(self, key: str, value: bytes | memoryview) -> None:
        """Store ``value`` (any bytes-like: bytes, or a view the caller leaves unchanged
        until this returns) at ``key`` atomically (replacing any previous value)."""
        ...

    def delete(self, key: str) -> int | None:
        """Delete ``key``; returns the size deleted, or ``None`` if it was missing."""
        ...

    def list_keys(self, prefix: str) -> Iterator[BlobMetadata]:
        """Every key starting with ``prefix``, with its size."""
        ...


class BlobReader(Protocol):
    """A seekable, read-only binary file-like over one version of a blob."""

    def read(self, size: int = -1, /) -> bytes:
        """Up to ``size`` bytes from the position (all remaining when negative); fewer
        only at the end of the blob."""
        ...

    def seek(self, offset: int, whence: int = 0, /) -> int:
        """Move the position (``whence`` as :func:`io.IOBase.seek`); returns it."""
        ...

    def tell(self) -> int:
        """The current position."""
        ...

    def seekable(self) -> bool:
        """Always true."""
        ...

    def readable(self) -> bool:
        """Always true."""
        ...

    def close(self) -> None:
        """Release the reader's resources (idempotent)."""
        ...

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        ...


@runtime_checkable
class RangedBlob(Protocol):
    """The optional capability of a :class:`Blob` to read blobs lazily, range by range."""

    def open_reader(self, key: str) -> BlobReader | None:
        """A reader over the current bytes of ``key``, or ``None`` when it is missing.

        Opening is a read: it either finds the blob or not, like ``get``. See the module
        docstring for what a reader sees when the blob is deleted while it is open.
        """
        ...


def open_blob_reader(blob: Blob, key: str) -> BlobReader | None:
    """``blob.open_reader(key)`` when ``blob`` offers ranged reads, else the bytes of
    ``blob.get(key)`` in memory (``None`` when the blob is missing)."""
    if isinstance(blob, RangedBlob):
        return blob.open_reader(key)
    data = blob.get(key)
    return None if data is None else io.BytesIO(data)
