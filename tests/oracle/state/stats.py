"""Statistics and the small records passed between ``UpsertState`` and its backends.

Invariants (the reference's semantics):

- ``PutStats.values_diff`` is the change in the number of stored non-tombstone values
  (accumulators and provisional states count as values), ``tombstones_diff`` the change
  in stored finalized tombstones, ``size_diff`` the change in total stored size
  (tombstones included). Summed over every put and merge since the backend was empty,
  they equal what the backend holds. They are computed from ``PutValue.
  previous_value_metadata``, which the caller must take from a ``multi_get`` of the same
  key since the last write to it.
- ``processed_puts == inserts + updates + deletes``: a put of a value is an insert when
  there was no previous value and an update otherwise; a put of ``None`` is a delete.
- ``GetStats``: ``processed_gets`` keys asked for, ``returned_gets`` found,
  ``processed_gets_size`` the total size of what was found.
- ``MergeStats``: ``updates`` consolidated, ``inserts``/``deletes`` the updates with a
  positive/negative diff, ``values_diff``/``tombstones_diff``/``size_diff`` as reported by
  the backend for the write of the consolidated values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from tests.oracle.state.value import StateValue


class ValueMetadata(NamedTuple):
    """Size and tombstone-ness of a stored value, as the backend stored it."""

    size: int
    is_tombstone: bool


class ValueAndSize(NamedTuple):
    """A ``multi_get`` result: the stored value (None if absent) and its metadata."""

    value: StateValue | None
    metadata: ValueMetadata | None


class PutValue(NamedTuple):
    """A ``multi_put`` item: the new value (None deletes) and the previous metadata."""

    value: StateValue | None
    previous_value_metadata: ValueMetadata | None


ABSENT = ValueAndSize(None, None)
"""The ``multi_get`` result for a key that is not stored."""


@dataclass(slots=True)
class PutStats:
    processed_puts: int = 0
    values_diff: int = 0
    tombstones_diff: int = 0
    size_diff: int = 0
    inserts: int = 0
    updates: int = 0
    deletes: int = 0

    def __iadd__(self, other: PutStats) -> PutStats:
        self.processed_puts += other.processed_puts
        self.values_diff += other.values_diff
        self.tombstones_diff += other.tombstones_diff
        self.size_diff += other.size_diff
        self.inserts += other.inserts
        self.updates += other.updates
        self.deletes += other.deletes
        return self

    def adjust(
        self,
        new_value: StateValue | None,
        new_size: int | None,
        previous: ValueMetadata | None,
    ) -> None:
        """Account one put of ``new_value`` (stored at ``new_size``) over ``previous``."""
        self.processed_puts += 1
        if new_value is None:
            self.deletes += 1
        elif previous is None:
            self.inserts += 1
        else:
            self.updates += 1
        if previous is not None:
            self.size_diff -= previous.size
            if previous.is_tombstone:
                self.tombstones_diff -= 1
            else:
                self.values_diff -= 1
        if new_value is not None:
            if new_size is not None:
                self.size_diff += new_size
            if new_value.is_tombstone:
                self.tombstones_diff += 1
            else:
                self.values_diff += 1


@dataclass(slots=True)
class GetStats:
    processed_gets: int = 0
    processed_gets_size: int = 0
    returned_gets: int = 0

    def __iadd__(self, other: GetStats) -> GetStats:
        self.processed_gets += other.processed_gets
        self.processed_gets_size += other.processed_gets_size
        self.returned_gets += other.returned_gets
        return self


@dataclass(slots=True)
class MergeStats:
    updates: int = 0
    values_diff: int = 0
    size_diff: int = 0
    inserts: int = 0
    deletes: int = 0
    # Not in the reference: a feedback chunk can also replace a stored tombstone, and
    # without this the cumulative stats could not account for it.
    tombstones_diff: int = 0

    def __iadd__(self, other: MergeStats) -> MergeStats:
        self.updates += other.updates
        self.values_diff += other.values_diff
        self.size_diff += other.size_diff
        self.inserts += other.inserts
        self.deletes += other.deletes
        self.tombstones_diff += other.tombstones_diff
        return self
