"""Debezium change events in Parquet files (``--envelope debezium``) -> the plain rows
validation already knows, column by column.

A row of the file is one event, its fields as columns: ``op`` (a string), ``before`` and
``after`` (structs of the table's columns, null where the event has none: ``before`` of a
create or snapshot read, ``after`` of a delete), ``source`` (a struct: ``lsn``, ``ts_ms``,
``file``, ``pos``, ...) and ``ts_ms``; others (``transaction``) are ignored. This is what
Kafka Connect's S3 sink writes with ``ParquetFormat`` (the Connect schema converted to
Avro, written by parquet-avro, which records that Avro schema in the footer as
``parquet.avro.schema``) and what a Flink or Spark job writing the envelope as Parquet
gives. The translation runs BEFORE validation, as for JSON Lines
(:mod:`~upsert_core.landing.debezium`), and follows the same rules event for event, so
a Parquet file of events gives the shard the equivalent JSON Lines file gives.

It is vectorised: masks and Arrow kernels over whole columns (a chunk of a streamed file,
``landing.chunks``, is translated like a file). Python runs per row only to word the
reason of an error row.

Invariants:

- Every row of the file is accounted for exactly once: a row of the batch (positions:
  its row number in the file, from 1), a :class:`RowError` (file, row, reason, the
  reasons of the JSON Lines path), or a skipped event (``op`` ``t`` or ``m``, counted).
  A Parquet file has no Kafka tombstones (the sink drops them).
- ``op`` ``c``, ``r``, ``u``: every field of ``after``; ``op`` ``d``: the key columns
  of ``before``; with the order value (stored in the rows, hidden from reads, as in
  :mod:`~upsert_core.landing.debezium`) and the delete marker as in JSON Lines. A null or
  unknown ``op``, a missing ``after`` (c/r/u) or ``before`` (d), a field of ``after``
  named like the order or the delete marker, an order that reaches a struct or a list,
  a value not of its logical type: an error row.
- The file's layout is checked once, and a wrong one is a file-level
  :class:`IngestError` naming the file and the column: an ``op`` that is not a string
  column, a ``before``/``after`` that is not a struct column, duplicate fields in one,
  a key column typed differently in ``before`` and ``after``.
- Logical types: Arrow types carry Connect's ``Timestamp``, ``Date`` and ``Decimal``
  (parquet-avro writes them as Parquet logical types). Debezium's own
  (``io.debezium.time.*``: integers or ISO-8601 strings on the wire) are read from the
  footer's Avro schema, where Kafka Connect's Avro converter names them
  (``connect.name``), exactly as JSON Lines reads them from the wrapper's ``schema``.
- Columns are in the order the JSON Lines path gives them (first appearance over the
  kept events: ``after``'s fields, or a delete's key columns first), so the shard's
  schema, and thus every encoded row, is the one the equivalent JSON Lines file makes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from upsert_core.errors import IngestError
from upsert_core.landing.batch import Column, RawBatch, RowError, SourceKind
from upsert_core.landing.chunks import parquet_chunks
from upsert_core.landing.debezium import (
    DELETE_MARKER,
    EPOCH,
    LOGICAL_TYPES,
    DebeziumBatch,
    Unreadable,
    logical_value,
    order_fields,
    order_names,
    short,
    translate_jsonl,
)
from upsert_core.landing.listing import LandingFile
from upsert_core.landing.missing import nulled, placeholder_mask
from upsert_core.landing.readers import read_parquet
from upsert_core.landing.schema import LogicalType, SourceSchema, logical_type_of

Mask = npt.NDArray[np.bool_]
Why = Callable[[int], str]
"""The reason of an error row, given its index."""

AVRO_SCHEMA_KEY = b"parquet.avro.schema"
"""The footer entry where parquet-avro writers (Kafka Connect's S3 sink) keep the Avro schema."""

_ROW_OPS = ("c", "r", "u")
_SKIPPED_OPS = ("t", "m")
# Python's calendar (years 1..9999), as microseconds and days since the epoch: a value
# outside it cannot be decoded once stored, and JSON Lines cannot read it either.
_MIN_US, _MAX_US = -62_135_596_800_000_000, 253_402_300_799_999_999
_MIN_DAY, _MAX_DAY = -719_162, 2_932_896
_INT_UNITS = {  # integer logical types: microseconds per unit (negative: units per us)
    "io.debezium.time.Timestamp": 1000,
    "org.apache.kafka.connect.data.Timestamp": 1000,
    "io.debezium.time.MicroTimestamp": 1,
    "io.debezium.time.NanoTimestamp": -1000,
}
_ZONED = "io.debezium.time.ZonedTimestamp"
# ISO-8601 as Debezium writes ZonedTimestamp; digits past the sixth only if zeros
# (Arrow's parser refuses them; JSON Lines reads them, zeros only).
_ZONED_RE = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6}0*)?(Z|[+-]\d\d:\d\d)$"


