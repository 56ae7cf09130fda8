"""The source schema of a shard: ingest options and column types, and how it evolves.

Invariants:

- The options (key columns, order column, delete-marker column) are fixed by the
  shard's first ingest; :meth:`SourceSchema.check_options` rejects conflicting ones.
- ``columns`` lists every typed column in order of first appearance; a column's type is
  fixed by the first batch that gives it one (a column that is all null has no type
  yet and is not recorded). The delete-marker column is never in ``columns``: it is
  not part of a row.
- :meth:`SourceSchema.evolve` only ever appends columns, never removes, reorders or
  retypes them, so a row encoded under an older schema still decodes under a newer one.
- Compatible batch types: the same logical type, or an ``int64`` batch column for a
  ``float64`` value column (widening on the way in). Key and order columns accept only
  their exact type. The order column is ``int64`` or ``timestamp``. Anything else is an
  :class:`IngestError` naming the file and the column.
- ``to_json``/``from_json`` round-trip exactly (the JSON is stored in the shard).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

import pyarrow as pa

from upsert_core.errors import ConfigError, IngestError

SCHEMA_VERSION = 1


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
    order: str = "offset"
    deleted: str = "__deleted"
    columns: tuple[tuple[str, LogicalType], ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.key or any(not k for k in self.key):
            raise ConfigError("at least one non-empty key column is needed")
        if len(set(self.key)) != len(self.key):
            raise ConfigError(f"duplicate key columns: {','.join(self.key)}")
        if not self.order or not self.deleted:
            raise ConfigError("the order and delete-marker column names must not be empty")
        special = [*self.key, self.order, self.deleted]
        if len(set(special)) != len(special):
            raise ConfigError(
                "key, order and delete-marker columns must be distinct: "
                f"key={','.join(self.key)} order={self.order} deleted={self.deleted}"
            )

    # --- lookups ------------------------------------------------------------------

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
        if name == self.order:
            return "order"
        if name == self.deleted:
            return "deleted"
        return "value"

    # --- options ------------------------------------------------------------------

    def check_options(
        self,
        key: Sequence[str] | None = None,
        order: str | None = None,
        deleted: str | None = None,
    ) -> None:
        """Raise ConfigError if any given option differs from the shard's."""
        conflicts = []
        if key is not None and tuple(key) != self.key:
            conflicts.append(f"--key {','.join(key)} (shard has {','.join(self.key)})")
        if order is not None and order != self.order:
            conflicts.append(f"--order {order} (shard has {self.order})")
        if deleted is not None and deleted != self.deleted:
            conflicts.append(f"--deleted-col {deleted} (shard has {self.deleted})")
        if conflicts:
            raise ConfigError("conflicting ingest options: " + "; ".join(conflicts))

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
                if role == "order" and typ not in ORDER_TYPES:
                    raise IngestError(
                        f"{file}: order column {name!r} has type {typ}; it must be an integer "
                        "or a timestamp"
                    )
                known[name] = typ
                added.append((name, typ))
            elif not compatible(typ, have, role):
                raise IngestError(
                    f"{file}: column {name!r} changed type from {have} to {typ}"
                    + (" (key and order column types never change)" if role != "value" else "")
                )
        if not added:
            return self
        return replace(self, columns=self.columns + tuple(added))

    # --- persistence --------------------------------------------------------------

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": SCHEMA_VERSION,
                "key": list(self.key),
                "order": self.order,
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
            if obj.get("version") != SCHEMA_VERSION:
                raise ConfigError(f"unsupported source schema version {obj.get('version')!r}")
            return cls(
                key=tuple(str(k) for k in obj["key"]),
                order=str(obj["order"]),
                deleted=str(obj["deleted"]),
                columns=tuple((str(n), LogicalType(t)) for n, t in obj["columns"]),
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
