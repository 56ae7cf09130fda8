"""Debezium change events (``--envelope debezium``): one JSON Lines file of events ->
the plain rows validation already knows (a :class:`RawBatch`). Parquet files of events:
:mod:`~upsert_core.landing.debezium_parquet`, which follows this module's rules.

Each line is an event object, or Kafka Connect's wrapper ``{"schema": ..., "payload":
EVENT}`` (both keys, ``schema`` possibly null, as JsonConverter with
``schemas.enable=true`` writes and requires it). A line ``{"payload": ...}`` without
``schema`` is neither: JsonConverter refuses it with ``schemas.enable=true`` and takes
the whole object as the value without it, so it is an error row saying so, never
unwrapped (a converter or tool that dropped the schema may have changed more). The
translation runs BEFORE validation, so row numbers, error rows, typing and
the upsert semantics are the plain path's, unchanged.

Invariants:

- Every line of the file is accounted for exactly once: a row (positions: its line
  number), a :class:`RowError` (file, line number, reason), a skipped event (``op``
  ``t`` or ``m``: counted in ``skipped``, not an error) or a tombstone (a line ``null``,
  or a wrapper whose payload is null: nothing at all). Blank lines are skipped but
  counted, as in plain JSON Lines.
- ``op`` ``c``, ``r``, ``u``: the row is ``after`` (every field of it, a field named
  ``__deleted`` included: it is an ordinary column), with the order value and the
  delete marker false. ``op`` ``d``: only the key columns, read from ``before``, with the
  order value and the delete marker true.
- The delete marker column is :data:`DELETE_MARKER`, a name the translation alone
  writes: a field of ``after``/``before`` of that name, or named like an order column,
  is an error row, never confused with the envelope's own columns.
- The order value is the event field the order names, a dot reaching inside
  (``source.lsn``, ``ts_ms``); it is a column of the batch, like a plain file's order
  column, and so is stored in the shard's rows (the global scope's rebuild reads a
  key's order back from its row). The column is the shard's stored order column
  (``SourceSchema.order_columns``): for a shard created since the order got reserved
  names, ``(debezium order) ts_ms`` (``landing.schema.ENVELOPE_ORDER_PREFIX``), which
  no table has, so a field ``ts_ms`` of ``after`` is an ordinary column beside it; for
  a shard created before, the field's own name, exactly as then (so there a field of
  ``after`` named like the order is still an error row). An order of several fields
  (``source.file,source.pos,source.row``) gives one such column per field, each read
  the same way. Stored, but not a column of the shard: the shard's columns are
  ``after``'s (CONTRACT.md), so every read hides the order columns of a Debezium shard
  (``ShardOptions.hidden_columns``, applied once for all reads by
  :mod:`upsert_core.row_view`), and an event that changes only the order changes no row
  a read shows.
- The key and order columns are in the batch whenever it has rows, so a missing key or
  order in an event is a null key or order (an error row from validation), never a
  file-level "missing column".
- Where the wrapper's ``schema`` gives a field of ``after``/``before`` a logical type
  (:data:`LOGICAL_TYPES`), its value is read as that type and the column is a typed
  (Arrow) column of the batch; every other column holds the JSON values, typed by the
  JSON Lines rules. A value that does not read as its logical type (not exactly), or a
  non-null value without a logical type in a column other events give one (or another
  one), is an error row.
- ``Decimal`` has no column type here: it is read as float64 when the float reads back
  as the same decimal at its scale (as Parquet decimals are), else it is an error row.
- With a placeholder (``--missing keep``), a field the wrapper's ``schema`` types
  ``bytes`` (no logical type) whose value is the base64 of the placeholder's UTF-8 bytes
  holds the placeholder: Debezium puts its sentinel into a binary column as bytes, and
  JsonConverter writes bytes as base64. It is then the placeholder string, so it is
  marked (a value column) or refused (a key) exactly as the string is. Any other value
  of such a field stays its base64 text, as before.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import pyarrow as pa

from upsert_core.errors import ConfigError
from upsert_core.landing.batch import Column, RawBatch, RowError, SourceKind, is_utf8
from upsert_core.landing.readers import json_lines
from upsert_core.landing.schema import ARROW_TYPES, LogicalType


class Envelope(StrEnum):
    """How a batch file's rows are laid out (``--envelope``)."""

    PLAIN = "plain"
    DEBEZIUM = "debezium"


