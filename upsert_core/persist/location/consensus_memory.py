"""An in-process :class:`~upsert_core.persist.location.Consensus` for unit tests.

Invariants kept (the same as every consensus, see ``location``):

- Per key, versions are strictly increasing; the last one is the head.
- ``compare_and_set`` checks the head and appends under one lock, so of racing threads
  with the same expectation exactly one commits.
- ``truncate`` never removes the head; it raises ``InvalidUsage`` when no version at or
  above the bound exists.

The argument checks (:func:`check_cas_args`, :func:`check_scan_args`, ...) live here and
are shared by every consensus implementation so they all reject the same inputs.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator

from upsert_core.errors import InvalidSeqNo, InvalidUsage
from upsert_core.persist.location import CasCommitted, CasMismatch, CasResult, SeqNo, VersionedData

MAX_SEQNO = 2**63 - 1
"""The largest seqno any implementation stores (a signed 64-bit column)."""


def check_seqno(seqno: SeqNo, what: str = "seqno") -> None:
    """Raise :class:`InvalidSeqNo` unless ``0 <= seqno <= MAX_SEQNO``."""
    if isinstance(seqno, bool) or not isinstance(seqno, int) or not 0 <= seqno <= MAX_SEQNO:
        raise InvalidSeqNo(f"{what} must be an int in [0, 2**63), got {seqno!r}")


def check_key(key: str) -> None:
    """Raise :class:`InvalidUsage` unless ``key`` is a non-empty string."""
    if not isinstance(key, str) or not key:
        raise InvalidUsage(f"consensus key must be a non-empty string, got {key!r}")


def check_cas_args(key: str, expected: SeqNo | None, new: VersionedData) -> None:
    """Validate a ``compare_and_set`` call: ``new.seqno`` must exceed ``expected``."""
    check_key(key)
    check_seqno(new.seqno, "new.seqno")
    if expected is not None:
        check_seqno(expected, "expected")
        if new.seqno <= expected:
            raise InvalidSeqNo(
                f"compare_and_set on {key!r}: new seqno {new.seqno} must be greater than"
                f" the expected head {expected}"
            )
    if not isinstance(new.data, bytes):
        raise InvalidUsage(f"consensus data must be bytes, got {type(new.data).__name__}")


def check_scan_args(key: str, from_seqno: SeqNo, limit: int) -> None:
    """Validate a ``scan`` call: a valid key and seqno, and ``limit >= 0``."""
    check_key(key)
    check_seqno(from_seqno, "from_seqno")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise InvalidUsage(f"scan limit must be a non-negative int, got {limit!r}")


def truncate_error(key: str, seqno: SeqNo, head: VersionedData | None) -> InvalidUsage:
    """The error for a truncate that would have removed the head of ``key``."""
    have = "no versions" if head is None else f"head seqno {head.seqno}"
    return InvalidUsage(
        f"cannot truncate {key!r} below {seqno}: it has {have}; truncation must keep the head"
    )


class MemoryConsensus:
    """A thread-safe, non-durable consensus kept in a dict of sorted version lists."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._logs: dict[str, list[VersionedData]] = {}

    def head(self, key: str) -> VersionedData | None:
        check_key(key)
        with self._lock:
            log = self._logs.get(key)
            return log[-1] if log else None

    def compare_and_set(
        self, key: str, expected: SeqNo | None, new: VersionedData
    ) -> CasResult:
        check_cas_args(key, expected, new)
        with self._lock:
            log = self._logs.setdefault(key, [])
            current = log[-1] if log else None
            if (current.seqno if current is not None else None) != expected:
                return CasMismatch(current=current)
            log.append(new)
            return CasCommitted()

    def scan(self, key: str, from_seqno: SeqNo, limit: int) -> list[VersionedData]:
        check_scan_args(key, from_seqno, limit)
        with self._lock:
            log = self._logs.get(key, [])
            start = bisect.bisect_left(log, from_seqno, key=lambda v: v.seqno)
            return log[start : start + limit]

    def truncate(self, key: str, seqno: SeqNo) -> int:
        check_key(key)
        check_seqno(seqno)
        with self._lock:
            log = self._logs.get(key, [])
            if not log or log[-1].seqno < seqno:
                raise truncate_error(key, seqno, log[-1] if log else None)
            cut = bisect.bisect_left(log, seqno, key=lambda v: v.seqno)
            del log[:cut]
            return cut

    def list_keys(self) -> Iterator[str]:
        with self._lock:
            keys = sorted(k for k, log in self._logs.items() if log)
        return iter(keys)
