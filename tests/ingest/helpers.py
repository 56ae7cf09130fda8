"""Builders and readers for ingest tests: landing files, shards, decoded contents (as
:mod:`tests.model`'s canonical rows, to compare with its snapshots and changes)."""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.model import Row, canonical
from upsert_core.ingest.shard_config import CONFIG_SCHEMA
from upsert_core.landing import SourceSchema, decode_row
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.shard import Shard
from upsert_core.shard_table import ShardTable


def write_jsonl(root: Path, name: str, rows: Iterable[object]) -> Path:
    path = root / name
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    path.write_text("".join(line + "\n" for line in lines))
    return path


def write_parquet(root: Path, name: str, table: pa.Table) -> Path:
    path = root / name
    sink = io.BytesIO()
    pq.write_table(table, sink)
    path.write_bytes(sink.getvalue())
    return path


def memory_shard(name: str = "s") -> Shard:
    return Shard.open(MemoryConsensus(), MemoryBlob(), name)


def schema_of(shard: Shard) -> SourceSchema:
    return SourceSchema.from_json(shard.state().config[CONFIG_SCHEMA])


def snapshot_rows(shard: Shard, ts: int) -> Counter[Row]:
    schema = schema_of(shard)
    out: Counter[Row] = Counter()
    for batch in shard.snapshot(ts):
        for row, diff in zip(batch.column("row").to_pylist(), batch.column("diff").to_pylist(),
                             strict=True):
            out[canonical(decode_row(schema, row))] += diff
    return out


def change_rows(shard: Shard, ts: int) -> Counter[Row]:
    schema = schema_of(shard)
    out: Counter[Row] = Counter()
    for batch in shard.changes(ts, ts + 1):
        for row, t, diff in zip(batch.column("row").to_pylist(), batch.column("ts").to_pylist(),
                                batch.column("diff").to_pylist(), strict=True):
            assert t == ts
            key = canonical(decode_row(schema, row))
            assert key not in out, "changes are not consolidated"
            out[key] = diff
    return out


def read_snapshot_rows(shard: Shard, ts: int) -> Counter[Row]:
    """The snapshot at ``ts`` as the Python read API returns it (``open_shard``'s
    :class:`ShardTable`: the shard's visible columns), as canonical rows."""
    return Counter(canonical(row) for row in ShardTable(shard).snapshot(ts).to_pylist())


def read_change_rows(shard: Shard, ts: int) -> Counter[Row]:
    """The changes at ``ts`` as the Python read API returns them, as canonical rows ->
    diff; asserts they are consolidated (no row twice, no zero diff)."""
    table = ShardTable(shard)
    time, diff = table.change_columns()
    out: Counter[Row] = Counter()
    for row in table.changes(ts, ts + 1).to_pylist():
        assert row.pop(time) == ts
        change = row.pop(diff)
        key = canonical(row)
        assert key not in out and change != 0, "changes are not consolidated"
        out[key] = change
    return out


def contents(shard: Shard) -> list[tuple[Counter[Row], Counter[Row]]]:
    """Per readable ts: (snapshot, changes) decoded, for comparing shards."""
    state = shard.state()
    return [(snapshot_rows(shard, ts), change_rows(shard, ts)) for ts in range(state.upper)]
