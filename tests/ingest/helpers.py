"""Builders and readers for ingest tests: landing files, shards, decoded contents, and an
obviously correct dict model of the upsert semantics in CONTRACT.md."""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from upsert_core.ingest.options import CONFIG_SCHEMA
from upsert_core.landing import SourceSchema, decode_row
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.shard import Shard

Row = tuple[tuple[str, Any], ...]
"""A row as sorted (column, value) pairs of its non-null columns (hashable)."""


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


def canonical(row: dict[str, Any]) -> Row:
    return tuple(sorted((k, v) for k, v in row.items() if v is not None))


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


# --- the model ------------------------------------------------------------------------


class UpsertModel:
    """Per key: the live row (or None for a tombstone) and its order, per CONTRACT.md."""

    def __init__(self, scope: str, key: str = "key", order: str = "offset",
                 deleted: str = "__deleted") -> None:
        self.scope = scope
        self.key, self.order, self.deleted = key, order, deleted
        self.state: dict[Any, tuple[Row | None, int]] = {}
        self.history: list[Counter[Row]] = []

    def live(self) -> Counter[Row]:
        return Counter(row for row, _ in self.state.values() if row is not None)

    def apply(self, rows: Sequence[dict[str, Any]]) -> None:
        winners: dict[Any, tuple[int, int, dict[str, Any]]] = {}
        for pos, r in enumerate(rows):
            cand = (r[self.order], pos, r)
            best = winners.get(r[self.key])
            if best is None or (cand[0], cand[1]) > (best[0], best[1]):
                winners[r[self.key]] = cand
        for key, (order, _pos, r) in winners.items():
            stored = self.state.get(key)
            if self.scope == "global" and stored is not None and order <= stored[1]:
                continue
            is_delete = bool(r.get(self.deleted))
            row = None if is_delete else canonical(
                {k: v for k, v in r.items() if k != self.deleted}
            )
            if row is None and self.scope == "batch":
                self.state.pop(key, None)
            else:
                self.state[key] = (row, order)
        self.history.append(self.live())

    def changes(self, ts: int) -> Counter[Row]:
        before = self.history[ts - 1] if ts else Counter()
        after = self.history[ts]
        out: Counter[Row] = Counter()
        for row in set(before) | set(after):
            d = after[row] - before[row]
            if d:
                out[row] = d
        return out
