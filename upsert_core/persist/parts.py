"""Batch parts and error parts: how updates and error rows are stored as Parquet.

A *batch part* holds updates with columns ``key: binary`` (the 16-byte upsert key),
``row: binary`` (the codec-encoded row), ``ts: int64`` and ``diff: int64``. An *error
part* holds row-level ingest errors with columns ``file: string``, ``row: int64`` and
``reason: string``. Small parts are kept inline in the shard state; bigger ones are
written to Blob under ``keys.part_key`` / ``keys.error_part_key``.

Invariants:

- Every batch part is sorted by ``(key, row, ts)``, has no nulls, and every key is
  exactly :data:`KEY_BYTES` long. :func:`write_part` sorts (with pyarrow) and checks
  before writing; readers (the streaming merge in ``read``) rely on the order.
- A part's ``num_updates`` equals the number of rows in its Parquet data.
- A blob part is written before any state references it; a part is never rewritten
  (each write takes a fresh uuid key), so a reader that sees it in a state sees the
  whole of it.
- Bytes that are not a valid part of the expected schema raise :class:`CorruptData`
  naming the shard and the blob key (or "inline part"); a referenced blob that is
  missing raises it too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from upsert_core.errors import CorruptData, InvalidUsage
from upsert_core.persist.consolidate import UPDATE_SCHEMA, as_table, sort_updates
from upsert_core.persist.keys import error_part_key, part_key
from upsert_core.persist.location import Blob
from upsert_core.persist.state import BlobPart, ErrorBatch, HollowBatch, InlinePart, Part

KEY_BYTES = 16
"""Length of an upsert key (an xxh3-128 digest)."""

DEFAULT_INLINE_THRESHOLD = 4096
"""Encoded parts up to this many bytes are kept inline in the state."""

DEFAULT_ROW_GROUP_ROWS = 64 * 1024
"""Rows per Parquet row group: the unit a reader decodes at a time."""

DEFAULT_PART_ROWS = 1024 * 1024
"""Rows per part when a large table is split (bounds the bytes fetched per part)."""

DEFAULT_BATCH_ROWS = 64 * 1024
"""Rows per record batch yielded by :func:`read_part`."""

ERROR_SCHEMA = pa.schema(
    [
        pa.field("file", pa.string()),
        pa.field("row", pa.int64()),
        pa.field("reason", pa.string()),
    ]
)


# --- encoding ---------------------------------------------------------------------


def _conform(data: pa.Table | pa.RecordBatch, schema: pa.Schema, what: str) -> pa.Table:
    """``data`` with exactly ``schema``'s columns, cast; InvalidUsage when impossible."""
    table = as_table(data)
    missing = [name for name in schema.names if name not in table.column_names]
    if missing:
        raise InvalidUsage(f"{what} is missing column(s) {missing}; needs {schema.names}")
    table = table.select(schema.names)
    for name in schema.names:
        if table.column(name).null_count:
            raise InvalidUsage(f"{what} has nulls in column {name!r}")
    try:
        return table.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InvalidUsage(f"{what} does not fit schema {schema}: {exc}") from exc


def conform_updates(data: pa.Table | pa.RecordBatch) -> pa.Table:
    """``data`` as a table of updates, checked (schema, no nulls, 16-byte keys)."""
    table = _conform(data, UPDATE_SCHEMA, "batch part")
    if table.num_rows:
        lengths = pc.binary_length(table.column("key"))
        bounds = pc.min_max(lengths).as_py()
        if bounds["min"] != KEY_BYTES or bounds["max"] != KEY_BYTES:
            raise InvalidUsage(
                f"batch part keys must be {KEY_BYTES} bytes, found lengths "
                f"{bounds['min']}..{bounds['max']}"
            )
    return table


