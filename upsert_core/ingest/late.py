"""The shard's late collection: rows that came too late to change anything.

CONTRACT.md ("Change data capture", late rows): with ``--order-scope global`` a row whose
order value is not greater than the order stored for its key before the batch is
*late* (``columnar.late`` finds them in the drain). It changes nothing and is kept here
with its file, row number (from 1), key, order and the stored order. A batch-scope
shard has none.

Storage. A bucket step whose drain found late rows writes them as one *late part*
(:func:`write_late_part`): Parquet under ``{shard}/late/`` (``keys.late_part_key``), the
columns of :func:`late_schema` (``file``, ``row``, ``key`` a struct of the key columns,
``order`` and ``stored_order`` structs of the order columns, each with the shard's
column types: the user's values, never the engine's int64 or order-key encoding), and
the footer metadata ``upsert.late`` (JSON: ``format`` :data:`LATE_FORMAT`, shard, ts,
bucket, buckets). The driver commits its key as the config entry
``blobref.late.<ts>.<b>`` (``shard_config.late_ref_name``) in the compare-and-append
that commits the batch.

Invariants:

- Late rows commit atomically with their batch: the part is referenced only by the
  commit of the batch it belongs to, so a killed or losing attempt leaves an
  unreferenced blob (deleted by the driver, else by GC's sweep of ``late/``), and a file
  is applied once, so its late rows are never recorded twice.
- Being ``blobref.`` entries, late parts are kept by GC exactly like batch parts, and a
  release that predates late rows keeps them too.
- Reads (:func:`read_late`) return the late rows of every batch at or after the shard's
  ``since`` (the history a read may see), ordered by ts, then row number; those of
  batches before ``since`` are never read, and the transition that advances ``since``
  (GC, retention) drops their entries (``commit_times.with_since``), so GC then deletes
  their parts like any unreferenced blob.
- A late part that is missing, undecodable, of an unknown format or of another
  shard, ts or bucket than its entry says is :class:`CorruptData` naming the blob: late
  rows are never silently lost or misattributed. A part GC deleted under a read whose
  state is no longer current is not corruption: the read goes on with the fresh state,
  or refuses (:class:`NotReadable`) if rows it has not yielded are gone
  (:func:`iter_late`).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from upsert_core import order_keys
from upsert_core.errors import CorruptData, NotReadable
from upsert_core.ingest.shard_config import late_ref_name, parse_late_ref_name
from upsert_core.landing import ARROW_TYPES, SourceSchema
from upsert_core.landing.rows import decode_rows_to_table
from upsert_core.landing.schema import LogicalType
from upsert_core.order_keys import OrderArray
from upsert_core.persist.keys import late_part_key
from upsert_core.persist.location import Blob
from upsert_core.persist.shard import READ_ATTEMPTS
from upsert_core.persist.state.state import ShardState
from upsert_core.persist.write.parts import VALUE_PREFIX

LATE_FORMAT = 1
"""The late part layout above; a part of another format is refused, never guessed."""
LATE_META = b"upsert.late"


def _type(schema: SourceSchema, column: str) -> LogicalType:
    typ = schema.type_of(column)
    if typ is None:
        raise CorruptData(f"the shard's schema has no type for column {column!r}")
    return typ


def key_type(schema: SourceSchema) -> pa.StructType:
    """The ``key`` struct: the key columns with their types."""
    return pa.struct([(c, ARROW_TYPES[_type(schema, c)]) for c in schema.key])


def order_type(schema: SourceSchema) -> pa.StructType:
    """The ``order`` (and ``stored_order``) struct: the order columns with their types."""
    return pa.struct([(c, ARROW_TYPES[_type(schema, c)]) for c in schema.order_columns])


def late_schema(schema: SourceSchema) -> pa.Schema:
    """The columns of a late part of a shard with ``schema``."""
    order = order_type(schema)
    return pa.schema([("file", pa.string()), ("row", pa.int64()), ("key", key_type(schema)),
                      ("order", order), ("stored_order", order)])


# --- writing ------------------------------------------------------------------------------


def order_values(schema: SourceSchema, orders: OrderArray) -> pa.StructArray:
    """The engine's orders (int64, or order keys for several columns) as the user's
    values: a struct of the order columns, typed as the shard's columns.

    One order column: the int64 itself (a timestamp's microseconds since the epoch, UTC).
    Several: each order key decoded (``order_keys.decode``)."""
    struct = order_type(schema)
    if not schema.several_orders:
        only = struct.field(0)
        ints = pa.array(np.asarray(orders, np.int64), pa.int64())
        return pa.StructArray.from_arrays([ints.cast(only.type)], fields=[only])
    kinds = [order_keys.STRING if _type(schema, c) is LogicalType.STRING else order_keys.INTEGER
             for c in schema.order_columns]
    tuples = [order_keys.decode(k, kinds) for k in order_keys.to_arrow(orders).to_pylist()]
    columns = []
    for i, field in enumerate(struct):
        values = [t[i] for t in tuples]
        if kinds[i] == order_keys.INTEGER:
            columns.append(pa.array(values, pa.int64()).cast(field.type))
        else:
            columns.append(pa.array(values, pa.string()))
    return pa.StructArray.from_arrays(columns, fields=list(struct))


def _key_values(schema: SourceSchema, rows: pa.Table) -> pa.StructArray:
    """The key columns of ``rows`` (drained rows): their kept typed values (``v:``
    columns) when validation kept them, else decoded from the encoded rows."""
    struct = key_type(schema)
    names = [VALUE_PREFIX + c for c in schema.key]
    have = set(rows.column_names)
    if all(n in have and rows.schema.field(n).type == f.type
           for n, f in zip(names, struct, strict=True)):
        columns = [rows.column(n).combine_chunks() for n in names]
    else:
        decoded = decode_rows_to_table(schema, rows.column("row"))
        columns = [decoded.column(c).combine_chunks() for c in schema.key]
    return pa.StructArray.from_arrays(columns, fields=list(struct))


def late_table(
    schema: SourceSchema, file: str, rows: pa.Table, late: np.ndarray, stored: OrderArray
) -> pa.Table:
    """The late rows ``late`` (indices into ``rows``, one bucket's drained rows, whose
    keys' stored orders are ``stored``) of ``file`` as a table of :func:`late_schema`.
    ``schema`` is the one the file's rows were encoded with."""
    taken = rows.take(pa.array(np.asarray(late, np.int64), pa.int64()))
    n = taken.num_rows
    return pa.table(
        [
            pa.array([file] * n, pa.string()),
            taken.column("position").cast(pa.int64()),
            _key_values(schema, taken),
            order_values(schema, order_keys.from_arrow(taken.column("order"))),
            order_values(schema, stored),
        ],
        schema=late_schema(schema),
    )


def _meta(shard: str, ts: int, bucket: int, buckets: int) -> dict[str, Any]:
    return {"format": LATE_FORMAT, "shard": shard, "ts": ts, "bucket": bucket,
            "buckets": buckets}


def write_late_part(
    blob: Blob, shard: str, ts: int, bucket: int, buckets: int, table: pa.Table
) -> tuple[str, int]:
    """Write bucket ``bucket``'s late rows of the batch at ``ts`` as a new late part;
    returns its key and size."""
    meta = {LATE_META: json.dumps(_meta(shard, ts, bucket, buckets)).encode()}
    sink = pa.BufferOutputStream()
    pq.write_table(table.replace_schema_metadata(meta), sink, compression="zstd")
    data = sink.getvalue().to_pybytes()
    key = late_part_key(shard)
    blob.set(key, data)
    return key, len(data)


def late_entries(ts: int, parts: Mapping[int, str]) -> dict[str, str]:
    """The config entries that commit the late parts ``parts`` (bucket -> key) of the
    batch at ``ts``."""
    return {late_ref_name(ts, bucket): key for bucket, key in sorted(parts.items()) if key}


# --- reading ------------------------------------------------------------------------------


def late_refs(
    state: ShardState, until: int | None = None, buckets: Callable[[int], bool] | None = None
) -> list[tuple[int, int, str]]:
    """``(ts, bucket, key)`` of every late part of a batch at or after ``state.since``
    (and before ``until``; of the buckets ``buckets`` keeps), in ts and bucket order."""
    refs = []
    for name, key in state.config.items():
        parsed = parse_late_ref_name(name)
        if parsed is None or not key or parsed[0] < state.since:
            continue
        if (until is None or parsed[0] < until) and (buckets is None or buckets(parsed[1])):
            refs.append((*parsed, key))
    return sorted(refs)


def read_late_part(blob: Blob, key: str, shard: str, ts: int, bucket: int) -> pa.Table:
    """The late rows stored at ``key`` (the part of ``bucket`` at ``ts``); see the
    module docstring for what is refused."""
    where = f"shard {shard}: late part {key} (ts {ts}, bucket {bucket})"
    data = blob.get(key)
    if data is None:
        raise _PartMissing(f"{where} is missing from the blob store")
    try:
        table = pq.read_table(io.BytesIO(data))
    except (pa.ArrowException, OSError) as exc:
        raise CorruptData(f"{where} cannot be decoded: {exc}") from exc
    raw = (table.schema.metadata or {}).get(LATE_META)
    try:
        meta = json.loads(raw) if raw is not None else None
    except ValueError:
        meta = None
    if not isinstance(meta, dict) or meta.get("format") != LATE_FORMAT:
        raise CorruptData(f"{where} is not a late part of format {LATE_FORMAT}: {meta!r}")
    if (meta.get("shard"), meta.get("ts"), meta.get("bucket")) != (shard, ts, bucket):
        raise CorruptData(f"{where} holds the late rows of another batch: {meta!r}")
    return table.replace_schema_metadata(None)


def read_late(
    blob: Blob, state: ShardState, schema: SourceSchema | None, *, until: int | None = None,
    buckets: Callable[[int], bool] | None = None,
    fresh: Callable[[], ShardState] | None = None,
) -> pa.Table:
    """The late collection as of ``state`` (:func:`late_schema`), batch by batch from
    ``since`` on, each batch's rows in file order; ``until`` and ``buckets`` as for
    :func:`late_refs` (a read planned at an upper, a task's share of the buckets),
    ``fresh`` as for :func:`iter_late`."""
    tables = list(iter_late(blob, state, schema, until=until, buckets=buckets, fresh=fresh))
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables) if tables else empty_late()


def iter_late(
    blob: Blob, state: ShardState, schema: SourceSchema | None, *, until: int | None = None,
    buckets: Callable[[int], bool] | None = None,
    fresh: Callable[[], ShardState] | None = None,
) -> Iterator[pa.Table]:
    """:func:`read_late` one batch (ts) at a time, so a reader holds one batch's late
    rows; nothing when there are none (an empty table when the shard has a schema and
    no late rows, so its columns are known).

    ``fresh`` (the shard's current state) lets the read survive a concurrent GC, as the
    shard's own reads do (``persist.shard``): GC that advances since drops the late
    parts of the batches before it and may delete them while this read streams. A
    missing part of a state that is no longer current is then GC's doing: the read goes
    on with the fresh state after the last batch it yielded, unless a batch it has not
    yielded yet is now before since (:class:`NotReadable`: read again). A part missing
    from the current state is corruption (:class:`CorruptData`)."""
    done = -1  # the last ts yielded
    for attempt in range(1, READ_ATTEMPTS + 1):
        try:
            for ts, table in _batches(blob, state, schema, until, buckets, after=done):
                yield table
                done = ts
            return
        except _PartMissing:
            current = None if fresh is None else fresh()
            if current is None or current.seqno == state.seqno or attempt == READ_ATTEMPTS:
                raise
            lost = sorted({ts for ts, _, _ in late_refs(state, until, buckets)
                           if done < ts < current.since})
            if done >= 0 and lost:
                raise NotReadable(
                    f"shard {state.shard_id}: since moved from {state.since} to"
                    f" {current.since} while the late rows streamed (those of ts"
                    f" {lost[0]} on are gone); read again"
                ) from None
            state = current


class _PartMissing(CorruptData):
    """A late part its state references is not in the blob store."""


def _batches(
    blob: Blob, state: ShardState, schema: SourceSchema | None, until: int | None,
    buckets: Callable[[int], bool] | None, *, after: int,
) -> Iterator[tuple[int, pa.Table]]:
    """``(ts, late rows)`` of each batch after ``after`` (see :func:`iter_late`)."""
    refs = [r for r in late_refs(state, until, buckets) if r[0] > after]
    if not refs and not _typed(schema):
        return  # no ingest committed rows yet: no column types to give
    if schema is None:
        raise CorruptData(f"shard {state.shard_id} has late rows but no stored schema")
    wanted = late_schema(schema)
    if not refs and after < 0:
        yield -1, wanted.empty_table()
    for ts in sorted({ts for ts, _, _ in refs}):
        parts = [read_late_part(blob, key, state.shard_id, t, b)
                 for t, b, key in refs if t == ts]
        batch = pa.concat_tables([_conform(p, wanted, state.shard_id) for p in parts])
        yield ts, batch.sort_by("row")


def _typed(schema: SourceSchema | None) -> bool:
    """Whether ``schema`` knows the types of its key and order columns."""
    return schema is not None and all(
        schema.type_of(c) is not None for c in (*schema.key, *schema.order_columns))


def _conform(table: pa.Table, wanted: pa.Schema, shard: str) -> pa.Table:
    if not table.schema.equals(wanted):
        raise CorruptData(
            f"shard {shard}: a late part has columns {table.schema} where the shard's"
            f" key and order give {wanted}"
        )
    return table


def empty_late() -> pa.Table:
    """The late collection of a shard whose key and order columns have no types yet
    (no ingest committed rows)."""
    return pa.schema([("file", pa.string()), ("row", pa.int64()), ("key", pa.null()),
                      ("order", pa.null()), ("stored_order", pa.null())]).empty_table()


def user_schema(schema: SourceSchema | None) -> pa.Schema:
    """The columns of :func:`user_table` for a shard with ``schema``."""
    return user_table(empty_late() if not _typed(schema) or schema is None
                      else late_schema(schema).empty_table(), schema).schema


def user_table(table: pa.Table, schema: SourceSchema | None) -> pa.Table:
    """The late collection as users read it: ``order`` and ``stored_order`` are the
    order column's values for one order column, a struct of them for several, its
    fields named as ``--order`` names them (``source.file``, never a stored column's
    reserved name, ``SourceSchema.order_columns``)."""
    if not _typed(schema) or schema is None:
        return table
    out = table
    for name in ("order", "stored_order"):
        column = table.column(name).combine_chunks()
        if not schema.several_orders:
            shown: pa.Array = column.field(0)
        elif schema.order_fields == schema.order_columns:
            continue
        else:
            # (a cast would match fields by name, and nulls where none matches)
            shown = pa.StructArray.from_arrays(
                [column.field(i) for i in range(column.type.num_fields)],
                fields=[f.with_name(label) for f, label
                        in zip(column.type, schema.order_fields, strict=True)],
                mask=column.is_null())
        out = out.set_column(out.schema.get_field_index(name), name, shown)
    return out


def late_records(
    tables: Iterable[pa.Table], schema: SourceSchema | None
) -> Iterator[dict[str, Any]]:
    """The late collection (``tables``: :func:`iter_late`'s) as ``upsertctl late``
    prints it (Python values): ``file``, ``row``, ``key`` (column -> value), ``order``
    and ``stored_order`` (the value for one order column, a list in column order for
    several)."""
    several = schema is not None and schema.several_orders
    for table in tables:
        for rec in table.to_pylist():
            order, stored = rec["order"], rec["stored_order"]
            if schema is not None:
                columns = schema.order_columns
                order = [order[c] for c in columns] if several else order[columns[0]]
                stored = [stored[c] for c in columns] if several else stored[columns[0]]
            yield {"file": rec["file"], "row": rec["row"], "key": rec["key"],
                   "order": order, "stored_order": stored}


__all__ = [
    "LATE_FORMAT",
    "iter_late",
    "late_entries",
    "late_records",
    "late_refs",
    "late_schema",
    "late_table",
    "order_values",
    "read_late",
    "user_schema",
    "user_table",
    "write_late_part",
]