def read_debezium(
    file: LandingFile, schema: SourceSchema, placeholder: str | None = None
) -> DebeziumBatch:
    """One landing file of Debezium events, read whole: JSON Lines or Parquet (with a
    ``placeholder``: ``--missing keep``, see the translations)."""
    if file.suffix == ".jsonl":
        return translate_jsonl(file.name, file.read_bytes(), schema.key, schema.order_fields,
                               placeholder, schema.order_columns)
    if file.suffix == ".parquet":
        raw = read_parquet(file.name, file.read_bytes())
        return translate_parquet(raw, schema.key, schema.order_fields, placeholder,
                                 schema.order_columns)
    raise IngestError(
        f"{file.name}: --envelope debezium reads JSON Lines (.jsonl) and Parquet (.parquet)"
        " files only"
    )


def debezium_chunks(
    file: LandingFile, schema: SourceSchema, placeholder: str | None = None
) -> Iterator[DebeziumBatch]:
    """The events of a Parquet ``file`` read in chunks (``landing.chunks``), each chunk
    translated on its own: together exactly what :func:`read_debezium` gives, with the
    same row numbers (the column order of the first chunk with rows may differ only
    where the whole file's first kept event would order them otherwise, which no
    schema sees: validation appends each chunk's new columns in order)."""
    for raw in parquet_chunks(file):
        yield translate_parquet(raw, schema.key, schema.order_fields, placeholder,
                                schema.order_columns)


