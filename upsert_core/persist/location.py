"""Storage contracts the shard is built on: ``Consensus`` and ``Blob``.

Both must be linearizable. Implementations live beside this module
(``consensus_sql``, ``consensus_memory``, ``blob_local``, ``blob_s3``,
``blob_memory``) and all pass ``tests/persist/test_location_conformance.py``.

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
"""

from __future__ import annotations

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

    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` at ``key`` atomically (replacing any previous value)."""
        ...

    def delete(self, key: str) -> int | None:
        """Delete ``key``; returns the size deleted, or ``None`` if it was missing."""
        ...

    def list_keys(self, prefix: str) -> Iterator[BlobMetadata]:
        """Every key starting with ``prefix``, with its size."""
        ...