def parse_envelope(value: str | Envelope) -> Envelope:
    """An envelope given as ``plain`` or ``debezium`` (any case, spaces around)."""
    if isinstance(value, Envelope):
        return value
    try:
        return Envelope(value.strip().lower())
    except ValueError:
        raise ConfigError(f"--envelope must be 'plain' or 'debezium', got {value!r}") from None


DEFAULT_ORDER = "source.lsn"
DELETE_MARKER = "(debezium delete)"
"""The delete-marker column of a Debezium shard's schema; only the envelope sets it."""

_PAYLOAD_WITHOUT_SCHEMA = (
    "a line with 'payload' but no 'schema' is neither a Debezium event nor Kafka Connect's"
    " wrapper (JsonConverter with schemas.enable=true writes both 'schema' and 'payload';"
    " with schemas.enable=false the line is the event itself)"
)
_ROW_OPS = frozenset({"c", "r", "u"})
_SKIPPED_OPS = frozenset({"t", "m"})

LOGICAL_TYPES: dict[str, LogicalType] = {
    "io.debezium.time.Date": LogicalType.DATE,
    "io.debezium.time.Timestamp": LogicalType.TIMESTAMP,
    "io.debezium.time.MicroTimestamp": LogicalType.TIMESTAMP,
    "io.debezium.time.NanoTimestamp": LogicalType.TIMESTAMP,
    "io.debezium.time.ZonedTimestamp": LogicalType.TIMESTAMP,
    "org.apache.kafka.connect.data.Timestamp": LogicalType.TIMESTAMP,
    "org.apache.kafka.connect.data.Date": LogicalType.DATE,
    "org.apache.kafka.connect.data.Decimal": LogicalType.FLOAT64,
}
"""The logical types read, and the column type each lands in."""

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_EPOCH_DATE = dt.date(1970, 1, 1)
_MICROS_PER = {
    "io.debezium.time.Timestamp": 1000,
    "org.apache.kafka.connect.data.Timestamp": 1000,
    "io.debezium.time.MicroTimestamp": 1,
}


@dataclass
class DebeziumBatch:
    """One file's events as plain rows (``raw``), and the events skipped (``t``/``m``)."""

    raw: RawBatch
    skipped: int = 0


class Unreadable(ValueError):
    """A value that does not read as its logical type."""


def order_fields(order: str | Sequence[str]) -> tuple[str, ...]:
    """The event fields an order names (one, or several for an order of several)."""
    return (order,) if isinstance(order, str) else tuple(order)


def order_names(order: tuple[str, ...], stored: Sequence[str] | None) -> tuple[str, ...]:
    """The columns the order's fields are written to: ``stored`` (the shard's
    ``SourceSchema.order_columns``, one per field), or the fields' own names."""
    if stored is None:
        return order
    names = tuple(stored)
    if len(names) != len(order):
        raise ValueError(f"order fields {order} and stored columns {names} do not pair up")
    return names


