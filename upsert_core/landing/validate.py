"""Validation of one batch file into rows ready for the upsert operator.

Given the shard's :class:`SourceSchema` and one file, produce a
:class:`ValidatedBatch`: the evolved schema, the good rows (upsert key, encoded row,
delete flag, order value, row number) and the bad rows as :class:`RowError`\\ s.

Invariants:

- Every row of the file is in exactly one of ``errors`` or the good rows, and both are
  in file order; ``positions`` are the 1-based row numbers of the good rows.
- Row-level problems exclude the row and never stop the file: a null (or
  unconvertible) key or order value, a value that does not convert to its column's
  type or is not represented exactly in it, a string that is not valid UTF-8 (in
  any column, key and delete marker included), a delete marker that is neither a
  boolean nor "true"/"false" (any case; null is false), a malformed JSON line, a
  value the codec cannot encode. A row with several
  problems yields one error whose reason lists them all.
- File-level problems raise :class:`IngestError` naming the file and return nothing:
  a missing key or order column in a file that has rows, an incompatible or
  unsupported column type, an unreadable file. A file without rows (a 0-byte JSON
  Lines file, a Parquet file with no rows) is an empty batch; its column types still
  count as the first appearance of its columns.
- Every good row decodes: no value reaches the codec that it cannot read back.
- Asked not to encode rows (``encode_rows=False``: the ingest's first file, whose
  buckets start empty), a batch whose typed values all certainly encode
  (``codec.encodes_in_bulk``) keeps them unencoded (``rows_deferred``); its keys,
  orders, errors and values are exactly those of the encoded batch. Otherwise the rows
  are encoded as always.
- ``orders`` are int64 for one order column: the order value itself, or microseconds
  since the epoch (UTC) for a timestamp order column. For an order of several columns
  they are order keys (``upsert_core.order_keys``: one comparable bytes value per row,
  in Arrow ``binary``), and a null in ANY of the columns makes the row a null-order
  error row.
- ``--missing keep`` (``missing``, :mod:`~upsert_core.landing.missing`): a placeholder
  value of a value column is null and marked missing, as are fields the reader found
  left out and columns the file does not have (``ValidatedBatch.missing``); a
  placeholder in a key or order column is a row-level problem. Without it nothing is
  marked and a placeholder is an ordinary string.
- Value checks (ranges, allowed values, ...; :mod:`~upsert_core.landing.value_checks`)
  run only on the rows that passed the checks above, on their converted values; a row
  failing one is an error like any other (reason ``value check <column> <check>
  failed``) and no row is reported twice. Rows whose delete marker is true are not
  value-checked (their values are never stored). Without value checks nothing runs.

Why not pandera: pandera validates a DataFrame against declared dtypes and checks,
but here the work is the *conversion* itself (JSON values by JSON type, CSV text by
parsing, Parquet by Arrow cast), with a per-cell failure mask that must keep row
numbers exact. Doing it in Arrow avoids a pandas copy of every file, keeps int64
columns with nulls exact (pandas would need nullable extension dtypes) and gives the
failing rows directly; a pandera schema on top would only re-check what the
conversion already guarantees. Pandera is used where it is strong: the per-source value
checks, declared, run on the converted columns once they exist.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from upsert_core import order_keys
from upsert_core.codec import (
    UPSERT_KEY_LEN,
    Datum,
    encode_columns_in_chunks,
    encode_datums,
    encodes_in_bulk,
    key_digest,
    key_digest_array,
)
from upsert_core.errors import CodecError, IngestError, LandingFileChanged, UpsertPlatformError
from upsert_core.landing.batch import Column, RawBatch, RowError
from upsert_core.landing.chunks import parquet_chunks
from upsert_core.landing.convert import (
    Conversion,
    convert,
    convert_deleted,
    describe,
    describe_bytes,
    file_type,
    split_invalid_utf8,
)
from upsert_core.landing.csv_chunks import csv_chunks
from upsert_core.landing.debezium import Envelope, parse_envelope
from upsert_core.landing.debezium_parquet import debezium_chunks, read_debezium
from upsert_core.landing.listing import LandingFile
from upsert_core.landing.missing import MissingPolicy, nulled, placeholder_mask
from upsert_core.landing.readers import read_batch
from upsert_core.landing.rows import encode_row
from upsert_core.landing.schema import ARROW_TYPES, LogicalType, SourceSchema
from upsert_core.landing.stream_types import StreamNotExact, StreamTypes
from upsert_core.landing.text_chunks import TEXT_STREAM_SUFFIXES, jsonl_chunks
from upsert_core.landing.value_checks import ValueCheck, value_check_problems
from upsert_core.order_keys import OrderArray

ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary(UPSERT_KEY_LEN)),
        ("row", pa.binary()),
        ("deleted", pa.bool_()),
        ("order", pa.int64()),
        ("position", pa.int64()),
    ]
)
ARROW_SCHEMA_ORDER_KEYS = ARROW_SCHEMA.set(
    ARROW_SCHEMA.get_field_index("order"), pa.field("order", pa.binary())
)
""":data:`ARROW_SCHEMA` of a shard whose order has several columns (order keys)."""


def arrow_schema(several_orders: bool) -> pa.Schema:
    """The good rows' Arrow schema: ``order`` int64, or binary order keys."""
    return ARROW_SCHEMA_ORDER_KEYS if several_orders else ARROW_SCHEMA


