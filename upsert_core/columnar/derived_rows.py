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

from upsert_core.codec_columns import decode_columns
from upsert_core.errors import CodecError
from upsert_core.persist.write.parts import rows_of_values

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
        # SUBTLE: chunks are kept as they are: a bucket's string column may hold more
        # than the 2 GiB one string array can, so nothing here concatenates a column.
        self.values = values
        """The rows' values: a column per row column, named as the shard names them."""
        self._values: list[pa.ChunkedArray] = list(values.columns)
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
            return _encode(_take(self._values, index))
        valid = np.asarray(index.is_valid().to_numpy(zero_copy_only=False), bool)
        dense = _encode(_take(self._values, index.filter(pa.array(valid))))
        at = np.cumsum(valid) - 1
        return dense.take(pa.array(at, pa.int64(), mask=~valid))

    def merged(self, rows: pa.Array, sources: np.ndarray) -> DerivedRows | None:
        """The rows ``sources`` picks from these rows followed by the encoded ``rows``
        (index ``len(self) + j`` is ``rows[j]``), still derived from values: the picked
        encoded rows are decoded with these values' column types, so nothing is
        encoded. None where that cannot be done exactly (these rows are already
        encoded, a picked row is null or does not decode to these types): the caller
        then merges encoded rows."""
        if self._encoded is not None:
            return None
        n = self._length
        picked = np.asarray(sources, np.int64)
        from_rows = picked >= n
        changed = picked[from_rows] - n
        taken = rows.take(pa.array(changed, pa.int64())) if len(changed) else rows.slice(0, 0)
        if taken.null_count:
            return None
        try:
            decoded = decode_columns(
                taken, [v.type for v in self._values], list(self.values.column_names)
            )
        except (CodecError, TypeError, ValueError):
            return None
        # Rows of the base keep their place; the decoded ones are appended after them,
        # and one take per column puts every row where ``sources`` wants it.
        at = np.where(from_rows, 0, picked)
        at[from_rows] = n + np.arange(len(changed))
        columns = [
            take_rows(pa.chunked_array([*base.chunks, *new.chunks], base.type), at)
            for base, new in zip(
                self._values, (pa.chunked_array([c]) if isinstance(c, pa.Array) else c
                               for c in decoded.columns), strict=True)
        ]
        return DerivedRows(pa.table(columns, names=list(self.values.column_names)))

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


ENCODE_ROWS = 256 * 1024
"""Rows encoded (or taken) at a time, so no piece's values outgrow one Arrow array."""


def take_rows(column: pa.ChunkedArray | pa.Array, index: np.ndarray) -> pa.ChunkedArray:
    """Rows ``index`` of ``column`` (no null index), as a chunked array.

    SUBTLE: Arrow's take on a chunked string column concatenates its chunks first, which
    fails once they hold more than 2 GiB together. Here each slice of ``index`` is taken
    chunk by chunk and put back in order, so only one slice's values are ever joined."""
    if isinstance(column, pa.Array):
        column = pa.chunked_array([column], column.type)
    out: list[pa.Array] = []
    lengths = [len(c) for c in column.chunks]
    if len(lengths) <= 1:
        for start in range(0, len(index), ENCODE_ROWS):
            piece = pa.array(index[start:start + ENCODE_ROWS], pa.int64())
            out.extend(column.take(piece).chunks)
        return pa.chunked_array(out, column.type)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    for start in range(0, len(index), ENCODE_ROWS):
        piece = np.asarray(index[start:start + ENCODE_ROWS], np.int64)
        chunk_of = np.searchsorted(offsets, piece, side="right") - 1
        order = np.argsort(chunk_of, kind="stable")
        taken = [
            column.chunk(int(c)).take(pa.array(piece[chunk_of == c] - offsets[c], pa.int64()))
            for c in np.unique(chunk_of)
        ]
        joined = pa.concat_arrays(taken) if taken else pa.array([], column.type)
        back = np.empty(len(piece), np.int64)
        back[order] = np.arange(len(piece))
        out.append(joined.take(pa.array(back, pa.int64())))
    return pa.chunked_array(out, column.type)


def _take(values: Sequence[pa.ChunkedArray], index: pa.Array) -> list[pa.ChunkedArray]:
    at = np.asarray(index.to_numpy(zero_copy_only=False), np.int64)
    return [take_rows(v, at) for v in values]


def _encode(values: Sequence[pa.ChunkedArray | pa.Array]) -> pa.LargeBinaryArray:
    """The encoded rows of ``values``, one slice of rows at a time (``large_binary``
    holds any total size)."""
    n = len(values[0])
    chunks: list[pa.Array] = []
    for start in range(0, n, ENCODE_ROWS):
        rows = rows_of_values([v.slice(start, ENCODE_ROWS) for v in values])
        pieces = rows.chunks if isinstance(rows, pa.ChunkedArray) else [rows]
        chunks.extend(piece.cast(ROW_TYPE) for piece in pieces)
    if not chunks:
        return pa.array([], ROW_TYPE)
    encoded: pa.LargeBinaryArray = (
        chunks[0] if len(chunks) == 1 else pa.concat_arrays(chunks)
    )
    return encoded


def as_row_array(rows: Any) -> pa.Array:
    """``rows`` as an Arrow array: derived rows are encoded, an array is returned as is."""
    return rows.materialize() if isinstance(rows, DerivedRows) else rows