def translate_parquet(
    raw: RawBatch, key: tuple[str, ...], order: str | Sequence[str],
    placeholder: str | None = None, stored: Sequence[str] | None = None,
) -> DebeziumBatch:
    """The events of a Parquet file (or chunk) read as ``raw`` as plain rows; ``order``
    is the order's field, or its fields for an order of several, and ``stored`` the
    columns their values go to (as ``debezium.translate_jsonl``). With a ``placeholder``
    (``--missing keep``), placeholder values of ``after``'s value fields are made null
    before they are read as their logical type, and recorded in ``RawBatch.missing``."""
    order = order_fields(order)
    stored = order_names(order, stored)
    name, n = raw.file, raw.num_rows
    columns = {col: _plain(arr) for col, arr in raw.columns.items()
               if isinstance(arr, pa.Array)}
    connect = connect_logical_types(raw.metadata)
    reasons: dict[int, str] = {}

    def flag(mask: Mask, reason: str | None = None, *, why: Why | None = None) -> None:
        """Rows of ``mask`` not already errors get ``reason`` (or ``why(i)``)."""
        for i in np.flatnonzero(mask).tolist():
            if i not in reasons:
                reasons[i] = why(i) if why is not None else str(reason)

    op = _op_column(name, columns.get("op"), n)
    valid_op = _valid(op, n)
    is_row = _isin(op, _ROW_OPS, n)
    is_del = _isin(op, ("d",), n)
    is_skip = _isin(op, _SKIPPED_OPS, n)
    flag(~valid_op, "Debezium event has no 'op'")
    flag(valid_op & ~(is_row | is_del | is_skip),
         why=lambda i: f"Debezium event has an unknown op {_shown(op, i)}")
    events = ~is_skip  # every row but the skipped ones is a row or an error

    images: dict[str, pa.StructArray | None] = {}
    for side in ("after", "before"):
        images[side] = _image(name, columns.get(side), side, n)
    for side, wanted in (("after", is_row), ("before", is_del)):
        present = _valid(images[side], n)
        flag(wanted & ~present, why=_lacks(op, side))
    after, before = images["after"], images["before"]
    after_fields = [] if after is None else [f.name for f in after.type]
    for col in after_fields:
        if col in stored or col == DELETE_MARKER:
            what = "order" if col in stored else "delete marker"
            flag(is_row, f"field {col!r} of 'after' is named like the envelope's {what}")

    # Values: every field of ``after`` for c/r/u, the key columns of ``before`` for d,
    # each read as the logical type the footer gives it.
    values: dict[str, pa.Array] = {}
    unavailable: dict[str, Mask] = {}
    for col in after_fields:
        field = pc.struct_field(after, col)
        if placeholder is not None and col not in key:
            mask = placeholder_mask(field, placeholder)
            if mask is not None:
                unavailable[col] = mask
                field = nulled(field, mask)
        arr, bad, why = _logical(col, field, connect.get("after", {}).get(col))
        flag(is_row & bad, why=why)
        values[col] = arr
    key_values: dict[str, pa.Array] = {}
    before_fields = set() if before is None else {f.name for f in before.type}
    for col in key:
        if col in before_fields:
            arr, bad, why = _logical(col, pc.struct_field(before, col),
                                     connect.get("before", {}).get(col))
            flag(is_del & bad, why=why)
            key_values[col] = arr

    order_values = {column: _order_values(columns, path, n, events, flag)
                    for path, column in zip(order, stored, strict=True)}

    kept = np.flatnonzero((is_row & _valid(after, n)) | (is_del & _valid(before, n)))
    if reasons:
        kept = kept[~np.isin(kept, np.fromiter(reasons, np.int64, len(reasons)))]
    errors = sorted((RowError(name, int(raw.positions[i]), reason)
                     for i, reason in reasons.items()), key=lambda e: e.row)
    skipped = int(is_skip.sum())
    if not len(kept):
        empty = RawBatch(name, SourceKind.TYPED, {}, np.zeros(0, np.int64), errors)
        return DebeziumBatch(empty, skipped)

    take = pa.array(kept, pa.int64())
    deletes = is_del[kept]
    out: dict[str, Column] = {}
    for col in _column_order(after_fields, key, stored, bool(deletes[0]),
                             bool((~deletes).any())):
        if col in order_values:
            out[col] = order_values[col].take(take)
        elif col == DELETE_MARKER:
            out[col] = pa.array(deletes, pa.bool_())
        else:
            out[col] = _merged(name, col, values.get(col), key_values.get(col), take, deletes)
    batch = RawBatch(name, SourceKind.TYPED, out, raw.positions[kept], errors)
    batch.missing = {col: mask[kept] for col, mask in unavailable.items() if col in out}
    return DebeziumBatch(batch, skipped)


def _lacks(op: pa.Array | None, side: str) -> Why:
    return lambda i: f"Debezium event with op {_shown(op, i)} lacks {side!r}"


def _order_values(
    columns: Mapping[str, pa.Array], path: str, n: int, events: Mask,
    flag: Callable[..., None],
) -> pa.Array:
    """The values of the order field ``path`` (null where absent); an event whose field
    reaches a struct or a list is flagged and the column taken as null."""
    values = _reach(columns, path, n)
    if _nested(values.type):
        flag(events & _valid(values, n),
             why=lambda i: f"order {path!r} is not a number or a timestamp: "
                           f"{short(values[i].as_py())}")
        return pa.nulls(n, pa.int64())
    return values


def _column_order(
    after_fields: list[str], key: tuple[str, ...], order: tuple[str, ...], delete_first: bool,
    any_row: bool,
) -> list[str]:
    """The columns in order of first appearance over the kept events, as JSON Lines
    names them: an event's row is ``after``'s fields (c/r/u) or the key columns (d), then
    the order and the delete marker; the key, order and marker columns are always there."""
    names: dict[str, None] = {}
    images = [list(key), after_fields] if delete_first else [after_fields, list(key)]
    for image in images:
        if image is after_fields and not any_row:
            continue
        for col in image:
            names.setdefault(col, None)
        for path in order:
            names.setdefault(path, None)
        names.setdefault(DELETE_MARKER, None)
    for col in key:
        names.setdefault(col, None)
    return list(names)


