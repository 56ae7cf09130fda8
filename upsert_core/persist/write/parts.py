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
  missing, or that vanishes while it is read, raises it too (saying "missing").
- Reading is lazy and ranged: a part is opened at the first ``next`` through a blob
  reader and decoded one row group at a time, so ``read_part`` and the merged read never
  hold a whole part (the typed snapshot and bucket-preserving compaction read whole
  parts of one bucket).

Typed parts (the layout :mod:`~upsert_core.persist.read.typed_read` reads without merging):

- A batch part may carry, after the four update columns, *value columns* named
  :data:`VALUE_PREFIX` + a row column's name: row ``i``'s values, decoded from its
  ``row`` by the writer's decoder. They are derived data: every reader of updates reads
  only the four update columns (Parquet projection, so they cost such a reader nothing),
  and ``check`` verifies them against ``row``.
- Its footer may label it with a *bucket* ``"b/N"``: the writer promises that every key
  lies in bucket ``b`` of the shard's fixed key-to-bucket map with ``N`` buckets, so
  two parts labelled differently (same ``N``) share no key. The label is opaque here.
- ``consolidated`` in its footer is computed by :func:`write_part` from the sorted data
  (no two rows share ``(key, row)``, no ``diff`` is 0), never taken from the caller.

Part formats (``upsert.format`` in the footer; a reader refuses a format it does not
know, naming it, instead of misreading it):

- 1 (no label, no value columns) and 2 (no label, value columns beside ``row``): the
  encoded row is stored.
- 3 (:data:`VALUES_ONLY_FORMAT`): the row is stored ONCE, as its value columns:
  ``key, ts, diff, v:<column>...`` with every row column, in the order the row was
  encoded with. ``row`` is not stored: it is the canonical encoding of the values
  (:func:`rows_of_values`, trailing nulls dropped, as the ingest encodes rows), which
  :class:`OpenPart` computes whenever a reader asks for ``row``, so every reader of
  updates sees the same ``(key, row, ts, diff)`` whichever format holds them, and the
  sort order, consolidation and ``consolidated`` label keep meaning what they meant.
  The writer decodes the values from the rows, and the codec's encoding of decoded
  values gives back the same bytes (``tests/core/test_codec_columns.py``), so dropping
  ``row`` loses nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from upsert_core.codec import encode_columns, encode_datums
from upsert_core.errors import CodecError, CorruptData, InvalidUsage
from upsert_core.persist.keys import error_part_key, part_key
from upsert_core.persist.location import Blob, BlobReader, RangedBlob, open_blob_reader
from upsert_core.persist.state.state import BlobPart, ErrorBatch, HollowBatch, InlinePart, Part
from upsert_core.persist.write.consolidate import UPDATE_SCHEMA, as_table, sort_updates

KEY_BYTES = 16
"""Length of an upsert key (an xxh3-128 digest)."""

DEFAULT_INLINE_THRESHOLD = 4096
"""Encoded parts up to this many bytes are kept inline in the state."""

DEFAULT_ROW_GROUP_ROWS = 64 * 1024
"""Rows per Parquet row group: the unit a reader decodes at a time."""

DEFAULT_PART_ROWS = 1024 * 1024
"""Rows per part when a large table is split (keeps parts, and rewrites of them, modest)."""

DEFAULT_BATCH_ROWS = 64 * 1024
"""Rows per record batch yielded by :func:`read_part`."""

VALUE_PREFIX = "v:"
"""Name prefix of a typed part's value columns."""

BUCKET_META = b"upsert.bucket"
CONSOLIDATED_META = b"upsert.consolidated"
FORMAT_META = b"upsert.format"

VALUES_ONLY_FORMAT = 3
"""The part format that stores each row once, as value columns (see the module docstring)."""

KNOWN_FORMATS = (1, 2, VALUES_ONLY_FORMAT)


@dataclass(frozen=True)
class PartLayout:
    """What a part's footer says beyond its updates (all empty for a plain part)."""

    values: tuple[pa.Field, ...] = ()
    """The value columns, named without :data:`VALUE_PREFIX`, in stored order."""
    bucket: tuple[int, int] | None = None
    """``(b, N)``: every key lies in bucket ``b`` of ``N`` (see the module docstring)."""
    consolidated: bool = False
    """No two rows share ``(key, row)`` and no ``diff`` is 0."""
    derived_rows: bool = False
    """Format 3: ``row`` is not stored but computed from the value columns."""

    def value_type(self, name: str) -> pa.DataType | None:
        for value in self.values:
            if value.name == name:
                return value.type
        return None