ERRORS_ARROW_SCHEMA = pa.schema(
    [("file", pa.string()), ("row", pa.int64()), ("reason", pa.string())]
)


@dataclass
class ValidatedBatch:
    """The good rows of one file, column-wise, plus its row errors."""

    file: str
    schema: SourceSchema
    key_values: list[bytes] | pa.FixedSizeBinaryArray = field(default_factory=list)
    """The upsert keys: the bulk path keeps them as one ``binary(16)`` Arrow array
    (``codec.key_digest_array``), the row-by-row path as bytes (see :attr:`keys`)."""
    row_values: list[bytes] | pa.BinaryArray = field(default_factory=list)
    deletes: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, np.bool_))
    orders: OrderArray = field(default_factory=lambda: np.zeros(0, np.int64))
    """int64, or order keys when ``schema`` has several order columns (empty batches of
    such a schema may hold an empty int64 array: nothing to compare)."""
    positions: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    errors: list[RowError] = field(default_factory=list)
    missing: npt.NDArray[np.bool_] | None = None
    """``--missing keep`` only: per good row, which of ``schema.names`` it leaves out
    (shape ``(rows, columns)``; ``landing.missing``); None with ``--missing null``."""
    values: pa.Table | None = None
    """The good rows' typed values (columns ``schema.names``, ``ARROW_TYPES``), row ``i``
    the values ``row_values[i]`` encodes; None when not kept (rows encoded one by one)."""
    skipped: int = 0
    """Debezium events that change nothing and are not error rows (``op`` ``t``/``m``)."""
    rows_deferred: bool = False
    """The rows were not encoded (validation asked not to, and each certainly encodes:
    ``codec.encodes_in_bulk``): ``row_values`` is all null and ``values`` holds the
    rows; ``ingest.tasks.with_encoded_rows`` encodes them where they are needed."""

    def __len__(self) -> int:
        return len(self.key_values)

    @property
    def keys(self) -> list[bytes]:
        """The upsert keys as bytes (made here from the Arrow array the bulk path keeps,
        which :meth:`to_arrow` uses as it is)."""
        if isinstance(self.key_values, pa.Array):
            return list(self.key_values.to_pylist())
        return self.key_values

    @property
    def rows(self) -> list[bytes]:
        """The encoded rows as bytes (the bulk encoder keeps them as one Arrow array,
        which :meth:`to_arrow` uses as it is)."""
        if isinstance(self.row_values, pa.Array):
            return list(self.row_values.to_pylist())
        return self.row_values

    @property
    def total_rows(self) -> int:
        """Rows in the file: good ones plus errors."""
        return len(self.key_values) + len(self.errors)

    def to_arrow(self) -> pa.RecordBatch:
        """The good rows as an Arrow record batch with :func:`arrow_schema`."""
        several = self.schema.several_orders
        orders = (order_keys.to_arrow(self.orders) if len(self.orders)
                  else pa.array([], arrow_schema(several).field("order").type))
        return pa.record_batch(
            [
                self.key_values if isinstance(self.key_values, pa.Array)
                else pa.array(self.key_values, type=pa.binary(UPSERT_KEY_LEN)),
                self.row_values if isinstance(self.row_values, pa.Array)
                else pa.array(self.row_values, type=pa.binary()),
                pa.array(self.deletes, type=pa.bool_()),
                orders,
                pa.array(self.positions, type=pa.int64()),
            ],
            schema=arrow_schema(several),
        )

    def errors_to_arrow(self) -> pa.RecordBatch:
        """The row errors as an Arrow record batch with :data:`ERRORS_ARROW_SCHEMA`."""
        return pa.record_batch(
            [
                pa.array([e.file for e in self.errors], type=pa.string()),
                pa.array([e.row for e in self.errors], type=pa.int64()),
                pa.array([e.reason for e in self.errors], type=pa.string()),
            ],
            schema=ERRORS_ARROW_SCHEMA,
        )


