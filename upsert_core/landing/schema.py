"""The source schema of a shard: ingest options and column types, and how it evolves.

Invariants:

- The options (key columns, order column(s), delete-marker column) are fixed by the
  shard's first ingest; :meth:`SourceSchema.check_options` rejects conflicting ones.
- ``order`` is one column name, or a tuple of two or more (an order of several
  columns, compared on the first, then the next: ``upsert_core.order_keys``); a tuple of
  one is normalised to its name, so one column is always held, compared and stored as
  before. ``--order`` text splits on commas (:func:`parse_order`).
- ``columns`` lists every typed column in order of first appearance; a column's type is
  fixed by the first batch that gives it one (a column that is all null has no type
  yet and is not recorded). The delete-marker column is never in ``columns``: it is
  not part of a row.
- :meth:`SourceSchema.evolve` only ever appends columns, never removes, reorders or
  retypes them, so a row encoded under an older schema still decodes under a newer one.
- Compatible batch types: the same logical type, or an ``int64`` batch column for a
  ``float64`` value column (widening on the way in). Key and order columns accept only
  their exact type. An order column is ``int64`` or ``timestamp``, or, in an order of
  several columns, ``string``. Anything else is an :class:`IngestError` naming the file
  and the column.
- ``to_json``/``from_json`` round-trip exactly (the JSON is stored in the shard). A
  schema with one order column is written as version 1, byte for byte as before; one
  with several as version 2 (``order`` a list), which releases before several-column
  orders refuse by its version instead of misreading it.
- ``envelope_order`` (a Debezium shard created since the order got reserved names):
  ``order`` names fields of a change event's envelope (``source.lsn``, ``ts_ms``), not
  columns, and each row stores them under reserved names, :data:`ENVELOPE_ORDER_PREFIX`
  + the field (:attr:`SourceSchema.order_columns`), so a column of ``after`` named like
  the field (``ts_ms``) is an ordinary value column beside it. Such a schema is written
  as version 3 (``order`` always a list), which earlier releases refuse by its version
  ("unsupported source schema version 3") instead of reading the reserved columns as
  the user's; a schema without it (every plain shard, and Debezium shards created
  before) is written and read exactly as before, its order columns named by ``order``.
  Messages name an order column as the user does (:meth:`SourceSchema.label`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

import pyarrow as pa

from upsert_core.errors import ConfigError, IngestError

SCHEMA_VERSION = 1
SEVERAL_ORDERS_SCHEMA_VERSION = 2
"""The stored schema's version when the order has several columns."""
ENVELOPE_ORDER_SCHEMA_VERSION = 3
"""The stored schema's version when the order is stored under reserved names
(``SourceSchema.envelope_order``), with one order field or several."""

ENVELOPE_ORDER_PREFIX = "(debezium order) "
"""The reserved name of an envelope order field's stored column is this + the field:
``(debezium order) source.lsn``. Only the Debezium translation writes such columns (a
field of ``after`` with such a name is an error row there), so they never collide with
the table's columns; reads hide them (``upsert_core.row_view``)."""


class LogicalType(StrEnum):
    """The column types a shard stores."""

    INT64 = "int64"
    FLOAT64 = "float64"
    STRING = "string"
    BOOL = "bool"
    TIMESTAMP = "timestamp"  # microseconds since the epoch, UTC
    DATE = "date"
    BINARY = "binary"


ARROW_TYPES: dict[LogicalType, pa.DataType] = {
    LogicalType.INT64: pa.int64(),
    LogicalType.FLOAT64: pa.float64(),
    LogicalType.STRING: pa.string(),
    LogicalType.BOOL: pa.bool_(),
    LogicalType.TIMESTAMP: pa.timestamp("us", tz="UTC"),
    LogicalType.DATE: pa.date32(),
    LogicalType.BINARY: pa.binary(),
}

ORDER_TYPES = (LogicalType.INT64, LogicalType.TIMESTAMP)
SEVERAL_ORDER_TYPES = (*ORDER_TYPES, LogicalType.STRING)
"""Column types an order of several columns may hold (strings compared as text)."""


def parse_order(text: str) -> str | tuple[str, ...]:
    """``--order`` text: one column name, or several separated by commas.

    Text without a comma is the column name exactly as given (as before several-column
    orders existed); with commas each name is stripped, and an empty or repeated one is
    a :class:`ConfigError`.
    """
    if "," not in text:
        return text
    names = tuple(part.strip() for part in text.split(","))
    if any(not n for n in names):
        raise ConfigError(f"--order {text!r}: give column names separated by commas")
    if len(set(names)) != len(names):
        raise ConfigError(f"--order {text!r}: a column is named twice")
    return names


