"""Encoded rows computed from typed values on demand, for a state base read from a part.

A bucket's upsert state needs the encoded row of a key only when a batch touches the
key: the drain's lookup reads the rows of the batch's keys (to find identical rows and
emit retractions), the replay reads the rows its retractions must match. A base loaded
from a typed part (part format 3 stores each row once, as its value columns) therefore
keeps the value columns and stands them in for the base's ``rows`` array as
:class:`DerivedRows`, which encodes only the rows taken. Loading such a base costs a
Parquet read of the values, not an encode of every row; the whole array is encoded
only when something needs all of it (a fold of the overlay into a new base, a
columnar checkpoint, a check).

Invariants:

- Row ``i`` is exactly ``rows_of_values(values)[i]``: the canonical encoding of the
  values with trailing nulls dropped, byte for byte what the ingest encoded and what
  every reader of a format-3 part computes. So any answer equals the one the encoded
  array would give, and a state with derived rows drains exactly as one without.
- No row is null: only live rows (the batch order scope) are ever derived.
- The values are never modified; the whole array, once encoded, is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from upsert_core.persist.parts import rows_of_values

ROW_TYPE = pa.large_binary()


class DerivedRows:
    """The encoded rows of ``values`` (a table of the row's columns, in the order they
    were encoded with), computed as they are taken; the part of ``pyarrow.Array``'s
    interface the upsert state uses."""

    type = ROW_TYPE
    null_count = 0

    def __init__(self, values: pa.Table) -> None:
        if not values.num_columns:
            raise ValueError("derived rows need at least one value column")
        self.values = values.combine_chunks()
        """The rows' values: a column per row column, named as the shard names them."""
        self._values = [c.chunk(0) if c.num_chunks == 1 else c.combine_chunks()
                        for c in self.values.columns]
        self._length = values.num_rows
        self._encoded: pa.LargeBinaryArray | None = None

    def __len__(self) -> int:
        return self._length

    @property
    def nbytes(self) -> int:
        total = sum(int(v.nbytes) for v in self._values)
        return total + (0 if self._encoded is None else int(self._encoded.nbytes))

    @property
    def is_encoded(self) -> bool:
        """Whether every row has been encoded (and is kept)."""
        return self._encoded is not None

    def materialize(self) -> pa.LargeBinaryArray:
        """Every row, encoded (once; kept for later calls)."""
        if self._encoded is None:
            self._encoded = _encode(self._values)
        return self._encoded

    def take(self, indices: Any) -> pa.LargeBinaryArray:
        """The rows at ``indices`` (an int64 array; a null index gives a null row), as
        ``pyarrow.Array.take`` would give them from the encoded array."""
        if self._encoded is not None:
            return self._encoded.take(indices)
        index = indices if isinstance(indices, pa.Array) else pa.array(indices, pa.int64())
        if index.null_count == 0:
            return _encode([v.take(index) for v in self._values])
        valid = index.is_valid()
        dense = _encode([v.take(index.filter(valid)) for v in self._values])
        at = np.cumsum(np.asarray(valid.to_numpy(zero_copy_only=False), bool)) - 1
        return dense.take(pa.array(at, pa.int64(), mask=~np.asarray(
            valid.to_numpy(zero_copy_only=False), bool)))

    def cast(self, target: pa.DataType) -> pa.Array:
        return self.materialize().cast(target)

    def filter(self, mask: Any) -> pa.LargeBinaryArray:
        return self.materialize().filter(mask)

    def is_null(self) -> pa.BooleanArray:
        return pa.array(np.zeros(self._length, bool), pa.bool_())

    def to_pylist(self) -> list[Any]:
        return list(self.materialize().to_pylist())

    def equals(self, other: Any) -> bool:
        return bool(self.materialize().equals(as_row_array(other)))


def _encode(values: Sequence[pa.Array]) -> pa.LargeBinaryArray:
    rows = rows_of_values(values)
    if isinstance(rows, pa.ChunkedArray):
        rows = rows.cast(ROW_TYPE).combine_chunks()
    encoded: pa.LargeBinaryArray = rows.cast(ROW_TYPE)
    return encoded


def as_row_array(rows: Any) -> pa.Array:
    """``rows`` as an Arrow array: derived rows are encoded, an array is returned as is."""
    return rows.materialize() if isinstance(rows, DerivedRows) else rows