def validate_file(
    file: LandingFile,
    schema: SourceSchema,
    value_checks: tuple[ValueCheck, ...] = (),
    envelope: str = Envelope.PLAIN,
    missing: MissingPolicy | None = None,
    encode_rows: bool = True,
) -> ValidatedBatch:
    """Read and validate one landing file; with ``envelope`` ``debezium`` its events are
    first translated into plain rows (:mod:`~upsert_core.landing.debezium`). With
    ``missing`` (``--missing keep``) the batch marks the values its rows leave out.
    Without ``encode_rows`` rows that certainly encode are left unencoded
    (``ValidatedBatch.rows_deferred``)."""
    placeholder = None if missing is None else missing.placeholder
    if parse_envelope(envelope) is Envelope.DEBEZIUM:
        events = read_debezium(file, schema, placeholder)
        batch = validate_batch(events.raw, schema, value_checks, missing, encode_rows)
        batch.skipped = events.skipped
        return batch
    raw = read_batch(file, track_missing=missing is not None)
    return validate_batch(raw, schema, value_checks, missing, encode_rows)


def validate_chunks(
    file: LandingFile,
    schema: SourceSchema,
    value_checks: tuple[ValueCheck, ...] = (),
    envelope: str = Envelope.PLAIN,
    missing: MissingPolicy | None = None,
    encode_rows: bool = True,
) -> Iterator[ValidatedBatch]:
    """:func:`validate_file` for a Parquet file read in chunks (``landing.chunks``), or a
    plain JSON Lines or CSV file (:func:`validate_text_chunks`, which may raise
    :class:`StreamNotExact`): each
    chunk validated against the schema the one before left, its events first translated
    with ``envelope`` ``debezium`` (each batch's ``skipped`` counts its chunk's). Row
    numbers count over the whole file; a file-level problem raises from the chunk where
    it is found (the caller discards what it made of the earlier ones)."""
    if file.suffix in TEXT_STREAM_SUFFIXES and parse_envelope(envelope) is Envelope.PLAIN:
        yield from validate_text_chunks(file, schema, value_checks, missing, encode_rows)
        return
    if parse_envelope(envelope) is Envelope.DEBEZIUM:
        placeholder = None if missing is None else missing.placeholder
        for events in debezium_chunks(file, schema, placeholder):
            batch = validate_batch(events.raw, schema, value_checks, missing, encode_rows)
            batch.skipped = events.skipped
            schema = batch.schema
            yield batch
        return
    for raw in parquet_chunks(file):
        batch = validate_batch(raw, schema, value_checks, missing, encode_rows)
        schema = batch.schema
        yield batch


def validate_text_chunks(
    file: LandingFile,
    schema: SourceSchema,
    value_checks: tuple[ValueCheck, ...] = (),
    missing: MissingPolicy | None = None,
    encode_rows: bool = True,
    block_size: int | None = None,
    csv_block: int | None = None,
) -> Iterator[ValidatedBatch]:
    """:func:`validate_file` for a JSON Lines file read in blocks (``landing.text_chunks``;
    plain envelope) or a CSV file read in chunks (``landing.csv_chunks``): each chunk
    validated against the schema the one before left. ``block_size``: bytes per ranged
    read (``UPSERT_STREAM_BLOCK_BYTES``); ``csv_block``: Arrow's CSV block (tests only).

    Exact or refused: after the last chunk, the schema the whole file would leave
    (``landing.stream_types``) must be the one every chunk with rows was validated
    into, so each value was converted to the type the whole read gives it; otherwise,
    or when a chunk raises any platform error but ``LandingFileChanged`` (a file-level
    ``IngestError``, or the ``ConfigError`` of a value check that a chunk alone cannot
    apply: its column not yet seen, or typed otherwise so far),
    :class:`StreamNotExact` is raised and the caller reads the file whole, which
    raises the error again if the whole file has it too."""
    types = StreamTypes(schema, file.name)
    used: list[SourceSchema] = []
    try:
        chunks = (
            csv_chunks(file, block_size, arrow_block=csv_block)
            if file.suffix == ".csv"
            else jsonl_chunks(file, block_size, track_missing=missing is not None)
        )
        for raw in chunks:
            raw = types.align(raw)
            batch = validate_batch(raw, schema, value_checks, missing, encode_rows, types=types)
            schema = batch.schema
            if raw.num_rows:
                used.append(schema)
            yield batch
    except LandingFileChanged:
        raise
    except UpsertPlatformError as exc:
        # SUBTLE: not only IngestError: a value check raises ConfigError for what a
        # chunk alone has (a column first seen in a later chunk), not the file.
        raise StreamNotExact(f"{file.name}: {exc}") from exc
    try:
        whole = types.schema()
    except IngestError as exc:
        raise StreamNotExact(f"{file.name}: {exc}") from exc
    if not types.exact or schema != whole or any(s != whole for s in used):
        raise StreamNotExact(f"{file.name}: chunks typed the columns otherwise")


