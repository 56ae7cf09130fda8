"""The ``StateBackend`` protocol: a blind map from upsert key to ``StateValue``.

Backends do not interpret state values beyond asking them for their size and whether
they are tombstones. Invariants every implementation keeps (checked by the shared
conformance suite in ``tests/core/test_backends.py``):

- ``multi_get`` returns one ``ValueAndSize`` per key, in the order of the keys, with the
  size the value is stored (and accounted) at; ``ABSENT`` for missing keys.
- ``multi_put`` applies the puts in order (the last put of a repeated key wins) and
  atomically where the backend can (all or nothing for the on-disk backend). Its
  ``PutStats`` are exact provided each ``previous_value_metadata`` is what ``multi_get``
  reported for that key since the last write to it.
- The size a value is stored at is ``value.memory_size()`` (== ``len(value.encode())``)
  when it is written, in every backend, so sizes agree across backends.
- ``items()`` yields every stored ``(key, value)`` exactly once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol, runtime_checkable

from upsert_core.codec import UpsertKey
from tests.oracle.state.stats import GetStats, PutStats, PutValue, ValueAndSize
from tests.oracle.state.value import StateValue


@runtime_checkable
class StateBackend(Protocol):
    def multi_get(self, keys: Sequence[UpsertKey]) -> tuple[list[ValueAndSize], GetStats]:
        """The stored values and sizes of ``keys`` (same order) and the get statistics."""
        ...

    def multi_put(self, puts: Iterable[tuple[UpsertKey, PutValue]]) -> PutStats:
        """Write or (value ``None``) delete each key; returns exact put statistics."""
        ...

    def __len__(self) -> int:
        """The number of stored keys."""
        ...

    def items(self) -> Iterator[tuple[UpsertKey, StateValue]]:
        """Every stored key and value (order unspecified)."""
        ...

    def close(self) -> None:
        """Release resources; the on-disk backend keeps its data for a later reopen."""
        ...