def value_table(
    table: pa.Table, fields: Sequence[pa.Field], prefix: str = VALUE_PREFIX
) -> pa.Table:
    """``fields`` taken from ``table``'s columns named ``prefix + name``; a field it lacks
    (a column added after the part was written) is null in every row."""
    columns = [
        table.column(prefix + f.name) if prefix + f.name in table.column_names
        else pa.nulls(table.num_rows, f.type)
        for f in fields
    ]
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def format_bucket(bucket: tuple[int, int]) -> str:
    return f"{bucket[0]}/{bucket[1]}"


def parse_bucket(text: str) -> tuple[int, int] | None:
    """``"b/N"`` as ``(b, N)``, or None when it is not a valid label."""
    head, sep, tail = text.partition("/")
    if not (sep and head.isdigit() and tail.isdigit() and head.isascii() and tail.isascii()):
        return None
    b, n = int(head), int(tail)
    return (b, n) if 0 <= b < n else None


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


def encode_parquet(table: pa.Table, row_group_rows: int = DEFAULT_ROW_GROUP_ROWS) -> memoryview:
    """``table`` as Parquet bytes (a read-only view of an Arrow buffer).

    The file is written into one buffer sized for the uncompressed table: only the
    pages written are ever touched, and nothing is copied as it grows (a growing
    stream reallocated and copied its whole content each time it doubled, and turning
    it into ``bytes`` copied it once more: a quarter of a 10M-row first load's page
    faults). A table whose file would not fit (never seen: values are stored plain or
    compressed) is written again into a growing stream."""
    capacity = table.nbytes + table.num_columns * 65536 + (1 << 20)
    target = pa.allocate_buffer(capacity)
    stream = pa.FixedSizeBufferWriter(target)
    try:
        _write_parquet(table, stream, row_group_rows)
    except (pa.ArrowInvalid, OSError):  # out of room
        sink = pa.BufferOutputStream()
        _write_parquet(table, sink, row_group_rows)
        return memoryview(sink.getvalue())
    return memoryview(target.slice(0, stream.tell()))


def _write_parquet(table: pa.Table, sink: pa.NativeFile, row_group_rows: int) -> None:
    # Keys and rows are nearly all distinct digests and encodings: a dictionary would be
    # tried and dropped, and their min/max statistics are never read. zstd shrinks the
    # encoded rows by a third where snappy barely does, and decodes no slower. Value
    # columns are written plain too: a dictionary tried on distinct strings costs the
    # writer more than it saves, and nothing reads their statistics.
    small = [n for n in table.column_names
             if n not in ("key", "row") and not n.startswith(VALUE_PREFIX)]
    pq.write_table(
        table, sink, row_group_size=max(1, row_group_rows), use_dictionary=small,
        write_statistics=small, compression="zstd",
    )


def _store(
    blob: Blob, key: str, data: bytes | memoryview, num: int, inline_threshold: int
) -> Part:
    if len(data) <= inline_threshold:
        return InlinePart(data=bytes(data), num_updates=num)
    blob.set(key, data)
    return BlobPart(key=key, encoded_size_bytes=len(data), num_updates=num)


def _with_values(table: pa.Table, values: pa.Table | None) -> pa.Table:
    """The updates with ``values`` appended as value columns (row ``i`` to row ``i``)."""
    if values is None:
        return table
    if values.num_rows != table.num_rows:
        raise InvalidUsage(
            f"value columns hold {values.num_rows} rows for {table.num_rows} updates"
        )
    if len(set(values.column_names)) != values.num_columns:
        raise InvalidUsage(f"value columns must have distinct names: {values.column_names}")
    for name, column in zip(values.column_names, values.columns, strict=True):
        table = table.append_column(pa.field(VALUE_PREFIX + name, column.type), column)
    return table