def translate_jsonl(
    name: str, data: bytes, key: tuple[str, ...], order: str | Sequence[str],
    placeholder: str | None = None, stored: Sequence[str] | None = None,
) -> DebeziumBatch:
    """The events of a JSON Lines file as plain rows (module docstring); ``order`` is
    the order's field, or its fields for an order of several, and ``stored`` the
    columns their values go to (default: the fields' names; see :func:`order_names`).
    With a ``placeholder`` (``--missing keep``), the rows' left-out fields and
    placeholder values of ``after`` (key columns apart) are recorded in
    ``RawBatch.missing``, the values made null."""
    order = order_fields(order)
    stored = order_names(order, stored)
    errors: list[RowError] = []
    skipped = 0
    rows: list[tuple[int, dict[str, object], dict[str, str]]] = []
    unavailable: dict[int, set[str]] = {}
    schemas = _LastFieldSchemas()
    for number, line in json_lines(name, data, errors, reuse_wrapper_schema=True):
        try:
            event = _translate(line, key, order, placeholder, schemas, stored)
        except Unreadable as exc:
            errors.append(RowError(name, number, str(exc)))
            continue
        if event is None:
            continue
        if isinstance(event, str):  # "skipped"
            skipped += 1
            continue
        row, types = event
        if placeholder is not None:
            gone = {c for c, v in row.items()
                    if v == placeholder and isinstance(v, str) and c not in key
                    and c not in stored and c != DELETE_MARKER}
            if gone:
                unavailable[number] = gone
                for col in gone:
                    row[col] = None
                    types.pop(col, None)
        rows.append((number, row, types))

    # A column is typed by the logical type the first event naming one gives it.
    logical: dict[str, str] = {}
    for _, _, types in rows:
        for col, type_name in types.items():
            logical.setdefault(col, type_name)
    kept: list[tuple[int, dict[str, object]]] = []
    for number, row, types in rows:
        problem = _mismatch(row, types, logical)
        if problem is not None:
            errors.append(RowError(name, number, problem))
            continue
        kept.append((number, row))

    names: dict[str, None] = {}
    for _, row in kept:
        for col in row:
            names.setdefault(col, None)
    if kept:
        for col in (*key, *stored, DELETE_MARKER):
            names.setdefault(col, None)
    columns: dict[str, Column] = {}
    kinds: dict[str, SourceKind] = {}
    for col in names:
        values = [row.get(col) for _, row in kept]
        if col in logical:
            columns[col] = pa.array(values, type=ARROW_TYPES[LOGICAL_TYPES[logical[col]]])
            kinds[col] = SourceKind.TYPED
        else:
            columns[col] = values
    positions = np.array([number for number, _ in kept], dtype=np.int64)
    errors.sort(key=lambda e: e.row)
    raw = RawBatch(name, SourceKind.JSON, columns, positions, errors, column_kinds=kinds)
    if placeholder is not None:
        none: set[str] = set()
        raw.missing = {
            col: np.fromiter(
                (col not in row or col in unavailable.get(number, none) for number, row in kept),
                np.bool_, len(kept))
            for col in names
        }
    return DebeziumBatch(raw, skipped)


def _mismatch(row: dict[str, object], types: dict[str, str], logical: dict[str, str]) -> str | None:
    """Why ``row`` does not fit the file's typed columns (None: it does)."""
    for col, value in row.items():
        want = logical.get(col)
        if want is None or value is None:
            continue
        have = types.get(col)
        if have is None or LOGICAL_TYPES[have] is not LOGICAL_TYPES[want]:
            what = "a value without a logical type" if have is None else have
            return f"column {col!r}: {what} where other events give it {want}"
    return None


