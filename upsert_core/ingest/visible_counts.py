"""A file's counts as a user's read shows its changes: inserts and retractions of a
shard with hidden columns (a Debezium shard's order, ``upsert_core.row_view``).

The run's report (``upsertctl ingest`` per file and in total, ``--json``, Dagster's
materialization metadata) counts each file's *inserts* and *retractions*: the updates
``(row, ts, +1)`` and ``(row, ts, -1)`` it adds to the shard's changes. The contract
says what those changes are (CONTRACT.md, "Upsert semantics": consolidated, setting a
key to an identical row is no change) and whose rows they hold ("Change data capture":
a Debezium shard's columns are ``after``'s). So the counts are of the changes a user's
``changes`` read shows at the file's ts: the stored updates with the hidden columns
projected away and re-consolidated (``RowView.project_updates``). An event that repeats
a key's ``after`` with a new LSN is stored as a retraction and an insertion (the stored
row holds the order), but shows, and counts, as nothing.

Invariants:

- :func:`hidden_only_pairs` counts the keys of one bucket's drain output whose
  retraction and insertion are the same visible row (their visible values encoded as
  ``RowView`` encodes them, so "the same" is what reads mean by it: canonical floats,
  trailing nulls dropped). Subtracting it from both counts gives the visible
  changes' counts, and leaves ``inserts - retractions`` (the live-row arithmetic)
  unchanged.
- Without hidden columns it is 0 and reads nothing: a plain shard's counts are its
  stored updates', as always.
- Only keys with both a retraction and an insertion are looked at (a drain emits at
  most one of each per key, sorted by key), so a batch of new keys costs nothing.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from upsert_core.landing import SourceSchema, decode_rows_to_table
from upsert_core.persist.write.parts import rows_of_values


def hidden_only_pairs(
    updates: pa.Table, schema: SourceSchema, hidden: tuple[str, ...],
    values: pa.Table | None = None,
) -> int:
    """Keys of ``updates`` (a drain's output at one ts: ``key``, ``row``, ``diff``,
    sorted by key) whose retraction and insertion differ only in the ``hidden``
    columns. ``schema`` decodes the rows; ``values``, when given, holds the same rows'
    values (``tasks.part_values``), which spares decoding them."""
    n = updates.num_rows
    if not hidden or n < 2:
        return 0
    keys = updates.column("key").combine_chunks()
    same_key = np.asarray(
        pc.equal(keys.slice(0, n - 1), keys.slice(1)).to_numpy(zero_copy_only=False), np.bool_)
    first = np.flatnonzero(same_key)
    if not len(first):
        return 0
    diffs = np.asarray(updates.column("diff").to_numpy(), np.int64)
    first = first[diffs[first] != diffs[first + 1]]  # one retraction, one insertion
    if not len(first):
        return 0
    visible = [name for name in schema.names if name not in hidden]
    take = pa.array(np.concatenate([first, first + 1]), pa.int64())
    if values is None:
        table = decode_rows_to_table(schema, updates.column("row").take(take))
    else:
        table = values.take(take)
    encoded = rows_of_values([table.column(name) for name in visible])
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    m = len(first)
    equal = pc.equal(encoded.slice(0, m), encoded.slice(m)).to_numpy(zero_copy_only=False)
    return int(np.count_nonzero(equal))


__all__ = ["hidden_only_pairs"]