def _prepared(
    data: pa.Table | pa.RecordBatch, values: pa.Table | None, presorted: bool
) -> pa.Table:
    table = _with_values(conform_updates(data), values)
    return table if presorted else sort_updates(table)


def is_consolidated(table: pa.Table) -> bool:
    """Whether ``(key, row, ts)``-sorted ``table`` has no two rows sharing ``(key, row)``
    and no zero ``diff``."""
    n = table.num_rows
    if n and not pc.all(pc.not_equal(table.column("diff"), 0)).as_py():
        return False
    if n <= 1:
        return True
    keys, rows = table.column("key"), table.column("row")
    same = pc.and_(
        pc.equal(keys.slice(1), keys.slice(0, n - 1)),
        pc.equal(rows.slice(1), rows.slice(0, n - 1)),
    )
    return not pc.any(same).as_py()


def _write_prepared(
    blob: Blob, shard: str, table: pa.Table, bucket: tuple[int, int] | None,
    inline_threshold: int, row_group_rows: int, values_only: bool = False,
) -> Part:
    meta: dict[bytes, bytes] = {}
    if bucket is not None:
        if parse_bucket(format_bucket(bucket)) != bucket:
            raise InvalidUsage(f"bucket label {bucket} must be (b, N) with 0 <= b < N")
        meta[BUCKET_META] = format_bucket(bucket).encode()
        meta[CONSOLIDATED_META] = b"1" if is_consolidated(table) else b"0"
    if values_only:
        # The label above was computed from the rows; from here on they live only as
        # their values (the module docstring says why nothing is lost).
        meta[FORMAT_META] = str(VALUES_ONLY_FORMAT).encode()
        table = table.drop_columns(["row"])
    if meta:
        table = table.replace_schema_metadata(meta)
    encoded = encode_parquet(table, row_group_rows)
    return _store(blob, part_key(shard), encoded, table.num_rows, inline_threshold)


def write_part(
    blob: Blob,
    shard: str,
    data: pa.Table | pa.RecordBatch,
    *,
    inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
    presorted: bool = False,
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
    values: pa.Table | None = None,
    bucket: tuple[int, int] | None = None,
    values_only: bool = False,
) -> Part:
    """Write ``data`` as one batch part: inline when small, else a new blob.

    The updates are checked and sorted by ``(key, row, ts)`` (skip the sort with
    ``presorted=True`` when the caller guarantees the order). They are not
    consolidated: that is the writer's business (see ``consolidate``). ``values``
    (aligned with ``data``'s rows) become value columns and ``bucket`` the part's
    bucket label (see the module docstring); the caller vouches for both.
    ``values_only`` writes format 3: ``values`` must then be every row column, decoded
    from ``row`` (the caller vouches for it), and ``row`` is not stored.
    """
    _check_values_only(values, values_only)
    table = _prepared(data, values, presorted)
    return _write_prepared(
        blob, shard, table, bucket, inline_threshold, row_group_rows, values_only
    )


def write_insertions_part(
    blob: Blob,
    shard: str,
    keys: pa.Array,
    ts: int,
    values: pa.Table,
    *,
    bucket: tuple[int, int],
    inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
) -> Part:
    """One values-only (format 3) part inserting each of ``keys`` once at ``ts``, row
    ``i`` with row ``i`` of ``values`` (every row column, as stored): what
    :func:`write_part` writes for those insertions with ``values_only``, byte for byte,
    without the encoded rows it would drop. ``keys`` must be 16-byte digests in
    strictly increasing order (one insertion per key is consolidated whatever the
    rows), which is checked."""
    table = insertions_table(keys, ts, values, bucket=bucket)
    return store_insertions(blob, shard, table, inline_threshold=inline_threshold,
                            row_group_rows=row_group_rows)


def store_insertions(
    blob: Blob,
    shard: str,
    table: pa.Table,
    *,
    inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
) -> Part:
    """The part of :func:`insertions_table`'s ``table``, stored (see
    :func:`write_insertions_part`)."""
    encoded = encode_parquet(table, row_group_rows)
    return _store(blob, part_key(shard), encoded, table.num_rows, inline_threshold)


