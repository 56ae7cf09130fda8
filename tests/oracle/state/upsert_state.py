"""``UpsertState``: a backend plus snapshot/feedback consolidation and statistics.

Invariants:

- ``put_stats``, ``get_stats`` and ``merge_stats`` accumulate what every call reported.
  ``put_stats.values_diff + merge_stats.values_diff`` (and likewise for tombstones and
  size) equals what the backend holds, as long as every write is *counted* and carries
  the metadata ``multi_get`` returned for its key.
- ``multi_put(..., update_per_record_stats=False)`` is an *uncounted* write (the
  provisional values of a partial drain, which feedback overwrites): as in the
  reference, only ``processed_puts`` is accumulated. The counted stats become exact
  again when the key is next written counted with, as previous metadata, the metadata
  from *before* the uncounted write (what the stats last counted). ``consolidate_chunk``
  takes previous metadata from the backend, so do not consolidate a key while an
  uncounted write of it is outstanding.
- ``consolidate_chunk`` reads every touched key once, consolidates the chunk in copies
  (never in the objects the backend holds), and writes each touched key once, in one
  ``multi_put``. After the snapshot is complete every touched value is
  ``ensure_decoded`` before anything is written.
- Completing the snapshot also decodes every accumulator the chunk did not touch (one
  scan of the state), so once ``snapshot_completed`` is True the state holds no
  accumulators and the drain never meets one. Any invalid accumulator raises
  ``InvalidUpsertState`` before anything is written: the state is left exactly as it
  was and the snapshot stays incomplete.
- A key whose accumulator returns to all zero is deleted, during or after the snapshot.
- Only one chunk may complete the snapshot; a second raises ``SnapshotAlreadyCompleted``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from types import TracebackType

from upsert_core.codec import UpsertKey
from upsert_core.errors import SnapshotAlreadyCompleted
from tests.oracle.state.backend import StateBackend
from tests.oracle.state.chunk import fold_groups, group_chunk
from tests.oracle.state.gc_pause import gc_paused
from tests.oracle.state.stats import GetStats, MergeStats, PutStats, PutValue, ValueAndSize
from tests.oracle.state.value import StateValue


class UpsertState:
    """Upsert state over a ``StateBackend``; see the module docstring."""

    def __init__(self, backend: StateBackend) -> None:
        self.backend = backend
        self.put_stats = PutStats()
        self.get_stats = GetStats()
        self.merge_stats = MergeStats()
        self.snapshot_completed = False

    def multi_get(self, keys: Sequence[UpsertKey]) -> list[ValueAndSize]:
        """Current values and stored sizes of ``keys`` (which should be unique), in order."""
        results, stats = self.backend.multi_get(keys)
        self.get_stats += stats
        return results

    def multi_put(
        self,
        puts: Iterable[tuple[UpsertKey, PutValue]],
        update_per_record_stats: bool = True,
    ) -> PutStats:
        """Write or delete (value None) keys; returns the backend's stats for this call.

        With ``update_per_record_stats=False`` the write is uncounted (see the module
        docstring); the returned stats still describe what the backend did.
        """
        stats = self.backend.multi_put(puts)
        if update_per_record_stats:
            self.put_stats += stats
        else:
            self.put_stats.processed_puts += stats.processed_puts
        return stats

    def consolidate_chunk(
        self,
        updates: Iterable[tuple[UpsertKey, bytes, int]],
        completes_snapshot: bool,
    ) -> MergeStats:
        """Consolidate ``(key, encoded value, diff)`` updates (snapshot or feedback)."""
        if completes_snapshot and self.snapshot_completed:
            raise SnapshotAlreadyCompleted(
                "the upsert state snapshot was already completed; a second completing "
                "chunk means the rehydration input was replayed"
            )
        chunk = updates if isinstance(updates, list) else list(updates)
        stats = MergeStats()
        if chunk or completes_snapshot:
            with gc_paused():
                self._consolidate(chunk, completes_snapshot, stats)
        self.merge_stats += stats
        if completes_snapshot:
            self.snapshot_completed = True
        return stats

    def _consolidate(
        self,
        chunk: list[tuple[UpsertKey, bytes, int]],
        completes_snapshot: bool,
        stats: MergeStats,
    ) -> None:
        decode = self.snapshot_completed or completes_snapshot
        groups = group_chunk(chunk)
        if groups is None:
            keys, found, accs, inserts, deletes = self._fold_one_by_one(chunk, decode)
        else:
            keys = groups.keys
            found, _ = self.backend.multi_get(keys)
            # SUBTLE: the fold reads the stored values and builds new accumulators; it
            # never merges into the objects a backend returned (the in-memory backend
            # returns the very objects it stores), so a failure leaves the state as it was.
            accs = fold_groups(groups, [f.value for f in found], decode)
            inserts, deletes = groups.inserts, groups.deletes
        puts = [
            (k, PutValue(acc, f.metadata))
            for k, acc, f in zip(keys, accs, found, strict=True)
            if acc is not None or f.metadata is not None
        ]
        if completes_snapshot:
            puts.extend(self._decode_untouched(set(keys)))
        p = self.backend.multi_put(puts)
        stats.updates = len(chunk)
        stats.inserts = inserts
        stats.deletes = deletes
        stats.values_diff = p.values_diff
        stats.tombstones_diff = p.tombstones_diff
        stats.size_diff = p.size_diff

    def _fold_one_by_one(
        self, chunk: list[tuple[UpsertKey, bytes, int]], decode: bool
    ) -> tuple[list[UpsertKey], list[ValueAndSize], list[StateValue | None], int, int]:
        """The per-update fold that ``chunk.fold_groups`` computes in bulk (kept for diffs
        that do not fit in int64)."""
        keys = list(dict.fromkeys([u[0] for u in chunk]))
        found, _ = self.backend.multi_get(keys)
        accs: dict[UpsertKey, StateValue | None] = {
            k: (None if f.value is None else f.value.to_consolidating())
            for k, f in zip(keys, found, strict=True)
        }
        inserts = deletes = 0
        for key, value, diff in chunk:
            acc = accs[key]
            if acc is None:
                acc = accs[key] = StateValue()
            if acc.merge_update(value, diff):
                accs[key] = None
            if diff > 0:
                inserts += 1
            elif diff < 0:
                deletes += 1
        if decode:
            for acc in accs.values():
                if acc is not None:
                    acc.ensure_decoded()
        return keys, found, [accs[k] for k in keys], inserts, deletes

    def _decode_untouched(self, touched: set[UpsertKey]) -> list[tuple[UpsertKey, PutValue]]:
        """Puts that replace every other stored accumulator by its decoded value."""
        pending = [k for k, v in self.backend.items() if v.is_consolidating and k not in touched]
        if not pending:
            return []
        found, _ = self.backend.multi_get(pending)
        puts = []
        for key, f in zip(pending, found, strict=True):
            if f.value is None:  # cannot happen: the key was just listed
                continue
            decoded = f.value.to_consolidating()
            decoded.ensure_decoded()
            # An all-zero accumulator decodes to a tombstone; absent is the same, smaller.
            puts.append((key, PutValue(None if decoded.is_tombstone else decoded, f.metadata)))
        return puts

    def __len__(self) -> int:
        return len(self.backend)

    def items(self) -> Iterator[tuple[UpsertKey, StateValue]]:
        """Every stored key and value (for checkpoints and tests)."""
        return self.backend.items()

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> UpsertState:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
