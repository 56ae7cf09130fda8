"""``--missing null|keep``: which value columns a row leaves out (CONTRACT.md, "Change
data capture").

With ``keep``, a value column is *missing* from a row when the row leaves it out (a JSON
object without the field, a file without the column) or holds the placeholder string
(:data:`DEFAULT_PLACEHOLDER`, Debezium's TOAST marker, or ``--unavailable TEXT``), in a
binary column as its UTF-8 bytes, in a Debezium JSON field the wrapper's schema types
``bytes`` as their base64 (as Debezium and Kafka Connect send it there); the
ingest then keeps the key's previous value there (``ingest.missing_values``). An
explicit null is not missing. This module names the setting and carries the per-row
"missing" marks from the readers through validation to the bucket step.

Invariants:

- ``--missing null`` (the default) changes nothing anywhere: readers record no marks,
  validation finds no placeholders, the exchanged rows have no ``missing`` column.
- A row's marks travel as ONE bitmap per row (:func:`pack`, Arrow ``binary``): bit ``i``
  (little-endian within a byte) is schema column ``i`` of the schema the row was
  validated with. Schemas only append columns, so an index means the same column in
  every later schema. A column past a row's bitmap was not in its schema: the file held
  it but no row gave it a type (all null), so for that row it is an explicit null, NOT
  missing (:func:`unpack` reads it so).
- Key and order columns are never marked missing; a placeholder in one is an error row
  (``landing.validate``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from upsert_core.errors import ConfigError
from upsert_core.landing.batch import Column

DEFAULT_PLACEHOLDER = "__debezium_unavailable_value"
"""The value Debezium writes for a column it could not read (an unchanged TOASTed value)."""

MISSING_COLUMN = "missing"
"""The exchanged rows' column of per-row bitmaps (``ingest.tasks.rows_schema``)."""

Mask = npt.NDArray[np.bool_]


class Missing(StrEnum):
    """What a value column a row leaves out means (``--missing``)."""

    NULL = "null"
    KEEP = "keep"


def parse_missing(value: str | Missing) -> Missing:
    """``null`` or ``keep`` (any case, spaces around)."""
    if isinstance(value, Missing):
        return value
    try:
        return Missing(value.strip().lower())
    except ValueError:
        raise ConfigError(f"--missing must be 'null' or 'keep', got {value!r}") from None


def check_placeholder(value: str) -> str:
    """``value`` if it can be a placeholder (a non-empty string), else ConfigError."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"--unavailable must be a non-empty text, got {value!r}")
    return value


@dataclass(frozen=True)
class MissingPolicy:
    """``--missing keep`` with its placeholder: what the readers and validation mark."""

    placeholder: str = DEFAULT_PLACEHOLDER


def placeholder_mask(col: Column, placeholder: str) -> Mask | None:
    """Entries of ``col`` that are the placeholder (None: none can be): the string in a
    text column, its UTF-8 bytes in a binary one. Debezium puts its sentinel into a
    column of the column's own type, so a ``bytea``/``BLOB`` column that it could not read
    carries the placeholder's bytes (as Kafka Connect's S3 sink writes them to Parquet);
    a binary value is that placeholder exactly when its bytes are the text's."""
    if isinstance(col, list):
        if not any(v == placeholder for v in col if isinstance(v, str)):
            return None
        return np.fromiter((isinstance(v, str) and v == placeholder for v in col),
                           dtype=np.bool_, count=len(col))
    # Text (CSV) and typed columns alike: only string and binary arrays can hold it.
    t = col.type
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        col = col.cast(pa.string() if pa.types.is_string_view(t) else pa.binary())
        t = col.type
    raw = placeholder.encode("utf-8")
    binary = pa.types.is_binary(t) or pa.types.is_large_binary(t) or (
        pa.types.is_fixed_size_binary(t) and t.byte_width == len(raw))
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        sought: pa.Scalar = pa.scalar(placeholder, t)
    elif binary:
        sought = pa.scalar(raw, t)
    else:
        return None
    found = pc.fill_null(pc.equal(col, sought), False)
    mask = np.asarray(found.to_numpy(zero_copy_only=False), dtype=np.bool_)
    return mask if mask.any() else None


def nulled(col: Column, mask: Mask) -> Column:
    """``col`` with the entries of ``mask`` null."""
    if isinstance(col, list):
        return [None if m else v for v, m in zip(col, mask.tolist(), strict=True)]
    return pc.if_else(pa.array(mask), pa.nulls(len(col), col.type), col)


def pack(marks: Mask) -> pa.BinaryArray:
    """Rows of ``marks`` (shape ``(rows, columns)``) as one bitmap per row."""
    n, width = marks.shape
    packed = np.packbits(marks, axis=1, bitorder="little") if width else np.zeros(
        (n, 0), np.uint8)
    size = packed.shape[1]
    offsets = np.arange(n + 1, dtype=np.int32) * size
    return pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offsets.tobytes()),
                         pa.py_buffer(np.ascontiguousarray(packed).tobytes())],
    )


def unpack(bitmaps: pa.Array | pa.ChunkedArray, width: int) -> Mask:
    """The marks of ``width`` columns from :func:`pack`'s bitmaps (columns past a row's
    bitmap: not missing; see the module docstring)."""
    if isinstance(bitmaps, pa.ChunkedArray):
        bitmaps = bitmaps.combine_chunks() if bitmaps.num_chunks else pa.array([], pa.binary())
    n = len(bitmaps)
    out = np.zeros((n, width), dtype=np.bool_)
    if n == 0 or width == 0:
        return out
    lengths = np.asarray(pc.binary_length(bitmaps).to_numpy(zero_copy_only=False), np.int64)
    for size in np.unique(lengths).tolist():
        if size == 0:
            continue
        rows = np.flatnonzero(lengths == size)
        same = bitmaps if len(rows) == n else bitmaps.take(pa.array(rows, pa.int64()))
        bits = np.unpackbits(np.frombuffer(_flat(same), np.uint8).reshape(len(rows), size),
                             axis=1, bitorder="little")
        cols = min(width, bits.shape[1])
        out[rows, :cols] = bits[:, :cols].astype(np.bool_)
    return out


def _flat(bitmaps: pa.Array) -> bytes:
    """The bytes of ``bitmaps``' values, back to back."""
    offsets = np.frombuffer(bitmaps.buffers()[1], np.int32)[
        bitmaps.offset:bitmaps.offset + len(bitmaps) + 1]
    data = bitmaps.buffers()[2]
    return b"" if data is None else data.to_pybytes()[int(offsets[0]):int(offsets[-1])]
