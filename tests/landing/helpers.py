"""Small builders for landing-file tests: JSONL/CSV/Parquet bytes and validation."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq

from upsert_core.landing import (
    SourceSchema,
    ValidatedBatch,
    read_csv,
    read_jsonl,
    read_parquet,
    validate_batch,
)


def jsonl(*rows: object) -> bytes:
    """One JSON value per line; a ``str`` row is written verbatim (for malformed lines)."""
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    return "".join(line + "\n" for line in lines).encode()


def parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def validate_jsonl(
    data: bytes, schema: SourceSchema | None = None, name: str = "b.jsonl"
) -> ValidatedBatch:
    return validate_batch(read_jsonl(name, data), schema or SourceSchema())


def validate_csv(
    data: bytes, schema: SourceSchema | None = None, name: str = "b.csv"
) -> ValidatedBatch:
    return validate_batch(read_csv(name, data), schema or SourceSchema())


def validate_parquet(
    table: pa.Table, schema: SourceSchema | None = None, name: str = "b.parquet"
) -> ValidatedBatch:
    return validate_batch(read_parquet(name, parquet(table)), schema or SourceSchema())


def error_rows(batch: ValidatedBatch) -> list[int]:
    return [e.row for e in batch.errors]