def validate_batch(
    raw: RawBatch,
    schema: SourceSchema,
    value_checks: tuple[ValueCheck, ...] = (),
    missing: MissingPolicy | None = None,
    encode_rows: bool = True,
    *,
    types: StreamTypes | None = None,
) -> ValidatedBatch:
    """Validate a read batch against ``schema``, then run ``value_checks`` on the rows
    that passed (:mod:`~upsert_core.landing.value_checks`); see the module docstring.
    With ``missing`` (``--missing keep``), placeholder values of value columns are
    nulls marked missing, beside the fields the reader found left out, and a
    placeholder in a key or order column makes an error row."""
    file, n = raw.file, raw.num_rows
    if raw.columns and n:
        for needed in (*schema.key, *schema.order_columns):
            if needed not in raw.columns:
                what = "order" if needed in schema.order_columns else "key"
                raise IngestError(f"{file}: missing {what} column {schema.label(needed)!r}")

    problems: dict[int, list[str]] = {}
    columns = dict(raw.columns)
    for name, col in raw.columns.items():
        cleaned, not_utf8 = split_invalid_utf8(col)
        if not_utf8 is not None:
            columns[name] = cleaned
            for i in np.flatnonzero(not_utf8).tolist():
                problems.setdefault(i, []).append(
                    f"column {schema.label(name)!r}: not valid UTF-8: {describe_bytes(col, i)}"
                )

    marks: dict[str, npt.NDArray[np.bool_]] = {}
    if missing is not None:
        columns, marks = _placeholders(raw, columns, schema, missing.placeholder, problems)

    batch_types: list[tuple[str, LogicalType | None]] = []
    done: dict[str, tuple[LogicalType, Conversion]] = {}
    for name, col in columns.items():
        if name == schema.deleted:
            continue
        if types is not None:
            types.add(name, col, raw.kind_of(name))
        current = schema.type_of(name)
        typ, conversion = file_type(
            col, raw.kind_of(name), schema.label(name), file, current, schema.role(name)
        )
        batch_types.append((name, typ))
        if typ is not None and conversion is not None:
            done[name] = (typ, conversion)
    schema = schema.evolve(batch_types, file)

    def flag(mask: npt.NDArray[np.bool_], reason: str) -> None:
        for i in np.flatnonzero(mask).tolist():
            problems.setdefault(i, []).append(reason)

    arrays: dict[str, pa.Array] = {}
    for name, typ in schema.columns:
        col = columns.get(name)
        if col is None:
            arrays[name] = pa.nulls(n, type=ARROW_TYPES[typ])
            continue
        cached = done.get(name)
        arr, bad = (
            cached[1] if cached and cached[0] is typ else convert(col, raw.kind_of(name), typ)
        )
        for i in np.flatnonzero(bad).tolist():
            problems.setdefault(i, []).append(
                f"column {schema.label(name)!r}: cannot convert {describe(col, i)} to {typ}"
            )
        arrays[name] = arr

    for name in (*schema.key, *schema.order_columns):
        role = "order" if name in schema.order_columns else "key"
        arr = arrays.get(name)
        if arr is None:  # in the file but null in every row, so never typed
            flag(np.ones(n, dtype=np.bool_), f"null {role} column {schema.label(name)!r}")
        else:
            # Unconvertible (and not UTF-8) values are null now too but were reported
            # above: the file's own column tells which values were really null.
            # A file without the column (rows, but no field of that name: ``{}``)
            # has it null in every row.
            was_valid = _valid_mask(raw.columns.get(name, [None] * n))
            flag(_null_mask(arr) & ~was_valid,
                 f"null {role} column {schema.label(name)!r}")

    deletes = np.zeros(n, dtype=np.bool_)
    marker = columns.get(schema.deleted)
    if marker is not None:
        deletes, bad_marker = convert_deleted(marker, raw.kind_of(schema.deleted))
        for i in np.flatnonzero(bad_marker).tolist():
            problems.setdefault(i, []).append(
                f"delete marker {schema.deleted!r} is not a boolean or 'true'/'false': "
                f"{describe(marker, i)}"
            )

    good = np.ones(n, dtype=np.bool_)
    if problems:
        good[list(problems)] = False
    left_out = None if missing is None else _missing_matrix(raw, schema, marks)
    if value_checks:
        failed = value_check_problems(
            file, schema, arrays, list(raw.columns), n, ~good | deletes, value_checks,
            None if left_out is None
            else {name: left_out[:, j] for j, name in enumerate(schema.names)},
        )
        if failed:
            problems.update(failed)
            good[list(failed)] = False
    errors = [
        RowError(file, int(raw.positions[i]), "; ".join(reasons)) for i, reasons in problems.items()
    ]
    good_idx = np.flatnonzero(good)
    if not len(good_idx):
        return ValidatedBatch(raw.file, schema, errors=sorted(errors + raw.errors, key=_row))

    out = _encode(raw, schema, arrays, good_idx, deletes, errors, encode_rows)
    out.errors = sorted(errors + raw.errors, key=_row)
    if left_out is not None:
        out.missing = left_out[_out_rows(raw, out)]
    return out


