"""An in-process cache of bucket states, so consecutive ingests skip loading checkpoints.

After a bucket step drained file ``ts`` it holds the bucket's state as it will be once
the append at ``[ts, ts + 1)`` commits. It puts that state here, tagged with the
commit nonce of its attempt (``FileTask.commit_nonce``) and ``upper = ts + 1``. A later
step of the same shard takes it instead of decoding the checkpoint blob.

Invariants (why a stale state is never used):

- An entry is used only if the shard's commit history (``FileTask.history``: upper ->
  nonce of the ingest commit that produced that upper, for recent commits) says the
  commit at ``entry.upper`` carried ``entry.nonce``. An attempt that lost its race has a
  nonce no committed state names, so its entry is dead; a commit by another writer
  has another nonce.
- An entry at ``upper < ts`` is used only where the caller can replay the shard's
  changes ``[entry.upper, ts)`` onto it (the batch order scope); an entry at
  ``upper == ts`` is the state itself. An entry above ``ts`` is never used.
- ``take`` removes the entry: the caller drains it into a new state and puts that back
  under the new nonce, so a failed step can never leave a stale entry that looks
  current behind in the cache.
- The cache is bounded by the total number of keys it holds (least recently put
  entries are evicted first); a miss only costs a checkpoint load.
- Keys include the shard, bucket count and order scope, so shards never share entries.

It is thread-safe; each process (a Spark Python worker, the driver) has its own.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from upsert_core.columnar import ColumnarState

DEFAULT_MAX_KEYS = 4_000_000
MAX_KEYS_ENV = "UPSERT_STATE_CACHE_KEYS"


@dataclass
class CachedState:
    """A bucket's state as of ``upper``, produced by the attempt with ``nonce``.

    ``checkpoint`` is the checkpoint reference the same attempt committed for the bucket.
    """

    state: ColumnarState
    upper: int
    nonce: str
    checkpoint: str


CacheKey = tuple[str, int, int, str]  # shard, bucket, bucket count, order scope


class StateCache:
    """Bucket states by (shard, bucket, buckets, scope); see the module docstring."""

    def __init__(self, max_keys: int | None = None) -> None:
        if max_keys is None:
            max_keys = int(os.environ.get(MAX_KEYS_ENV, DEFAULT_MAX_KEYS))
        self.max_keys = max_keys
        self._entries: OrderedDict[tuple[CacheKey, str], CachedState] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def _best(
        self, key: CacheKey, ts: int, history: Mapping[int, str], exact: bool
    ) -> tuple[CacheKey, str] | None:
        best: tuple[CacheKey, str] | None = None
        best_upper = -1
        for (k, nonce), entry in self._entries.items():
            if k != key or history.get(entry.upper) != nonce:
                continue
            if entry.upper > ts or (exact and entry.upper != ts):
                continue
            if entry.upper > best_upper:
                best, best_upper = (k, nonce), entry.upper
        return best

    def take(
        self, key: CacheKey, ts: int, history: Mapping[int, str], *, exact: bool
    ) -> CachedState | None:
        """Remove and return the newest usable entry for ``key`` at ``ts`` (or None).

        ``exact``: only an entry at ``upper == ts`` is usable (no replay possible).
        """
        with self._lock:
            best = self._best(key, ts, history, exact)
            if best is None:
                self.misses += 1
                return None
            self.hits += 1
            return self._entries.pop(best)

    def holds(self, key: CacheKey, ts: int, history: Mapping[int, str]) -> bool:
        """Whether ``take(key, ts, history, exact=True)`` would return an entry (the
        state as of ``ts`` itself, no replay needed); changes nothing."""
        with self._lock:
            return self._best(key, ts, history, True) is not None

    def put(self, key: CacheKey, entry: CachedState) -> None:
        """Keep ``entry`` (evicting old entries beyond the key budget)."""
        if len(entry.state) > self.max_keys:
            return
        with self._lock:
            # Older entries of the same bucket are superseded: drop them first.
            for old in [k for k in self._entries if k[0] == key]:
                del self._entries[old]
            self._entries[(key, entry.nonce)] = entry
            total = sum(len(e.state) for e in self._entries.values())
            while total > self.max_keys and len(self._entries) > 1:
                _, evicted = self._entries.popitem(last=False)
                total -= len(evicted.state)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