def encode_parquet(table: pa.Table, row_group_rows: int = DEFAULT_ROW_GROUP_ROWS) -> bytes:
    """``table`` as Parquet bytes."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=max(1, row_group_rows))
    return sink.getvalue().to_pybytes()


def _store(blob: Blob, key: str, data: bytes, num: int, inline_threshold: int) -> Part:
    if len(data) <= inline_threshold:
        return InlinePart(data=data, num_updates=num)
    blob.set(key, data)
    return BlobPart(key=key, encoded_size_bytes=len(data), num_updates=num)


def write_part(
    blob: Blob,
    shard: str,
    data: pa.Table | pa.RecordBatch,
    *,
    inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
    presorted: bool = False,
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
) -> Part:
    """Write ``data`` as one batch part: inline when small, else a new blob.

    The updates are checked and sorted by ``(key, row, ts)`` (skip the sort with
    ``presorted=True`` when the caller guarantees the order). They are not
    consolidated: that is the writer's business (see ``consolidate``).
    """
    table = conform_updates(data)
    if not presorted:
        table = sort_updates(table)
    encoded = encode_parquet(table, row_group_rows)
    return _store(blob, part_key(shard), encoded, table.num_rows, inline_threshold)


def write_parts(
    blob: Blob,
    shard: str,
    data: pa.Table | pa.RecordBatch,
    *,
    inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
    part_rows: int = DEFAULT_PART_ROWS,
) -> tuple[Part, ...]:
    """Sort ``data`` and write it as parts of at most ``part_rows`` rows (none if empty)."""
    table = sort_updates(conform_updates(data))
    step = max(1, part_rows)
    return tuple(
        write_part(
            blob, shard, table.slice(start, step), inline_threshold=inline_threshold,
            presorted=True,
        )
        for start in range(0, table.num_rows, step)
    )


def write_batch(
    blob: Blob,
    shard: str,
    data: pa.Table | pa.RecordBatch,
    lower: int,
    upper: int,
    *,
    inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
    part_rows: int = DEFAULT_PART_ROWS,
) -> HollowBatch:
    """Write ``data`` (updates with ``lower <= ts < upper``) as a new batch."""
    if not 0 <= lower < upper:
        raise InvalidUsage(f"batch bounds [{lower}, {upper}) must satisfy 0 <= lower < upper")
    table = conform_updates(data)
    if table.num_rows:
        bounds = pc.min_max(table.column("ts")).as_py()
        if bounds["min"] < lower or bounds["max"] >= upper:
            raise InvalidUsage(
                f"batch [{lower}, {upper}) holds updates at ts {bounds['min']}..{bounds['max']}"
            )
    parts = write_parts(
        blob, shard, table, inline_threshold=inline_threshold, part_rows=part_rows
    )
    return HollowBatch(lower=lower, upper=upper, since=0, parts=parts)


def write_error_part(
    blob: Blob,
    shard: str,
    data: pa.Table | pa.RecordBatch,
    *,
    inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
) -> Part:
    """Write error rows ``(file, row, reason)`` as one error part."""
    table = _conform(data, ERROR_SCHEMA, "error part")
    encoded = encode_parquet(table)
    return _store(blob, error_part_key(shard), encoded, table.num_rows, inline_threshold)


def write_error_batch(
    blob: Blob,
    shard: str,
    ts: int,
    data: pa.Table | pa.RecordBatch,
    *,
    inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
) -> ErrorBatch:
    """Write error rows as an :class:`ErrorBatch` to be committed at ``ts``."""
    part = write_error_part(blob, shard, data, inline_threshold=inline_threshold)
    return ErrorBatch(ts=ts, part=part, num_errors=part.num_updates)


# --- decoding ---------------------------------------------------------------------


def _describe(part: Part, shard: str | None) -> str:
    if isinstance(part, BlobPart):
        owner = shard or part.key.split("/", 1)[0]
        return f"shard {owner}: part {part.key}"
    return f"shard {shard or '?'}: inline part"


def _part_bytes(blob: Blob, part: Part, where: str) -> bytes:
    if isinstance(part, InlinePart):
        return part.data
    data = blob.get(part.key)
    if data is None:
        raise CorruptData(f"{where} is referenced by the state but missing from the blob store")
    return data


def _open(data: bytes, schema: pa.Schema, part: Part, where: str) -> pq.ParquetFile:
    try:
        parquet = pq.ParquetFile(pa.BufferReader(data))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CorruptData(f"{where} is not valid Parquet ({len(data)} bytes): {exc}") from exc
    actual = parquet.schema_arrow
    if actual.names != schema.names or actual.types != schema.types:
        raise CorruptData(f"{where} has schema {actual}, expected {schema}")
    rows = parquet.metadata.num_rows
    if rows != part.num_updates:
        raise CorruptData(f"{where} holds {rows} rows but the state says {part.num_updates}")
    return parquet


def _iter(
    blob: Blob, part: Part, schema: pa.Schema, shard: str | None, batch_rows: int
) -> Iterator[pa.RecordBatch]:
    where = _describe(part, shard)
    parquet = _open(_part_bytes(blob, part, where), schema, part, where)
    batches = parquet.iter_batches(batch_size=max(1, batch_rows))
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise CorruptData(f"{where} cannot be decoded: {exc}") from exc
        yield batch


def read_part(
    blob: Blob,
    part: Part,
    *,
    shard: str | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> Iterator[pa.RecordBatch]:
    """The updates of a batch part, in ``(key, row, ts)`` order, batch by batch.

    Fetches the part's bytes once (Blob has no ranged reads) and decodes one record
    batch at a time. Raises :class:`CorruptData` for missing or undecodable parts.
    """
    return _iter(blob, part, UPDATE_SCHEMA, shard, batch_rows)


def read_part_table(blob: Blob, part: Part, *, shard: str | None = None) -> pa.Table:
    """All updates of one part as a table (for tests and small parts)."""
    batches = list(read_part(blob, part, shard=shard))
    return pa.Table.from_batches(batches, schema=UPDATE_SCHEMA)


def read_error_part(blob: Blob, part: Part, *, shard: str | None = None) -> pa.Table:
    """The error rows ``(file, row, reason)`` of an error part."""
    batches = list(_iter(blob, part, ERROR_SCHEMA, shard, DEFAULT_BATCH_ROWS))
    return pa.Table.from_batches(batches, schema=ERROR_SCHEMA)


def delete_parts(blob: Blob, parts: Iterable[Part]) -> int:
    """Delete the blob parts among ``parts`` (inline parts need nothing); returns count.

    Only for parts no committed state references: a writer whose append did not
    commit, or a compaction whose result was not committed.
    """
    deleted = 0
    for part in parts:
        if isinstance(part, BlobPart):
            blob.delete(part.key)
            deleted += 1
    return deleted
