"""The columnar upsert engine: a bucket's state as sorted columns, drained as columns.

- :mod:`~upsert_core.columnar.state`: :class:`ColumnarState` (keys, rows, orders as
  sorted arrays) and key location by ``searchsorted``;
- :mod:`~upsert_core.columnar.drain`: the ingest's ``ToUpper`` drain and feedback;
- :mod:`~upsert_core.columnar.merge`: writing sorted key changes into a state;
- :mod:`~upsert_core.columnar.consolidate`: rehydration from a snapshot and replay of
  the shard's changes, both verified;
- :mod:`~upsert_core.columnar.checkpoint_format`: the checkpoint bytes (Arrow IPC with a
  digest);
- :mod:`~upsert_core.columnar.derived_rows`: a base's rows kept as typed values (read
  from a part) and encoded only where a batch touches them.

It keeps the semantics of the per-key engine (now ``tests/oracle``: ``state`` and
``drain``, the reference the property tests compare against)
with no Python object per key on the hot path.
"""

from upsert_core.columnar.consolidate import apply_changes, state_from_snapshot
from upsert_core.columnar.drain import DrainResult, drain_to_upper
from upsert_core.columnar.state import ColumnarState, join_keys, locate, split_keys

__all__ = [
    "ColumnarState",
    "DrainResult",
    "apply_changes",
    "drain_to_upper",
    "join_keys",
    "locate",
    "split_keys",
    "state_from_snapshot",
]
