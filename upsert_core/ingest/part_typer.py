"""The ingest's :class:`~upsert_core.persist.maintenance.compact.PartTyper`: lets compaction write
typed, bucket-labelled parts from plain ones (parts written before typed parts, or with
``UPSERT_TYPED_PARTS=0``), so GC upgrades an older shard to the layout snapshots read
without a merge.

Invariants:

- The values it gives are exactly what the ingest writes into a typed part: the rows
  decoded with the shard's CURRENT source schema (``landing.rows.decode_rows_to_table``;
  schemas only append columns, so it covers every stored row, and a column a row
  predates is null), and the bucket count is the shard's own.
- No typer (None) for a shard the ingest did not write (no schema or options) or
  whose config cannot be read, none while ``UPSERT_TYPED_PARTS=0`` here, and none while
  the shard's newest part is plain: a deployment whose ingests write plain parts (for
  readers of older releases) keeps its shard plain even when GC runs elsewhere, without
  the setting. Compaction then keeps plain parts plain.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from upsert_core.errors import ConfigError
from upsert_core.ingest.options import part_format_from_env, typed_parts_from_env
from upsert_core.ingest.shard_config import ShardIngestConfig
from upsert_core.landing import ARROW_TYPES, SourceSchema
from upsert_core.landing.rows import decode_rows_to_table
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.state import ShardState
from upsert_core.persist.write.parts import OpenPart


@dataclass(frozen=True)
class SchemaTyper:
    """Decodes a shard's encoded rows with its source schema (a ``PartTyper``)."""

    schema: SourceSchema
    buckets: int
    values_only: bool = True
    """Compaction writes format 3 (each row once, as its values), as the ingest does."""

    @property
    def fields(self) -> list[pa.Field]:
        return [pa.field(name, ARROW_TYPES[typ]) for name, typ in self.schema.columns]

    def values(self, rows: pa.Array | pa.ChunkedArray) -> pa.Table:
        return decode_rows_to_table(self.schema, rows)


def part_typer(shard: Shard) -> SchemaTyper | None:
    """The typer for ``shard`` as it is now (see the module docstring)."""
    if not typed_parts_from_env():
        return None
    state = shard.state()
    try:
        stored = ShardIngestConfig.read(state.config)
    except ConfigError:
        return None
    if stored.schema is None or stored.options is None or _newest_part_plain(shard, state):
        return None
    return SchemaTyper(stored.schema, stored.options.buckets, part_format_from_env() >= 3)


def _newest_part_plain(shard: Shard, state: ShardState) -> bool:
    """Whether the newest non-empty part of ``state`` has no value columns."""
    for batch in reversed(state.batches):
        for part in batch.parts:
            if part.num_updates:
                opened = OpenPart(shard.blob, part, shard=shard.shard_id)
                try:
                    return not opened.layout.values
                finally:
                    opened.close()
    return False