def insertions_table(
    keys: pa.Array, ts: int, values: pa.Table, *, bucket: tuple[int, int],
) -> pa.Table:
    """The table :func:`write_insertions_part` stores (checked as it says)."""
    _check_values_only(values, True)
    n = len(keys)
    keys = keys.cast(pa.binary())
    table = pa.table(
        [keys, pa.array(np.full(n, ts, np.int64)), pa.array(np.ones(n, np.int64))],
        names=["key", "ts", "diff"],
    )
    if n:
        lengths = pc.min_max(pc.binary_length(keys)).as_py()
        if lengths["min"] != KEY_BYTES or lengths["max"] != KEY_BYTES:
            raise InvalidUsage(f"batch part keys must be {KEY_BYTES} bytes")
        if n > 1 and not pc.all(pc.greater(keys.slice(1), keys.slice(0, n - 1))).as_py():
            raise InvalidUsage("an insertions part needs strictly increasing keys")
    table = _with_values(table, values)
    if parse_bucket(format_bucket(bucket)) != bucket:
        raise InvalidUsage(f"bucket label {bucket} must be (b, N) with 0 <= b < N")
    table = table.replace_schema_metadata({
        BUCKET_META: format_bucket(bucket).encode(),
        CONSOLIDATED_META: b"1",
        FORMAT_META: str(VALUES_ONLY_FORMAT).encode(),
    })
    return table


def _check_values_only(values: pa.Table | None, values_only: bool) -> None:
    if values_only and (values is None or values.num_columns == 0):
        raise InvalidUsage("a values-only part (format 3) needs the rows' value columns")


def write_parts(
    blob: Blob,
    shard: str,
    data: pa.Table | pa.RecordBatch,
    *,
    inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
    part_rows: int = DEFAULT_PART_ROWS,
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
    presorted: bool = False,
    values: pa.Table | None = None,
    bucket: tuple[int, int] | None = None,
    values_only: bool = False,
) -> tuple[Part, ...]:
    """Sort ``data`` and write it as parts of at most ``part_rows`` rows (none if empty);
    if a write fails, the parts already written are deleted before the error propagates.

    ``presorted=True`` skips the sort when the caller guarantees ``(key, row, ts)``
    order (the columnar drain emits its updates that way). ``values``, ``bucket`` and
    ``values_only`` as for :func:`write_part`."""
    _check_values_only(values, values_only)
    table = _prepared(data, values, presorted)
    step = max(1, part_rows)
    written: list[Part] = []
    try:
        for start in range(0, table.num_rows, step):
            written.append(_write_prepared(
                blob, shard, table.slice(start, step), bucket, inline_threshold,
                row_group_rows, values_only,
            ))
    except BaseException:
        delete_parts(blob, written)  # all or nothing: no state references them yet
        raise
    return tuple(written)


