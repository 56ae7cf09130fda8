"""``InMemoryBackend``: the upsert state in a dict, for state that fits in memory.

Invariants:

- Each key maps to the ``ValueAndSize`` built when it was written, so ``multi_get``
  returns the stored size and tombstone flag as they were accounted, even if a caller
  later decodes the returned accumulator in place.
- Values are not copied: ``multi_get`` returns the stored ``StateValue`` objects.
  Finalized and provisional values are immutable; ``UpsertState`` copies accumulators
  before merging into them.
- Bulk paths avoid per-item method calls where they can (list comprehensions and local
  variable lookups), since the drain moves about a million keys per second through here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from upsert_core.codec import UpsertKey
from tests.oracle.state.stats import (
    ABSENT,
    GetStats,
    PutStats,
    PutValue,
    ValueAndSize,
    ValueMetadata,
)
from tests.oracle.state.value import StateValue

_new_tuple = tuple.__new__
_METADATA_CACHE_MAX = 1 << 16


class InMemoryBackend:
    """A blind ``dict`` map from upsert key to state value with exact size accounting."""

    def __init__(self) -> None:
        self._map: dict[UpsertKey, ValueAndSize] = {}
        self._metadata_cache: dict[int, ValueMetadata] = {}

    def multi_get(self, keys: Sequence[UpsertKey]) -> tuple[list[ValueAndSize], GetStats]:
        get = self._map.get
        results = [get(k, ABSENT) for k in keys]
        sizes = [r.metadata.size for r in results if r.metadata is not None]
        return results, GetStats(
            processed_gets=len(results),
            processed_gets_size=sum(sizes),
            returned_gets=len(sizes),
        )

    def multi_put(self, puts: Iterable[tuple[UpsertKey, PutValue]]) -> PutStats:
        m = self._map
        pop = m.pop
        new = _new_tuple
        metas = self._metadata_cache
        processed = inserts = updates = deletes = 0
        values = tombstones = size = 0
        for key, (value, prev) in puts:
            processed += 1
            if prev is not None:
                size -= prev.size
                if prev.is_tombstone:
                    tombstones -= 1
                else:
                    values -= 1
            if value is None:
                deletes += 1
                pop(key, None)
                continue
            if prev is None:
                inserts += 1
            else:
                updates += 1
            tag = value.size_tag()
            meta = metas.get(tag)
            if meta is None:
                meta = self._new_metadata(tag)
            if tag & 1:
                tombstones += 1
            else:
                values += 1
            size += tag >> 1
            # tuple.__new__ skips the NamedTuple constructor's Python-level frame.
            m[key] = new(ValueAndSize, (value, meta))
        return PutStats(
            processed_puts=processed,
            values_diff=values,
            tombstones_diff=tombstones,
            size_diff=size,
            inserts=inserts,
            updates=updates,
            deletes=deletes,
        )

    def _new_metadata(self, tag: int) -> ValueMetadata:
        # Interned metadata: one object per distinct (size, tombstone), so a put
        # allocates a single tuple (fewer tracked objects, far less GC work).
        if len(self._metadata_cache) >= _METADATA_CACHE_MAX:
            self._metadata_cache.clear()
        meta = self._metadata_cache[tag] = ValueMetadata(tag >> 1, bool(tag & 1))
        return meta

    def __len__(self) -> int:
        return len(self._map)

    def items(self) -> Iterator[tuple[UpsertKey, StateValue]]:
        for key, entry in list(self._map.items()):
            if entry.value is not None:  # always true: deletes pop the key
                yield key, entry.value

    def close(self) -> None:
        """Nothing to release; the data is kept until the object is dropped."""
