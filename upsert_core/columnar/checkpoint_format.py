"""The bytes of a columnar checkpoint: a :class:`ColumnarState` as an Arrow IPC file.

Layout: the magic ``UPSCKPT2``, the 16-byte xxh3-128 digest of everything after it,
then an Arrow IPC file (zstd-compressed buffers) with columns ``hi``, ``lo`` (uint64),
``row`` (large_binary, null = tombstone) and, in the global scope, ``order`` (int64),
and the caller's metadata as JSON in the schema metadata (``upsert.checkpoint``).

For an order of several columns ``order`` is ``binary``: order keys
(``upsert_core.order_keys``), and the schema metadata says so with ``upsert.order_keys``
set to the key format (:data:`~upsert_core.order_keys.ORDER_KEY_FORMAT`). A checkpoint
with int64 orders carries no such entry, so its bytes are exactly what they were before
order keys existed; releases before them refuse a binary ``order`` column (a clear
error; the bucket is rebuilt from the shard).

Invariants:

- :func:`decode_state` returns a state only if the magic and digest match (a flipped
  bit anywhere is caught before anything is decoded), the IPC file reads, the columns
  are the expected ones, and the state's own invariants hold
  (:meth:`ColumnarState.checked`: keys sorted and unique, no tombstone in the batch
  scope). Anything else raises :class:`~upsert_core.errors.CodecError`.
- A binary ``order`` column is read only with the marker naming a format this release
  knows; a marker without it, or an unknown format, is a :class:`CodecError`.
- Decoding is a bulk read of whole columns; nothing is decoded per key.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import xxhash

from upsert_core import order_keys
from upsert_core.columnar.derived_rows import as_row_array
from upsert_core.columnar.merge import fold
from upsert_core.columnar.state import ROW_TYPE, ColumnarState
from upsert_core.errors import CodecError, InvalidUpsertState

MAGIC = b"UPSCKPT2"
DIGEST_LEN = 16
METADATA_KEY = b"upsert.checkpoint"
ORDER_KEYS_KEY = b"upsert.order_keys"
_IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")


def encode_state(state: ColumnarState, meta: dict[str, Any]) -> bytes:
    """``state`` (its overlay folded in) as checkpoint bytes carrying ``meta``."""
    state = fold(state)
    columns = [pa.array(state.hi), pa.array(state.lo), as_row_array(state.rows)]
    names = ["hi", "lo", "row"]
    metadata = {METADATA_KEY: json.dumps(meta, sort_keys=True).encode()}
    if state.orders is not None:
        columns.append(order_keys.to_arrow(state.orders))
        names.append("order")
        if order_keys.is_order_keys(state.orders):
            metadata[ORDER_KEYS_KEY] = str(order_keys.ORDER_KEY_FORMAT).encode()
    table = pa.table(columns, names=names).replace_schema_metadata(metadata)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema, options=_IPC_OPTIONS) as writer:
        writer.write_table(table, max_chunksize=1 << 20)
    body = sink.getvalue()
    return MAGIC + xxhash.xxh3_128_digest(body) + body.to_pybytes()


def schema_metadata(schema: pa.Schema) -> dict[str, Any] | None:
    """The checkpoint metadata a table's schema carries, or None if absent or malformed."""
    raw = (schema.metadata or {}).get(METADATA_KEY)
    try:
        meta = json.loads(raw) if raw is not None else None
    except ValueError:
        return None
    return meta if isinstance(meta, dict) else None


def is_columnar(data: bytes) -> bool:
    """Whether ``data`` starts like a columnar checkpoint."""
    return data[: len(MAGIC)] == MAGIC


def decode_state(data: bytes) -> tuple[ColumnarState, dict[str, Any]]:
    """The state and metadata stored in ``data`` (see the module docstring)."""
    head = len(MAGIC) + DIGEST_LEN
    if not is_columnar(data) or len(data) < head:
        raise CodecError("not a columnar checkpoint (bad magic)")
    buffer = pa.py_buffer(data)
    body = buffer.slice(head)
    if xxhash.xxh3_128_digest(memoryview(body)) != data[len(MAGIC) : head]:
        raise CodecError("columnar checkpoint digest mismatch: the blob is corrupted")
    try:
        table = pa.ipc.open_file(body).read_all()
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CodecError(f"columnar checkpoint is not a valid Arrow IPC file: {exc}") from exc
    meta = schema_metadata(table.schema)
    if meta is None:
        raise CodecError("columnar checkpoint has no metadata")
    names = table.schema.names
    if names not in (["hi", "lo", "row"], ["hi", "lo", "row", "order"]):
        raise CodecError(f"columnar checkpoint has columns {names}")
    marker = (table.schema.metadata or {}).get(ORDER_KEYS_KEY)
    if marker is not None and marker != str(order_keys.ORDER_KEY_FORMAT).encode():
        raise CodecError(
            f"columnar checkpoint holds order keys of format {marker!r}, which this release"
            f" does not read (it reads format {order_keys.ORDER_KEY_FORMAT})"
        )
    order_type = pa.int64() if marker is None else pa.binary()
    expected = {"hi": pa.uint64(), "lo": pa.uint64(), "row": ROW_TYPE, "order": order_type}
    for field in table.schema:
        if field.type != expected[field.name]:
            raise CodecError(f"columnar checkpoint column {field.name} is {field.type}")

    def numpy(name: str, dtype: type[np.generic]) -> np.ndarray:
        col = table.column(name)
        if col.null_count:
            raise CodecError(f"columnar checkpoint column {name} has nulls")
        return np.asarray(col.to_numpy(), dtype=dtype)

    row_col = table.column("row")
    rows = row_col.chunk(0) if row_col.num_chunks == 1 else row_col.combine_chunks()
    orders = None
    if "order" in names:
        if table.column("order").null_count:
            raise CodecError("columnar checkpoint column order has nulls")
        orders = order_keys.from_arrow(table.column("order"))
    try:
        state = ColumnarState.checked(numpy("hi", np.uint64), numpy("lo", np.uint64), rows, orders)
    except InvalidUpsertState as exc:
        raise CodecError(f"columnar checkpoint does not hold a valid state: {exc}") from exc
    return state, meta
