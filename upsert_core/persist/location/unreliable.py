"""Fault-injecting wrappers around any Consensus or Blob, for tests.

Each call draws from a seeded ``random.Random`` (one per wrapper, under a lock), so a
failing run replays with the same seed and the same call order. Three faults:

- *fail*: raise :class:`DeterminateError` before calling the inner store;
- *timeout*: raise :class:`IndeterminateError` before calling it (the caller cannot
  tell this from a timeout after the work, which is the point);
- *effect then timeout* (writes only): call the inner store, then raise
  :class:`IndeterminateError` although the work was done.

``UnreliableBlob.open_reader`` draws once when the reader is opened (a read); the
reader it returns then reads the inner store reliably.

``UnreliableConsensus(stale_reads=N)`` adds a fourth fault, *a commit seen late*: after
a compare-and-set that committed and then reported a timeout, the next ``N`` reads of
that key (``head``, ``scan``) see the log as it was before it, as a lagging replica
would. Reads stay consistent prefixes of the log (the hidden version and every newer
one are hidden together); compare-and-set itself always sees the true head, like a
real store's conditional write. This is the case a verification read after an
indeterminate write must not trust: "not visible yet" is not "did not happen".

Invariants: a fault never corrupts the inner store; with faults disabled
(``enabled = False`` or inside ``with wrapper.reliable():``) the wrapper is transparent.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from upsert_core.errors import ConfigError, DeterminateError, IndeterminateError
from upsert_core.persist.location import (
    Blob,
    BlobMetadata,
    BlobReader,
    CasCommitted,
    CasResult,
    Consensus,
    SeqNo,
    VersionedData,
    open_blob_reader,
)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class FaultRates:
    """Probabilities of each fault per call; their sum must be at most 1."""

    fail: float = 0.05
    timeout: float = 0.05
    effect_then_timeout: float = 0.05

    def __post_init__(self) -> None:
        rates = (self.fail, self.timeout, self.effect_then_timeout)
        if any(r < 0 for r in rates) or sum(rates) > 1:
            raise ConfigError(f"fault rates must be >= 0 and sum to <= 1, got {self}")


class _Faults:
    """The shared fault dice: a seeded RNG, the rates, an on/off switch, counters."""

    def __init__(self, seed: int, rates: FaultRates) -> None:
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.rates = rates
        self.enabled = True
        self.injected: dict[str, int] = {"fail": 0, "timeout": 0, "effect_then_timeout": 0}

    def _draw(self) -> float:
        with self._lock:
            return self._rng.random()

    def _count(self, kind: str) -> None:
        with self._lock:
            self.injected[kind] += 1

    def call(self, what: str, fn: Callable[[], T], *, writes: bool) -> T:
        if not self.enabled:
            return fn()
        r = self._draw()
        if r < self.rates.fail:
            self._count("fail")
            raise DeterminateError(f"unreliable: {what} failed before it ran")
        if r < self.rates.fail + self.rates.timeout:
            self._count("timeout")
            raise IndeterminateError(f"unreliable: {what} timed out (it did not run)")
        result = fn()
        if writes and r >= 1 - self.rates.effect_then_timeout:
            self._count("effect_then_timeout")
            raise IndeterminateError(f"unreliable: {what} timed out (it DID run)")
        return result


class _Switchable:
    _faults: _Faults

    @property
    def enabled(self) -> bool:
        """Whether faults are injected."""
        return self._faults.enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        self._faults.enabled = value

    @property
    def injected(self) -> dict[str, int]:
        """How many faults of each kind were injected so far."""
        return dict(self._faults.injected)

    @contextmanager
    def reliable(self) -> Iterator[None]:
        """Disable faults inside the ``with`` block (restores the previous setting)."""
        before = self._faults.enabled
        self._faults.enabled = False
        try:
            yield
        finally:
            self._faults.enabled = before


class UnreliableConsensus(_Switchable):
    """A :class:`Consensus` that injects seeded faults into calls to ``inner``.

    ``stale_reads``: how many reads of a key lag behind after a compare-and-set that
    committed and then timed out (see the module docstring); 0 disables the fault.
    """

    def __init__(
        self,
        inner: Consensus,
        seed: int,
        rates: FaultRates | None = None,
        *,
        stale_reads: int = 0,
    ) -> None:
        if stale_reads < 0:
            raise ConfigError(f"stale_reads must be >= 0, got {stale_reads}")
        self.inner = inner
        self._faults = _Faults(seed, rates or FaultRates())
        self.stale_reads = stale_reads
        self._lag_lock = threading.Lock()
        # key -> (the first hidden seqno, how many more reads hide it)
        self._hidden: dict[str, tuple[SeqNo, int]] = {}
        self.stale_reads_served = 0

    def _hidden_from(self, key: str) -> SeqNo | None:
        """The seqno from which this read hides versions (consumes one lagging read)."""
        if not self._faults.enabled:
            return None
        with self._lag_lock:
            hidden = self._hidden.get(key)
            if hidden is None:
                return None
            seqno, left = hidden
            if left <= 1:
                del self._hidden[key]
            else:
                self._hidden[key] = (seqno, left - 1)
            self.stale_reads_served += 1
            return seqno

    def _head(self, key: str) -> VersionedData | None:
        hidden = self._hidden_from(key)
        if hidden is None:
            return self.inner.head(key)
        page = self.inner.scan(key, max(0, hidden - 1), 1)
        return page[0] if page and page[0].seqno < hidden else None

    def _scan(self, key: str, from_seqno: SeqNo, limit: int) -> list[VersionedData]:
        hidden = self._hidden_from(key)
        page = self.inner.scan(key, from_seqno, limit)
        return page if hidden is None else [v for v in page if v.seqno < hidden]

    def head(self, key: str) -> VersionedData | None:
        return self._faults.call(f"head({key!r})", lambda: self._head(key), writes=False)

    def compare_and_set(
        self, key: str, expected: SeqNo | None, new: VersionedData
    ) -> CasResult:
        results: list[CasResult] = []

        def cas() -> CasResult:
            results.append(self.inner.compare_and_set(key, expected, new))
            return results[-1]

        try:
            return self._faults.call(
                f"compare_and_set({key!r}, {expected}, {new.seqno})", cas, writes=True
            )
        except IndeterminateError:
            if self.stale_reads and results and isinstance(results[-1], CasCommitted):
                with self._lag_lock:
                    self._hidden[key] = (new.seqno, self.stale_reads)
            raise

    def scan(self, key: str, from_seqno: SeqNo, limit: int) -> list[VersionedData]:
        return self._faults.call(
            f"scan({key!r}, {from_seqno})",
            lambda: self._scan(key, from_seqno, limit),
            writes=False,
        )

    def truncate(self, key: str, seqno: SeqNo) -> int:
        return self._faults.call(
            f"truncate({key!r}, {seqno})", lambda: self.inner.truncate(key, seqno), writes=True
        )

    def list_keys(self) -> Iterator[str]:
        keys = self._faults.call("list_keys()", lambda: list(self.inner.list_keys()), writes=False)
        return iter(keys)


class UnreliableBlob(_Switchable):
    """A :class:`Blob` that injects seeded faults into calls to ``inner``."""

    def __init__(self, inner: Blob, seed: int, rates: FaultRates | None = None) -> None:
        self.inner = inner
        self._faults = _Faults(seed, rates or FaultRates())

    def get(self, key: str) -> bytes | None:
        return self._faults.call(f"get({key!r})", lambda: self.inner.get(key), writes=False)

    def open_reader(self, key: str) -> BlobReader | None:
        return self._faults.call(
            f"open_reader({key!r})", lambda: open_blob_reader(self.inner, key), writes=False
        )

    def set(self, key: str, value: bytes | memoryview) -> None:
        self._faults.call(f"set({key!r})", lambda: self.inner.set(key, value), writes=True)

    def delete(self, key: str) -> int | None:
        return self._faults.call(f"delete({key!r})", lambda: self.inner.delete(key), writes=True)

    def list_keys(self, prefix: str) -> Iterator[BlobMetadata]:
        found = self._faults.call(
            f"list_keys({prefix!r})", lambda: list(self.inner.list_keys(prefix)), writes=False
        )
        return iter(found)