def write_batch(
    blob: Blob,
    shard: str,
    data: pa.Table | pa.RecordBatch,
    lower: int,
    upper: int,
    *,
    inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
    part_rows: int = DEFAULT_PART_ROWS,
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
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
        blob, shard, table, inline_threshold=inline_threshold, part_rows=part_rows,
        row_group_rows=row_group_rows,
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


def _decode_error(exc: BaseException, where: str) -> CorruptData:
    if isinstance(exc, FileNotFoundError):
        return CorruptData(f"{where} went missing from the blob store while being read: {exc}")
    return CorruptData(f"{where} cannot be decoded: {exc}")


class OpenPart:
    """A part opened for reading: its row groups can be decoded one at a time, in any
    order, and concurrently from several threads.

    Each concurrent decode uses its own reader of the blob (a file handle, an S3 reader;
    decoders never share one), opened on demand and reused; a blob store without ranged
    reads is fetched ONCE and shared in memory. Construction opens the first reader and
    checks the footer (schema, row count); :meth:`close` closes every reader.
    """

    def __init__(
        self, blob: Blob, part: Part, *, shard: str | None = None,
        schema: pa.Schema = UPDATE_SCHEMA,
    ) -> None:
        self.where = _describe(part, shard)
        self._blob = blob
        self._part = part
        self._key = part.key if isinstance(part, BlobPart) else None
        self._data: bytes | None = part.data if isinstance(part, InlinePart) else None
        if self._key is not None and not isinstance(blob, RangedBlob):
            self._data = self._fetch_all(self._key)
        self._lock = threading.Lock()
        # pyarrow BufferReaders (in-memory bytes) or blob readers; both are file-likes.
        self._readers: list[BlobReader] = []
        self._idle: list[pq.ParquetFile] = []
        self._columns: list[str] = list(schema.names)
        self.layout = PartLayout()
        first = self._new_file(None)
        try:
            self.metadata = self._check(first, schema)
        except BaseException:
            self.close()
            raise
        self._idle.append(first)

    @property
    def update_columns(self) -> list[str]:
        """The columns a reader of updates (or errors) reads: never the value columns."""
        return self._columns

    @property
    def num_row_groups(self) -> int:
        return int(self.metadata.num_row_groups)

    def _fetch_all(self, key: str) -> bytes:
        data = self._blob.get(key)
        if data is None:
            raise CorruptData(self._missing())
        return data

    def _missing(self) -> str:
        return f"{self.where} is referenced by the state but missing from the blob store"

    def _new_file(self, metadata: pq.FileMetaData | None) -> pq.ParquetFile:
        source: BlobReader | None
        if self._key is None or self._data is not None:
            source = pa.BufferReader(self._data)
        else:
            source = open_blob_reader(self._blob, self._key)
            if source is None:
                raise CorruptData(self._missing())
        with self._lock:
            self._readers.append(source)
        try:
            return pq.ParquetFile(source, metadata=metadata)
        except FileNotFoundError as exc:
            raise _decode_error(exc, self.where) from exc
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise CorruptData(f"{self.where} is not valid Parquet: {exc}") from exc

    def _check(self, parquet: pq.ParquetFile, schema: pa.Schema) -> pq.FileMetaData:
        actual = parquet.schema_arrow
        fmt = _format_of(actual, self.where)
        stored = schema
        if fmt == VALUES_ONLY_FORMAT and schema == UPDATE_SCHEMA:
            stored = STORED_VALUES_ONLY_SCHEMA
        width = len(stored)
        head = actual.names[:width], actual.types[:width]
        extra = actual.names[width:]
        if head != (stored.names, stored.types) or (
            extra and (schema != UPDATE_SCHEMA
                       or not all(n.startswith(VALUE_PREFIX) for n in extra))
        ) or (stored is STORED_VALUES_ONLY_SCHEMA and not extra):
            raise CorruptData(f"{self.where} has schema {actual}, expected {schema}")
        self.layout = self._layout(actual, derived_rows=stored is STORED_VALUES_ONLY_SCHEMA)
        self._schema = actual
        if self.layout.derived_rows:
            self._value_names = [n for n in actual.names if n.startswith(VALUE_PREFIX)]
        rows = parquet.metadata.num_rows
        if rows != self._part.num_updates:
            raise CorruptData(
                f"{self.where} holds {rows} rows but the state says {self._part.num_updates}"
            )
        return parquet.metadata

    def _layout(self, actual: pa.Schema, *, derived_rows: bool) -> PartLayout:
        return layout_of(actual, self.where, derived_rows=derived_rows)

    @property
    def num_rows(self) -> int:
        """The part's number of stored updates."""
        return int(self.metadata.num_rows)

    def read_row_group(
        self, index: int, *, use_threads: bool = False, columns: list[str] | None = None
    ) -> pa.Table:
        """Decode row group ``index``: the update (or error) columns, or ``columns``
        (stored names, e.g. value columns). Thread-safe: callers that decode several row
        groups at once (the read prefetcher) leave ``use_threads`` off, as extra
        per-column threads then only add overhead; a lone sequential reader turns it
        on to decode the columns in parallel."""
        with self._lock:
            parquet = self._idle.pop() if self._idle else None
        if parquet is None:
            parquet = self._new_file(self.metadata)
        wanted = self._columns if columns is None else columns
        try:
            if self.layout.derived_rows and "row" in wanted:
                return self._with_rows(parquet, index, wanted, use_threads)
            table = parquet.read_row_group(index, columns=wanted, use_threads=use_threads)
            return table.replace_schema_metadata(None)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise _decode_error(exc, self.where) from exc
        finally:
            with self._lock:
                self._idle.append(parquet)

    def _with_rows(
        self, parquet: pq.ParquetFile, index: int, wanted: list[str], use_threads: bool
    ) -> pa.Table:
        """Format 3: the ``wanted`` columns with ``row`` computed from the value columns
        (all of them, in stored order: the order the row was encoded with)."""
        stored = [n for n in wanted if n != "row"]
        read = stored + [n for n in self._value_names if n not in stored]
        table = parquet.read_row_group(index, columns=read, use_threads=use_threads)
        try:
            rows = rows_of_values([table.column(n) for n in self._value_names])
        except CodecError as exc:
            raise CorruptData(f"{self.where}: its values do not encode as rows: {exc}") from exc
        columns = [rows if n == "row" else table.column(n) for n in wanted]
        return pa.Table.from_arrays(columns, names=wanted)

    def read_whole(
        self, columns: list[str] | None = None, *, use_threads: bool = False
    ) -> pa.Table:
        """Every row group of the part, as :meth:`read_row_group` decodes them, in one
        table (for readers that hold a whole part: the typed snapshot, compaction)."""
        wanted = self._columns if columns is None else columns
        groups = [
            self.read_row_group(i, columns=wanted, use_threads=use_threads)
            for i in range(self.num_row_groups)
        ]
        if not groups:
            return pa.schema([
                UPDATE_SCHEMA.field(n) if n == "row" and self.layout.derived_rows
                else self._schema.field(n) for n in wanted
            ]).empty_table()
        return groups[0] if len(groups) == 1 else pa.concat_tables(groups)

    def close(self) -> None:
        """Close every reader (idempotent)."""
        with self._lock:
            readers, self._readers, self._idle = self._readers, [], []
        for reader in readers:
            reader.close()


def layout_of(schema: pa.Schema, where: str, *, derived_rows: bool) -> PartLayout:
    """What a part's schema (its footer's, or a decoded copy's) says beyond its updates;
    :class:`CorruptData` naming ``where`` for an invalid bucket label."""
    meta = schema.metadata or {}
    values = tuple(
        pa.field(f.name[len(VALUE_PREFIX):], f.type)
        for f in schema if f.name.startswith(VALUE_PREFIX)
    )
    label = meta.get(BUCKET_META)
    bucket = None
    if label is not None:
        bucket = parse_bucket(label.decode("ascii", errors="replace"))
        if bucket is None:
            raise CorruptData(f"{where} has an invalid bucket label {label!r}")
    return PartLayout(values, bucket, meta.get(CONSOLIDATED_META) == b"1", derived_rows)


class LoadedPart:
    """A format-3 part whose ``key``, ``diff`` and value columns are already decoded in
    memory (a local copy of a base blob, ``ingest.base_cache``), read as an
    :class:`OpenPart` is by a whole-part reader (the typed snapshot).

    Invariants: the table is checked as a footer is (``key`` binary and ``diff`` int64
    first, then only value columns, format 3, ``rows`` rows) or :class:`CorruptData` is
    raised; its layout comes from its schema metadata as a footer's does. A copy keeps
    no ``ts``: every row reads at ``ts`` (the caller's time for a run wholly at one
    time, such as a base). ``row`` is computed from the value columns, as for format 3.
    """

    def __init__(self, table: pa.Table, *, where: str, rows: int, ts: int) -> None:
        self.where = where
        schema = table.schema
        head = schema.names[:2], schema.types[:2]
        extra = schema.names[2:]
        if (
            head != (["key", "diff"], [pa.binary(), pa.int64()])
            or not extra or not all(n.startswith(VALUE_PREFIX) for n in extra)
            or _format_of(schema, where) != VALUES_ONLY_FORMAT
            or table.num_rows != rows
        ):
            raise CorruptData(
                f"{where} (a local copy) has {table.num_rows} rows of schema {schema},"
                f" expected {rows} rows of key, diff and value columns in format"
                f" {VALUES_ONLY_FORMAT}"
            )
        self.layout = layout_of(schema, where, derived_rows=True)
        self._table = table
        self._ts = ts
        self._value_names = extra

    @property
    def num_rows(self) -> int:
        return self._table.num_rows

    def read_whole(
        self, columns: list[str] | None = None, *, use_threads: bool = False
    ) -> pa.Table:
        """The ``columns`` (stored names, ``ts`` and ``row`` included) of every row."""
        del use_threads  # nothing to decode
        wanted = list(UPDATE_SCHEMA.names) if columns is None else columns
        arrays: list[pa.Array | pa.ChunkedArray] = []
        for name in wanted:
            if name == "ts":
                arrays.append(pa.repeat(pa.scalar(self._ts, pa.int64()), self.num_rows))
            elif name == "row":
                try:
                    arrays.append(rows_of_values(
                        [self._table.column(n) for n in self._value_names]
                    ))
                except CodecError as exc:
                    raise CorruptData(
                        f"{self.where}: its values do not encode as rows: {exc}"
                    ) from exc
            else:
                arrays.append(self._table.column(name))
        return pa.Table.from_arrays(arrays, names=wanted)

    def close(self) -> None:
        """Nothing to close (the table is released with the part)."""


STORED_VALUES_ONLY_SCHEMA = pa.schema(
    [f for f in UPDATE_SCHEMA if f.name != "row"]
)
"""The update columns a format-3 part stores (before its value columns)."""


def _format_of(schema: pa.Schema, where: str) -> int | None:
    """The part format its footer names (None: unlabelled, format 1 or 2); a format this
    release does not know is :class:`CorruptData` naming it."""
    label = (schema.metadata or {}).get(FORMAT_META)
    if label is None:
        return None
    text = label.decode("ascii", errors="replace")
    if not text.isdigit() or int(text) not in KNOWN_FORMATS:
        raise CorruptData(
            f"{where} is in part format {text!r}, which this release cannot read (it reads"
            f" formats {', '.join(map(str, KNOWN_FORMATS))}): upgrade every reader of the"
            " shard to the release that wrote it"
        )
    return int(text)


def rows_of_values(
    columns: Sequence[pa.Array | pa.ChunkedArray],
) -> pa.Array | pa.ChunkedArray:
    """The canonical encoded rows of value columns given in row-column order: row ``i``
    is ``encode_datums`` of its values with trailing nulls dropped (as
    ``landing.rows.encode_row``), byte for byte; vectorised where the codec can be, row
    by row otherwise. Over 2 GiB of output the rows come as a chunked array (one
    binary array cannot hold them)."""
    bulk = encode_columns(columns, drop_trailing_nulls=True)
    if bulk is not None:
        return bulk
    n = len(columns[0]) if columns else 0
    if n > 1:  # smaller pieces may each fit the vectorised encoder
        half = n // 2
        pieces: list[pa.Array] = []
        for piece in (rows_of_values([c.slice(0, half) for c in columns]),
                      rows_of_values([c.slice(half) for c in columns])):
            pieces.extend(piece.chunks if isinstance(piece, pa.ChunkedArray) else [piece])
        return pa.chunked_array(pieces, pa.binary())
    values = [c[i].as_py() for c in columns for i in range(n)]
    end = len(values)
    while end and values[end - 1] is None:
        end -= 1
    return pa.array([encode_datums(values[:end])] if n else [], pa.binary())


def _iter(
    blob: Blob, part: Part, schema: pa.Schema, shard: str | None, batch_rows: int
) -> Iterator[pa.RecordBatch]:
    """Open the part at the first ``next`` and decode it one row group at a time; the
    readers are closed when the iteration ends or the generator is closed."""
    opened = OpenPart(blob, part, shard=shard, schema=schema)
    try:
        for group in range(opened.num_row_groups):
            table = opened.read_row_group(group, use_threads=True)
            yield from table.to_batches(max_chunksize=max(1, batch_rows))
    finally:
        opened.close()


def read_part(
    blob: Blob,
    part: Part,
    *,
    shard: str | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> Iterator[pa.RecordBatch]:
    """The updates of a batch part, in ``(key, row, ts)`` order, batch by batch.

    Lazy: nothing is fetched before the first ``next``; then the part is opened with a
    ranged reader (:func:`~upsert_core.persist.location.open_blob_reader`) and only one
    row group is fetched and decoded at a time, so memory stays bounded by a row group
    however big the part. Raises :class:`CorruptData` for missing or undecodable parts,
    including a part that goes missing while it is read (its message says "missing").
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