def normal_order(order: str | Sequence[str]) -> str | tuple[str, ...]:
    """One column as its name, several as a tuple."""
    if isinstance(order, str):
        return order
    names = tuple(order)
    return names[0] if len(names) == 1 else names


def order_text(order: str | tuple[str, ...]) -> str:
    """An order as ``--order`` takes it (names joined by commas)."""
    return order if isinstance(order, str) else ",".join(order)


def logical_type_of(arrow_type: pa.DataType) -> LogicalType | None:
    """The logical type an Arrow column maps to; None for the null type.

    Raises ``TypeError`` for types the platform does not store (lists, structs, ...).
    """
    t = arrow_type
    if pa.types.is_dictionary(t):
        return logical_type_of(t.value_type)
    if pa.types.is_null(t):
        return None
    if pa.types.is_integer(t):
        return LogicalType.INT64
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return LogicalType.FLOAT64
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return LogicalType.STRING
    if pa.types.is_boolean(t):
        return LogicalType.BOOL
    if pa.types.is_timestamp(t):
        return LogicalType.TIMESTAMP
    if pa.types.is_date(t):
        return LogicalType.DATE
    if (
        pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
        or pa.types.is_binary_view(t)
    ):
        return LogicalType.BINARY
    raise TypeError(f"unsupported column type {t}")