def _placeholders(
    raw: RawBatch,
    columns: dict[str, Column],
    schema: SourceSchema,
    placeholder: str,
    problems: dict[int, list[str]],
) -> tuple[dict[str, Column], dict[str, npt.NDArray[np.bool_]]]:
    """``--missing keep``: the columns with the value columns' placeholders made null,
    and per value column the rows that leave it out (the reader's marks and the
    placeholders); a placeholder in a key or order column is a problem of its row."""
    out = dict(columns)
    marks: dict[str, npt.NDArray[np.bool_]] = {}
    for name, col in columns.items():
        role = schema.role(name)
        if role == "deleted":
            continue
        found = placeholder_mask(col, placeholder)
        if found is not None and role != "value":
            for i in np.flatnonzero(found).tolist():
                problems.setdefault(i, []).append(
                    f"{role} column {schema.label(name)!r} holds the unavailable-value"
                    " placeholder "
                    f"{placeholder!r}"
                )
            continue
        if found is not None:
            out[name] = nulled(col, found)
        left_out = raw.missing.get(name)
        if role == "value" and found is not None:
            marks[name] = found if left_out is None else left_out | found
        elif role == "value" and left_out is not None:
            marks[name] = left_out
    return out, marks


def _missing_matrix(
    raw: RawBatch, schema: SourceSchema, marks: dict[str, npt.NDArray[np.bool_]]
) -> npt.NDArray[np.bool_]:
    """Per row of ``raw``, which of ``schema.names`` it leaves out: a value column the
    file does not have at all, or one its marks say (key and order columns never)."""
    n = raw.num_rows
    out = np.zeros((n, len(schema.names)), dtype=np.bool_)
    for j, name in enumerate(schema.names):
        if schema.role(name) != "value":
            continue
        if name not in raw.columns:
            out[:, j] = True
        elif name in marks:
            out[:, j] = marks[name]
    return out


def _out_rows(raw: RawBatch, batch: ValidatedBatch) -> npt.NDArray[np.intp]:
    """The index in ``raw`` of each good row of ``batch`` (its positions are a subset of
    ``raw``'s, both ascending)."""
    return np.searchsorted(raw.positions, batch.positions).astype(np.intp)


