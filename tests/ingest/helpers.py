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


def contents(shard: Shard) -> list[tuple[Counter[Row], Counter[Row]]]:
    """Per readable ts: (snapshot, changes) decoded, for comparing shards."""
    state = shard.state()
    return [(snapshot_rows(shard, ts), change_rows(shard, ts)) for ts in range(state.upper)]