def _translate(
    line: object, key: tuple[str, ...], order: tuple[str, ...], placeholder: str | None = None,
    field_schemas_of: Callable[[object], FieldSchemas] | None = None,
    stored: tuple[str, ...] | None = None,
) -> tuple[dict[str, object], dict[str, str]] | str | None:
    """One line -> (row, {column: logical type name}), ``"skipped"``, or None (a
    tombstone); raises :class:`Unreadable` for an error row. A ``placeholder`` value of
    a value column is not read as its logical type (the caller marks it missing).
    ``field_schemas_of``: :func:`_field_schemas`, or a cache of it. ``stored``: the
    columns the order's fields go to (:func:`order_names`)."""
    stored = order if stored is None else stored
    if line is None:
        return None
    field_schemas: Mapping[str, object] = {}
    event = line
    if isinstance(line, dict) and set(line) == {"payload"}:
        raise Unreadable(_PAYLOAD_WITHOUT_SCHEMA)
    if isinstance(line, dict) and set(line) == {"schema", "payload"}:
        event = line["payload"]
        if event is None:
            return None  # the wrapper of a Kafka tombstone
        field_schemas = (field_schemas_of or _field_schemas)(line.get("schema"))
    if not isinstance(event, dict):
        raise Unreadable(f"Debezium event is not an object (got {type(event).__name__})")
    if "op" not in event or event["op"] is None:
        raise Unreadable("Debezium event has no 'op'")
    op = event["op"]
    if not isinstance(op, str):  # a list or object is no op (and not hashable)
        raise Unreadable(f"Debezium event has an unknown op {short(op)}")
    if op in _SKIPPED_OPS:
        return "skipped"
    if op not in _ROW_OPS and op != "d":
        raise Unreadable(f"Debezium event has an unknown op {short(op)}")
    side = "after" if op in _ROW_OPS else "before"
    image = event.get(side)
    if not isinstance(image, dict):
        raise Unreadable(f"Debezium event with op {op!r} lacks {side!r}")
    if op == "d":
        image = {col: image.get(col) for col in key}
    row: dict[str, object] = {}
    types: dict[str, str] = {}
    schemas = field_schemas.get(side)
    fields = schemas if isinstance(schemas, dict) else {}
    for col, value in image.items():
        if not is_utf8(col):
            raise Unreadable(f"malformed JSON line: a field of {side!r} is not UTF-8")
        if col in stored or col == DELETE_MARKER:
            raise Unreadable(
                f"field {col!r} of {side!r} is named like the envelope's "
                + ("order" if col in stored else "delete marker")
            )
        type_name, parameters = fields.get(col, (None, {}))
        if type_name == CONNECT_BYTES:
            type_name = None  # read as JSON Lines reads it: the base64 text
            if placeholder is not None and value == _base64(placeholder):
                value = placeholder  # Debezium's sentinel for a binary column
        unavailable = placeholder is not None and value == placeholder and col not in key
        if type_name is not None and value is not None and not unavailable:
            row[col] = logical_value(col, value, type_name, parameters)
            types[col] = type_name
        else:
            row[col] = value
    for path, column in zip(order, stored, strict=True):
        order_value = _reach(event, path)
        if isinstance(order_value, dict | list):
            raise Unreadable(
                f"order {path!r} is not a number or a timestamp: {short(order_value)}")
        row[column] = order_value
    row[DELETE_MARKER] = op == "d"
    return row, types


def _reach(event: Mapping[str, object], path: str) -> object:
    """The field ``path`` names in ``event`` (a dot reaching inside); None if absent.
    A field whose own name has the dots (``{"source.lsn": 1}``) is taken first."""
    if path in event:
        return event[path]
    head, dot, rest = path.partition(".")
    inner = event.get(head) if dot else None
    return _reach(inner, rest) if isinstance(inner, dict) else None


FieldSchemas = dict[str, dict[str, tuple[str, Mapping[str, object]]]]

CONNECT_BYTES = "bytes"
"""In :data:`FieldSchemas`, a field of Kafka Connect's ``bytes`` type with no logical
type read here (a ``bytea``/``BLOB`` column with Debezium's default
``binary.handling.mode=bytes``): JsonConverter writes its values as base64 text."""


@functools.lru_cache(maxsize=8)
def _base64(placeholder: str) -> str:
    """How JsonConverter writes the placeholder Debezium puts into a binary column (its
    UTF-8 bytes, ``unavailable.value.placeholder``): standard base64 with padding."""
    return base64.b64encode(placeholder.encode("utf-8")).decode("ascii")


def _field_schemas(schema: object) -> FieldSchemas:
    """``{"after"|"before": {field: (logical type name, parameters)}}`` for the fields
    the Kafka Connect ``schema`` gives a logical type this module reads, and
    ``(CONNECT_BYTES, {})`` for its other ``bytes`` fields."""
    out: FieldSchemas = {}
    if not isinstance(schema, dict) or not isinstance(schema.get("fields"), list):
        return out
    for side in schema["fields"]:
        if not isinstance(side, dict) or side.get("field") not in ("after", "before"):
            continue
        fields: dict[str, tuple[str, Mapping[str, object]]] = {}
        for entry in side.get("fields") or ():
            if not isinstance(entry, dict):
                continue
            type_name, col = entry.get("name"), entry.get("field")
            if isinstance(col, str) and type_name in LOGICAL_TYPES:
                parameters = entry.get("parameters")
                fields[col] = (str(type_name), parameters if isinstance(parameters, dict) else {})
            elif isinstance(col, str) and entry.get("type") == CONNECT_BYTES:
                fields[col] = (CONNECT_BYTES, {})
        out[str(side["field"])] = fields
    return out