def _merged(
    file: str, col: str, after: pa.Array | None, before: pa.Array | None, take: pa.Array,
    deletes: Mask,
) -> pa.Array:
    """Column ``col`` of the kept events: ``after``'s value for c/r/u, ``before``'s for d
    (null where an image has no such field)."""
    a = None if after is None else after.take(take)
    b = None if before is None else before.take(take)
    if a is None and b is None:
        return pa.nulls(len(take))
    if a is None or b is None:
        present = a if a is not None else b
        assert present is not None
        from_after = a is not None
        keep = ~deletes if from_after else deletes
        if keep.all():
            return present
        return pc.if_else(pa.array(keep), present, pa.scalar(None, present.type))
    if a.type != b.type:
        a, b = _same_type(file, col, a, b)
    return pc.if_else(pa.array(deletes), b, a)


def _same_type(file: str, col: str, a: pa.Array, b: pa.Array) -> tuple[pa.Array, pa.Array]:
    """``after``'s and ``before``'s values of key column ``col`` as one type: either
    one's, where both are of one column type (int32 and int64; a null column goes with
    anything) and the other's values cast to it without a change; else a file-level
    error naming the column."""
    try:
        alike = len({logical_type_of(a.type), logical_type_of(b.type)} - {None}) <= 1
    except TypeError:  # a nested type: validation refuses it as a column anyway
        alike = False
    if alike:
        for source, target in ((b, a.type), (a, b.type)):
            try:
                cast = source.cast(target)  # safe: refuses to change a value
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                continue
            return (a, cast) if source is b else (cast, b)
    raise IngestError(
        f"{file}: key column {col!r} has type {a.type} in 'after' but {b.type} in 'before'"
    )


# --- columns -------------------------------------------------------------------------


