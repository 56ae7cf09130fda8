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
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from upsert_core.codec import Datum, UpsertKey, decode_datums, encode_datums, key_digest
from upsert_core.errors import CodecError
from upsert_core.landing.schema import SourceSchema


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
    """Encoded rows as a table with the schema's columns and Arrow types."""
    from upsert_core.landing.schema import ARROW_TYPES

    decoded = [decode_row(schema, r) for r in rows.to_pylist()]
    arrow = pa.schema([(name, ARROW_TYPES[typ]) for name, typ in schema.columns])
    return pa.Table.from_pylist(decoded, schema=arrow)