def _encode(
    raw: RawBatch,
    schema: SourceSchema,
    arrays: dict[str, pa.Array],
    good_idx: npt.NDArray[np.intp],
    deletes: npt.NDArray[np.bool_],
    errors: list[RowError],
    encode_rows: bool = True,
) -> ValidatedBatch:
    """Encode the good rows; a value the codec rejects turns its row into an error.
    Without ``encode_rows`` the rows are left unencoded where they certainly encode
    (``ValidatedBatch.rows_deferred``)."""
    if len(good_idx) == len(raw.positions):  # every row good: good_idx is 0..n-1
        taken = [arrays[name] for name in schema.names]
    else:
        take = pa.array(good_idx, type=pa.int64())
        taken = [pc.take(arrays[name], take) for name in schema.names]
    key_at = [schema.names.index(k) for k in schema.key]
    typed_ok = all(
        col.type == ARROW_TYPES[typ] for col, (_, typ) in zip(taken, schema.columns, strict=True)
    )
    if not encode_rows and typed_ok and encodes_in_bulk(taken):
        bulk_keys = encode_columns_in_chunks([taken[k] for k in key_at])
        if bulk_keys is not None:
            # The rows are left unencoded: every one would encode (encodes_in_bulk), and
            # the bucket step derives them from the values where it needs them.
            return ValidatedBatch(
                file=raw.file, schema=schema, key_values=key_digest_array(bulk_keys),
                row_values=pa.nulls(len(good_idx), pa.binary()),
                deletes=deletes[good_idx], positions=raw.positions[good_idx],
                orders=_orders(schema, arrays, pa.array(good_idx, type=pa.int64())),
                values=pa.table(taken, names=list(schema.names)), rows_deferred=True,
            )
    keys: list[bytes] | pa.FixedSizeBinaryArray = []
    rows: list[bytes] | pa.BinaryArray = []
    kept: list[int] = []
    bulk_rows = encode_columns_in_chunks(taken, drop_trailing_nulls=True)
    bulk_keys = None if bulk_rows is None else encode_columns_in_chunks(
        [taken[k] for k in key_at])
    if bulk_rows is not None and bulk_keys is not None:
        # The vectorised encoder is byte-identical to the per-row one and declines
        # (None) whenever a value might not encode, so no row can fail here.
        keys = key_digest_array(bulk_keys)
        rows = bulk_rows
        kept = list(range(len(good_idx)))
    else:
        key_list: list[bytes] = []
        row_list: list[bytes] = []
        keys, rows = key_list, row_list
        columns = [_python_values(col) for col in taken]
        for j, values in enumerate(zip(*columns, strict=True)):
            try:
                key = key_digest(encode_datums([values[k] for k in key_at]))
                row = encode_row(values)
            except CodecError as exc:
                i = int(good_idx[j])
                errors.append(
                    RowError(raw.file, int(raw.positions[i]), f"cannot encode row: {exc}")
                )
                continue
            key_list.append(key)
            row_list.append(row)
            kept.append(j)
    keep = good_idx if len(kept) == len(good_idx) else good_idx[kept]

    orders = _orders(schema, arrays, pa.array(keep, type=pa.int64()))
    typed = None
    if bulk_rows is not None and typed_ok:
        typed = pa.table(taken, names=list(schema.names))
    return ValidatedBatch(
        file=raw.file,
        schema=schema,
        key_values=keys,
        row_values=rows,
        deletes=deletes[keep],
        orders=orders,
        positions=raw.positions[keep],
        values=typed,
    )


def _orders(schema: SourceSchema, arrays: dict[str, pa.Array], keep: pa.Array) -> OrderArray:
    """The kept rows' orders: int64 for one order column, order keys for several."""
    if schema.several_orders:
        return order_keys.order_keys(
            [pc.take(arrays[name], keep) for name in schema.order_columns])
    order = arrays[schema.order_columns[0]]
    if schema.type_of(schema.order_columns[0]) is LogicalType.TIMESTAMP:
        order = pc.cast(order, pa.int64())
    values = pc.take(order, keep)
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.int64)


def _python_values(arr: pa.Array) -> Sequence[Datum]:
    """Codec-ready Python values of one column (timestamps as naive UTC datetimes)."""
    if pa.types.is_timestamp(arr.type):
        arr = pc.cast(arr, pa.timestamp("us"))
    values: list[Datum] = arr.to_pylist()
    return values


def _null_mask(arr: pa.Array) -> npt.NDArray[np.bool_]:
    return np.asarray(pc.is_null(arr).to_numpy(zero_copy_only=False), dtype=np.bool_)


def _valid_mask(col: Column) -> npt.NDArray[np.bool_]:
    """Entries that are non-null in the file."""
    if isinstance(col, list):
        return np.fromiter((v is not None for v in col), dtype=np.bool_, count=len(col))
    return np.asarray(pc.is_valid(col).to_numpy(zero_copy_only=False), dtype=np.bool_)


def _row(error: RowError) -> int:
    return error.row