def _plain(arr: pa.Array) -> pa.Array:
    """``arr`` without dictionary encoding (kernels below compare values)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    return arr.dictionary_decode() if pa.types.is_dictionary(arr.type) else arr


def _valid(arr: pa.Array | None, n: int) -> Mask:
    if arr is None:
        return np.zeros(n, np.bool_)
    return np.asarray(pc.is_valid(arr).to_numpy(zero_copy_only=False), np.bool_)


def _isin(arr: pa.Array | None, values: tuple[str, ...], n: int) -> Mask:
    if arr is None:
        return np.zeros(n, np.bool_)
    found = pc.is_in(arr, value_set=pa.array(values, arr.type)).fill_null(False)
    return np.asarray(found.to_numpy(zero_copy_only=False), np.bool_)


def _shown(arr: pa.Array | None, i: int) -> str:
    try:
        return short(None if arr is None else arr[i].as_py())
    except (UnicodeDecodeError, ValueError):
        return "(not valid UTF-8)"


def _op_column(file: str, arr: pa.Array | None, n: int) -> pa.Array | None:
    if arr is None or pa.types.is_null(arr.type):
        return None
    t = arr.type
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return arr.cast(pa.string())
    if not pa.types.is_string(t):
        raise IngestError(
            f"{file}: column 'op' has type {t}: a Debezium event's op is a string"
        )
    return arr


def _image(file: str, arr: pa.Array | None, side: str, n: int) -> pa.StructArray | None:
    if arr is None or pa.types.is_null(arr.type):
        return None
    if not pa.types.is_struct(arr.type):
        raise IngestError(
            f"{file}: column {side!r} has type {arr.type}: Debezium's before and after are"
            " structs of the table's columns"
        )
    seen: set[str] = set()
    for f in arr.type:
        if f.name in seen:
            raise IngestError(f"{file}: column {side!r} has a duplicate field {f.name!r}")
        seen.add(f.name)
    return arr


def _nested(t: pa.DataType) -> bool:
    return pa.types.is_nested(t)


def _reach(columns: Mapping[str, pa.Array], path: str, n: int) -> pa.Array:
    """The values of the event field ``path`` names (a dot reaching inside a struct),
    nulls where it is absent; a field whose own name has the dots is taken first (as
    ``debezium._reach``)."""
    if path in columns:
        return columns[path]
    head, dot, rest = path.partition(".")
    inner = columns.get(head) if dot else None
    if inner is None or not pa.types.is_struct(inner.type):
        return pa.nulls(n, pa.int64())
    fields = {f.name: pc.struct_field(inner, f.name) for f in inner.type}
    return _reach(fields, rest, n)


# --- logical types -------------------------------------------------------------------

def _logical(
    col: str, arr: pa.Array, logical: tuple[str, Mapping[str, object]] | None
) -> tuple[pa.Array, Mask, Why | None]:
    """``arr`` read as its Debezium logical type (from the footer), the rows whose value
    does not read as it, and their reasons."""
    n = len(arr)
    none = np.zeros(n, np.bool_)
    if logical is None:
        return arr, none, None
    type_name, parameters = logical
    t = arr.type

    def why(i: int) -> str:
        return f"column {col!r}: cannot read {short(arr[i].as_py())} as {type_name}"

    target = LOGICAL_TYPES[type_name]
    if type_name in _INT_UNITS and pa.types.is_integer(t):
        result, bad = _int_timestamp(arr, _INT_UNITS[type_name])
    elif target is LogicalType.DATE and pa.types.is_integer(t):
        result, bad = _int_date(arr)
    elif type_name == _ZONED and (pa.types.is_string(t) or pa.types.is_large_string(t)):
        result, bad = _zoned(arr, type_name, parameters)
    else:  # already typed by Parquet (timestamp, date, decimal), or not as expected
        return arr, none, None
    return result, bad, why


def _int_timestamp(arr: pa.Array, unit: int) -> tuple[pa.Array, Mask]:
    raw = np.asarray(arr.cast(pa.int64()).fill_null(0).to_numpy(), np.int64)
    valid = _valid(arr, len(arr))
    if unit > 0:
        limit = np.iinfo(np.int64).max // unit
        fits = (raw >= -limit) & (raw <= limit)
        micros = np.where(fits, raw, 0) * unit
        bad = valid & ~fits
    else:
        micros, rest = np.divmod(raw, -unit)
        bad = valid & (rest != 0)
    bad |= valid & ((micros < _MIN_US) | (micros > _MAX_US))
    mask = ~valid | bad
    result = pa.array(np.where(mask, 0, micros), pa.int64(), mask=mask)
    return result.cast(pa.timestamp("us", tz="UTC")), bad


def _int_date(arr: pa.Array) -> tuple[pa.Array, Mask]:
    raw = np.asarray(arr.cast(pa.int64()).fill_null(0).to_numpy(), np.int64)
    valid = _valid(arr, len(arr))
    bad = valid & ((raw < _MIN_DAY) | (raw > _MAX_DAY))
    mask = ~valid | bad
    result = pa.array(np.where(mask, 0, raw).astype(np.int32), pa.int32(), mask=mask)
    return result.cast(pa.date32()), bad


def _zoned(
    arr: pa.Array, type_name: str, parameters: Mapping[str, object]
) -> tuple[pa.Array, Mask]:
    """ISO-8601 strings with a zone as UTC timestamps: the strict form Debezium writes
    in Arrow, anything else value by value as JSON Lines reads it."""
    n = len(arr)
    text = arr.cast(pa.string())
    strict = np.asarray(
        pc.match_substring_regex(text, _ZONED_RE).fill_null(False).to_numpy(
            zero_copy_only=False), np.bool_)
    valid = _valid(arr, n)
    out = pa.nulls(n, pa.timestamp("us", tz="UTC"))
    slow = valid & ~strict
    if strict.any():
        trimmed = pc.replace_substring_regex(text, r"(\.\d{6})0+", r"\1")
        chosen = pc.if_else(pa.array(strict), trimmed, pa.scalar(None, pa.string()))
        try:
            out = pc.cast(chosen, pa.timestamp("us", tz="UTC"))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            slow = valid  # an impossible date among them: decide each value
    values = out.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
    bad = valid & ~slow & ((values < _MIN_US) | (values > _MAX_US))
    if slow.any():
        micros = np.asarray(values, np.int64).copy()
        present = _valid(out, n) & ~slow
        for i in np.flatnonzero(slow).tolist():
            try:
                parsed = logical_value("", text[i].as_py(), type_name, parameters)
            except Unreadable:
                bad[i] = True
                continue
            delta = parsed - EPOCH  # type: ignore[operator]
            micros[i] = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
            present[i] = True
        mask = ~(present & ~bad)
        out = pa.array(np.where(mask, 0, micros), pa.int64(), mask=mask).cast(
            pa.timestamp("us", tz="UTC"))
    elif bad.any():
        out = pc.if_else(pa.array(bad), pa.scalar(None, out.type), out)
    return out, bad


def connect_logical_types(
    metadata: Mapping[bytes, bytes],
) -> dict[str, dict[str, tuple[str, Mapping[str, object]]]]:
    """``{"after"|"before": {field: (logical type name, parameters)}}`` for the fields
    the footer's Avro schema (``parquet.avro.schema``) gives a logical type that
    :data:`~upsert_core.landing.debezium.LOGICAL_TYPES` reads (Kafka Connect's Avro
    converter names them ``connect.name``); empty without one, or for one that does not
    parse."""
    text = metadata.get(AVRO_SCHEMA_KEY)
    if not text:
        return {}
    try:
        schema = json.loads(text)
    except ValueError:
        return {}
    named: dict[str, dict[str, object]] = {}
    _collect_named(schema, "", named)
    top = _record(schema, named)
    out: dict[str, dict[str, tuple[str, Mapping[str, object]]]] = {}
    if top is None:
        return out
    for entry in _list(top.get("fields")):
        if not isinstance(entry, dict) or entry.get("name") not in ("after", "before"):
            continue
        record = _record(entry.get("type"), named)
        if record is None:
            continue
        fields: dict[str, tuple[str, Mapping[str, object]]] = {}
        for field in _list(record.get("fields")):
            if not isinstance(field, dict) or not isinstance(field.get("name"), str):
                continue
            found = _connect_name(field.get("type"))
            if found is not None:
                fields[field["name"]] = found
        out[str(entry["name"])] = fields
    return out


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def _collect_named(node: object, namespace: str, named: dict[str, dict[str, object]]) -> None:
    """Every named record of an Avro schema, by name and by full name (a later use of a
    record is a reference by name: Debezium's ``after`` refers to ``before``'s)."""
    if isinstance(node, list):
        for item in node:
            _collect_named(item, namespace, named)
        return
    if not isinstance(node, dict):
        return
    if node.get("type") == "record" and isinstance(node.get("name"), str):
        space = node.get("namespace") if isinstance(node.get("namespace"), str) else namespace
        name = str(node["name"])
        full = name if "." in name or not space else f"{space}.{name}"
        named.setdefault(full, node)
        named.setdefault(full.rsplit(".", 1)[-1], node)
        namespace = full.rpartition(".")[0]
    for value in node.values():
        if isinstance(value, dict | list):
            _collect_named(value, namespace, named)


def _record(node: object, named: Mapping[str, dict[str, object]]) -> dict[str, object] | None:
    """The record an Avro type is (a union's non-null branch, a name resolved)."""
    if isinstance(node, list):
        branches = [b for b in node if b != "null"]
        return _record(branches[0], named) if len(branches) == 1 else None
    if isinstance(node, str):
        return named.get(node) or named.get(node.rsplit(".", 1)[-1])
    if isinstance(node, dict):
        if node.get("type") == "record":
            return node
        return _record(node.get("type"), named)
    return None


def _connect_name(node: object) -> tuple[str, Mapping[str, object]] | None:
    if isinstance(node, list):
        branches = [b for b in node if b != "null"]
        return _connect_name(branches[0]) if len(branches) == 1 else None
    if not isinstance(node, dict):
        return None
    name = node.get("connect.name")
    if isinstance(name, str) and name in LOGICAL_TYPES:
        parameters = node.get("connect.parameters")
        return name, parameters if isinstance(parameters, dict) else {}
    return None


__all__ = [
    "AVRO_SCHEMA_KEY",
    "connect_logical_types",
    "debezium_chunks",
    "read_debezium",
    "translate_parquet",
]