@dataclass(frozen=True)
class SourceSchema:
    """Ingest options plus the typed columns, in order of first appearance."""

    key: tuple[str, ...] = ("key",)
    order: str | tuple[str, ...] = "offset"
    """One order column, or a tuple of several (see the module docstring)."""
    deleted: str = "__deleted"
    columns: tuple[tuple[str, LogicalType], ...] = field(default=())
    envelope_order: bool = False
    """``order`` names envelope fields, stored under reserved names (module docstring)."""

    def __post_init__(self) -> None:
        if not self.key or any(not k for k in self.key):
            raise ConfigError("at least one non-empty key column is needed")
        if len(set(self.key)) != len(self.key):
            raise ConfigError(f"duplicate key columns: {','.join(self.key)}")
        if not isinstance(self.order, str):
            if not self.order or any(not isinstance(o, str) for o in self.order):
                raise ConfigError(f"order columns must be names: {self.order!r}")
            object.__setattr__(self, "order", normal_order(self.order))
        if not self.order or any(not o for o in self.order_fields) or not self.deleted:
            raise ConfigError("the order and delete-marker column names must not be empty")
        if len(set(self.order_columns)) != len(self.order_columns):
            raise ConfigError(f"duplicate order columns: {order_text(self.order)}")
        special = [*self.key, *self.order_columns, self.deleted]
        if len(set(special)) != len(special):
            raise ConfigError(
                "key, order and delete-marker columns must be distinct: "
                f"key={','.join(self.key)} order={order_text(self.order)} "
                f"deleted={self.deleted}"
            )

    # --- lookups ------------------------------------------------------------------

    @property
    def order_fields(self) -> tuple[str, ...]:
        """The order as ``--order`` names it, in comparison order: the order columns of a
        plain file, the envelope fields of a Debezium event."""
        return (self.order,) if isinstance(self.order, str) else self.order

    @property
    def order_columns(self) -> tuple[str, ...]:
        """The order's stored columns, in comparison order (one for a single order
        column): :attr:`order_fields` themselves, or their reserved names with
        ``envelope_order``."""
        if self.envelope_order:
            return tuple(ENVELOPE_ORDER_PREFIX + f for f in self.order_fields)
        return self.order_fields

    def label(self, name: str) -> str:
        """Column ``name`` as messages name it: an order column's field as ``--order``
        gives it, any other column itself."""
        if self.envelope_order and name.startswith(ENVELOPE_ORDER_PREFIX):
            field_name = name[len(ENVELOPE_ORDER_PREFIX):]
            if field_name in self.order_fields:
                return field_name
        return name

    @property
    def several_orders(self) -> bool:
        """Whether the order has several columns (orders are order keys, not int64)."""
        return not isinstance(self.order, str)

    @property
    def order_text(self) -> str:
        """The order as ``--order`` takes it (names joined by commas)."""
        return order_text(self.order)

    @property
    def names(self) -> tuple[str, ...]:
        """Row column names in schema order (the delete marker is never one)."""
        return tuple(name for name, _ in self.columns)

    def type_of(self, name: str) -> LogicalType | None:
        for col, typ in self.columns:
            if col == name:
                return typ
        return None

    def role(self, name: str) -> str:
        """``key``, ``order``, ``deleted`` or ``value``."""
        if name in self.key:
            return "key"
        if name in self.order_columns:
            return "order"
        if name == self.deleted:
            return "deleted"
        return "value"

    # --- options ------------------------------------------------------------------

    def check_options(
        self,
        key: Sequence[str] | None = None,
        order: str | Sequence[str] | None = None,
        deleted: str | None = None,
    ) -> None:
        """Raise ConfigError if any given option differs from the shard's (``order``
        as ``--order`` text, or parsed)."""
        conflicts = []
        if key is not None and tuple(key) != self.key:
            conflicts.append(f"--key {','.join(key)} (shard has {','.join(self.key)})")
        if order is not None:
            wanted = normal_order(parse_order(order) if isinstance(order, str) else order)
            if wanted != self.order:
                conflicts.append(f"--order {order_text(wanted)} (shard has {self.order_text})")
        if deleted is not None and deleted != self.deleted:
            conflicts.append(f"--deleted-col {deleted} (shard has {self.deleted})")
        if conflicts:
            raise ConfigError("conflicting ingest options: " + "; ".join(conflicts))

    @property
    def order_types(self) -> tuple[LogicalType, ...]:
        """The types an order column of this schema may have."""
        return SEVERAL_ORDER_TYPES if self.several_orders else ORDER_TYPES

    @property
    def order_types_text(self) -> str:
        """What an order column must be, for messages."""
        if self.several_orders:
            return ("each column of an order of several must be an integer, a timestamp or"
                    " a string")
        return ("it must be an integer or a timestamp (a string only in an order of several"
                " columns, --order a,b)")

    # --- evolution ----------------------------------------------------------------

    def evolve(
        self, batch_columns: Sequence[tuple[str, LogicalType | None]], file: str = "<batch>"
    ) -> SourceSchema:
        """The schema after a batch with these (name, type) columns; may be ``self``.

        ``None`` types (all-null columns) are skipped. Raises IngestError naming the
        file and column for an incompatible or unsupported type.
        """
        added: list[tuple[str, LogicalType]] = []
        known = dict(self.columns)
        for name, typ in batch_columns:
            role = self.role(name)
            if role == "deleted" or typ is None:
                continue
            have = known.get(name)
            if have is None:
                if role == "order" and typ not in self.order_types:
                    raise IngestError(f"{file}: order column {self.label(name)!r} has type"
                                      f" {typ}; " + self.order_types_text)
                known[name] = typ
                added.append((name, typ))
            elif not compatible(typ, have, role):
                raise IngestError(
                    f"{file}: column {self.label(name)!r} changed type from {have} to {typ}"
                    + (" (key and order column types never change)" if role != "value" else "")
                )
        if not added:
            return self
        return replace(self, columns=self.columns + tuple(added))

    # --- persistence --------------------------------------------------------------

    def to_json(self) -> str:
        several = self.several_orders
        order: str | list[str]
        if self.envelope_order:
            version, order = ENVELOPE_ORDER_SCHEMA_VERSION, list(self.order_fields)
        elif several:
            version, order = SEVERAL_ORDERS_SCHEMA_VERSION, list(self.order_fields)
        else:
            version, order = SCHEMA_VERSION, self.order_fields[0]
        return json.dumps(
            {
                "version": version,
                "key": list(self.key),
                "order": order,
                "deleted": self.deleted,
                "columns": [[name, str(typ)] for name, typ in self.columns],
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> SourceSchema:
        try:
            obj = json.loads(text)
            version = obj.get("version")
            if version == SCHEMA_VERSION:
                order: str | tuple[str, ...] = str(obj["order"])
            elif version == SEVERAL_ORDERS_SCHEMA_VERSION:
                listed = obj["order"]
                if not isinstance(listed, list) or len(listed) < 2:
                    raise ConfigError("malformed stored source schema: version 2 needs an"
                                      " order of several columns")
                order = tuple(str(o) for o in listed)
            elif version == ENVELOPE_ORDER_SCHEMA_VERSION:
                listed = obj["order"]
                if not isinstance(listed, list) or not listed:
                    raise ConfigError("malformed stored source schema: version 3 needs a"
                                      " list of order fields")
                order = normal_order([str(o) for o in listed])
            else:
                raise ConfigError(
                    f"unsupported source schema version {version!r} (the shard was written"
                    " by a newer release of upsert-platform; upgrade to read it)")
            return cls(
                key=tuple(str(k) for k in obj["key"]),
                order=order,
                deleted=str(obj["deleted"]),
                columns=tuple((str(n), LogicalType(t)) for n, t in obj["columns"]),
                envelope_order=version == ENVELOPE_ORDER_SCHEMA_VERSION,
            )
        except ConfigError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(f"malformed stored source schema: {exc}") from exc


def compatible(batch: LogicalType, column: LogicalType, role: str) -> bool:
    """Whether a batch column of type ``batch`` can land in a column of type ``column``."""
    if batch == column:
        return True
    return role == "value" and batch == LogicalType.INT64 and column == LogicalType.FLOAT64
