"""What reads show of a shard's rows: :class:`RowView`, the one place every read surface
(``upsertctl snapshot``/``changes``/``inspect``, ``open_shard()``, the Spark source,
Dagster's column metadata) takes its columns from.

A shard stores each row as the values of its source schema's columns. Most shards show
exactly those. A Debezium shard (``--envelope debezium``) also stores its order field(s)
(``source.lsn``; ``source.file``, ``source.pos``, ``source.row``; ``ts_ms``) in every
row: the global order scope reads a key's order back from its row when it rebuilds a
bucket's state, and ``check`` compares checkpointed orders with it. They are stored under
reserved names (``(debezium order) ts_ms``: ``SourceSchema.order_columns``; shards
created before reserved names use the fields' own names), so a column of ``after`` named
like an order field is one of the shard's columns, shown as any other. But the shard's
columns are the columns of ``after`` (CONTRACT.md, "Change data capture"), so those
stored columns are *hidden*: :meth:`ShardOptions.hidden_columns
<upsert_core.ingest.shard_config.ShardOptions.hidden_columns>` names them, from the
stored options alone (shards written before reads hid them read the same way, with no
upgrade).

Invariants:

- ``stored`` decodes the stored rows; ``visible`` (``stored`` without the hidden
  columns, in the same order) is the shard's columns as every read shows them. With
  nothing hidden ``visible is stored`` and every method here is the identity, so a plain
  shard's reads do exactly what they did before.
- :meth:`RowView.project_updates` turns stored updates ``(key, row, ts, diff)`` into
  updates of visible rows: each row re-encoded from its visible values as a row of
  ``visible`` is encoded (``landing.rows.encode_row``: canonical, trailing nulls
  dropped), then consolidated per ``(key, row, ts)``. So two stored rows that differ only
  in a hidden column (a Debezium update whose ``after`` equals the previous one, with a
  new LSN) are one visible row, and their retraction and insertion at the same ts cancel:
  changes stay consolidated as the contract asks, and ``snapshot(ts) = snapshot(ts - 1)
  + changes(ts)`` still holds (projection is linear). The result is sorted by ``(key,
  row, ts)`` and holds the same keys, so a batch that held all updates of every key it
  covers still does (reads rely on that to resume and to split by key).
- Snapshots need no consolidation: a consolidated snapshot holds at most one row per
  key, so dropping the hidden columns of its rows (:meth:`RowView.visible_table`) is the
  whole projection.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property

import pyarrow as pa

from upsert_core.errors import CorruptData
from upsert_core.ingest.shard_config import ShardIngestConfig, ShardOptions
from upsert_core.landing import ARROW_TYPES, LogicalType, SourceSchema, decode_rows_to_table
from upsert_core.persist.write.consolidate import UPDATE_SCHEMA, consolidate
from upsert_core.persist.write.parts import rows_of_values


@dataclass(frozen=True)
class RowView:
    """A shard's stored schema and the stored columns its reads hide (module docstring)."""

    stored: SourceSchema | None
    """The source schema the stored rows decode with (None before the first ingest)."""
    hidden: tuple[str, ...] = ()
    """Stored columns that are not columns of the shard."""

    @classmethod
    def of(cls, options: ShardOptions | None) -> RowView:
        """The view of a shard with these stored ingest options."""
        if options is None:
            return cls(None)
        return cls(options.schema, options.hidden_columns)

    @classmethod
    def of_config(cls, config: Mapping[str, str]) -> RowView:
        """The view of a shard whose state's config is ``config``."""
        return cls.of(ShardIngestConfig.read(config).options)

    @cached_property
    def visible(self) -> SourceSchema | None:
        """The shard's columns as reads show them: ``stored`` without the hidden ones. It
        decodes rows :meth:`project_updates` made, never stored rows."""
        if self.stored is None or not self.hidden:
            return self.stored
        columns = tuple(c for c in self.stored.columns if c[0] not in self.hidden)
        return replace(self.stored, columns=columns)

    @property
    def columns(self) -> tuple[tuple[str, LogicalType], ...]:
        """The visible ``(name, type)`` pairs, in schema order."""
        return () if self.visible is None else self.visible.columns

    @property
    def names(self) -> tuple[str, ...]:
        """The visible column names, in schema order."""
        return tuple(name for name, _ in self.columns)

    @property
    def arrow_schema(self) -> pa.Schema:
        """The Arrow schema of the visible columns (a snapshot's schema)."""
        return pa.schema([(name, ARROW_TYPES[typ]) for name, typ in self.columns])

    def visible_table(self, table: pa.Table) -> pa.Table:
        """``table`` (a snapshot's rows decoded with ``stored``) without its hidden
        columns."""
        return table.select(list(self.names)) if self.hidden else table

    def project_updates(self, updates: pa.RecordBatch | pa.Table) -> pa.RecordBatch | pa.Table:
        """Stored updates as consolidated updates of visible rows (module docstring);
        ``updates`` itself when nothing is hidden."""
        if not self.hidden or not updates.num_rows:
            return updates
        stored, visible = self.stored, self.visible
        if stored is None or visible is None:
            raise CorruptData("the shard has rows but no stored source schema")
        values = decode_rows_to_table(stored, updates.column("row"))
        rows = rows_of_values([values.column(name) for name in visible.names])
        projected = pa.table([updates.column("key"), rows, updates.column("ts"),
                              updates.column("diff")], schema=UPDATE_SCHEMA)
        return consolidate(projected)