class _LastFieldSchemas:
    """:func:`_field_schemas` of the last ``schema`` object, read again only for another
    object: ``json_lines(..., reuse_wrapper_schema=True)`` gives the lines of a Connect
    file one shared schema object, never changed (it holds a reference, so ``is`` cannot
    match a new object at a freed one's address). The result is only read."""

    def __init__(self) -> None:
        self._schema: object = object()
        self._fields: FieldSchemas = {}

    def __call__(self, schema: object) -> FieldSchemas:
        if schema is not self._schema:
            self._fields = _field_schemas(schema)
            self._schema = schema
        return self._fields


def logical_value(
    col: str, value: object, type_name: str, parameters: Mapping[str, object]
) -> object:
    try:
        return _read_logical(value, type_name, parameters)
    except (Unreadable, ValueError, OverflowError, ArithmeticError, binascii.Error):
        raise Unreadable(
            f"column {col!r}: cannot read {short(value)} as {type_name}"
        ) from None


def _read_logical(value: object, type_name: str, parameters: Mapping[str, object]) -> object:
    target = LOGICAL_TYPES[type_name]
    if target is LogicalType.FLOAT64:
        return _decimal(value, parameters)
    if type_name == "io.debezium.time.ZonedTimestamp":
        if not isinstance(value, str):
            raise Unreadable(type_name)
        text = value.strip()
        fraction = _FRACTION.search(text)
        if fraction is not None and fraction.group(1)[6:].strip("0"):
            # Python keeps six fraction digits and would drop the rest silently; a
            # value this column cannot hold exactly is not read (an error row).
            raise Unreadable(type_name)
        parsed = dt.datetime.fromisoformat(_trim_fraction(text).replace("Z", "+00:00"))
        if parsed.tzinfo is None:
            raise Unreadable(type_name)
        return parsed.astimezone(dt.UTC)
    if type(value) is not int:
        raise Unreadable(type_name)
    if target is LogicalType.DATE:
        return _EPOCH_DATE + dt.timedelta(days=value)
    if type_name == "io.debezium.time.NanoTimestamp":
        micros, rest = divmod(value, 1000)
        if rest:
            raise Unreadable(type_name)  # not a whole number of microseconds
    else:
        micros = value * _MICROS_PER[type_name]
    return EPOCH + dt.timedelta(microseconds=micros)


_FRACTION = re.compile(r"T\d\d:\d\d:\d\d[.,](\d+)")


def _trim_fraction(text: str) -> str:
    """``text`` with its fraction of a second cut to six digits (only zeros go: the
    caller refused any other digit past the sixth)."""
    match = _FRACTION.search(text)
    if match is None or len(match.group(1)) <= 6:
        return text
    start, end = match.span(1)
    return text[:start] + match.group(1)[:6] + text[end:]


def _decimal(value: object, parameters: Mapping[str, object]) -> float:
    """A Connect ``Decimal`` (base64 of the big-endian two's-complement unscaled value,
    or a JSON number with ``decimal.format=NUMERIC``) as float64, exactly or not at all."""
    if type(value) is float:
        return value
    if type(value) is int:
        exact, scale = decimal.Decimal(value), 0
    elif isinstance(value, str):
        scale = int(str(parameters.get("scale", "0")))
        unscaled = int.from_bytes(base64.b64decode(value, validate=True), "big", signed=True)
        exact = decimal.Decimal(unscaled).scaleb(-scale)
    else:
        raise Unreadable("Decimal")
    result = float(exact)
    if not np.isfinite(result):
        raise Unreadable("Decimal")
    # As for Parquet decimals: exact when the float reads back as the same decimal at
    # the column's scale, else not representable in float64. The comparison is exact:
    # a context wide enough for any float64 at any scale (the default 28 digits made
    # a Decimal(38, 18) that a float holds exactly fail as unreadable).
    wide = decimal.Context(prec=1100)
    back = decimal.Decimal(result).quantize(decimal.Decimal(1).scaleb(-scale), context=wide)
    if back.compare(exact, context=wide) != 0:
        raise Unreadable("Decimal")
    return result


def short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
