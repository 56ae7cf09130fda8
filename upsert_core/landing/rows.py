"""Row and key encoding of validated source rows, and decoding rows back to columns.

Invariants:

- A row is ``encode_datums`` of the values of the schema's columns (every column but
  the delete marker, in schema order) with trailing nulls removed. Schemas only append
  columns, so adding a column never changes how an existing row encodes, and a row
  written before a column existed equals one written after with that column null.
- An upsert key is ``key_digest(encode_datums(key values))`` with the key columns in
  the shard's ``--key`` order.
- :func:`decode_row` is the inverse of :func:`encode_row` for a schema at least as new
  as the one the row was written with; absent trailing columns read as ``None``.
- :func:`decode_rows_to_table` decodes many rows at once into the columns
  ``upsertctl snapshot --format parquet`` writes (schema names, ``ARROW_TYPES``), with
  the values ``decode_row`` gives row by row; it raises CodecError where ``decode_row``
  would, and also for a datum whose kind does not fit its column's type.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from upsert_core.codec import Datum, UpsertKey, decode_datums, encode_datums, key_digest
from upsert_core.codec_columns import decode_columns
from upsert_core.errors import CodecError
from upsert_core.landing.schema import ARROW_TYPES, SourceSchema


def encode_row(values: Sequence[Datum]) -> bytes:
    """Encode one row's values (schema order), dropping trailing nulls first."""
    end = len(values)
    while end and values[end - 1] is None:
        end -= 1
    return encode_datums(values[:end] if end != len(values) else values)


def encode_key(values: Sequence[Datum]) -> UpsertKey:
    """The 16-byte upsert key of one row's key values (``--key`` order)."""
    return key_digest(encode_datums(values))


def decode_row(schema: SourceSchema, row: bytes) -> dict[str, object]:
    """The row as ``{column: value}`` for every schema column, None where absent."""
    values = decode_datums(row)
    names = schema.names
    if len(values) > len(names):
        raise CodecError(
            f"row has {len(values)} values but the schema has only {len(names)} columns"
        )
    out: dict[str, object] = dict.fromkeys(names)
    for name, value in zip(names, values, strict=False):
        out[name] = value
    return out


def decode_rows_to_table(schema: SourceSchema, rows: pa.Array | pa.ChunkedArray) -> pa.Table:
    """Encoded rows (a binary Arrow array) as a table with one column per schema column.

    The columns are named and typed as ``upsertctl snapshot --format parquet`` writes
    them (``ARROW_TYPES`` of each logical type, nullable); row ``i`` holds the values of
    ``decode_row(schema, rows[i])``.
    """
    return decode_columns(rows, [ARROW_TYPES[typ] for _, typ in schema.columns], schema.names)
