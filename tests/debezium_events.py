"""Debezium change events as Kafka Connect's S3 sink writes them, for tests: JSON Lines
(one event, or its ``schema``/``payload`` wrapper, per line) and Parquet (one event per
row: ``before``/``after``/``source`` structs, ``op``, ``ts_ms``; the Avro schema the
sink's parquet-avro writer records in the footer, optionally).

The same list of event dicts written both ways is the same landing to the platform
(``upsert_core.landing.debezium_parquet``), which tests check."""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

Event = dict[str, Any]


def event(op: str | None, lsn: int | None = 1, **images: Any) -> Event:
    """An event with ``source.lsn`` = ``lsn`` and ``ts_ms``; ``before``/``after`` as given."""
    return {"op": op, "source": {"lsn": lsn, "db": "shop"}, "ts_ms": 1000 + (lsn or 0),
            **images}


def _common_type(values: Sequence[Any], given: pa.DataType | None) -> pa.DataType:
    if given is not None:
        return given
    present = [v for v in values if v is not None]
    return pa.array(present).type if present else pa.null()


def events_table(
    events: Iterable[Event],
    image: pa.DataType | None = None,
    source: pa.DataType | None = None,
    avro_schema: Mapping[str, Any] | None = None,
) -> pa.Table:
    """The events as the sink's Parquet rows. ``image``: the struct type of ``before``
    and ``after`` (default: inferred from both); ``source`` likewise; ``avro_schema``:
    recorded in the footer as ``parquet.avro.schema``."""
    rows = list(events)
    images = [r.get(side) for r in rows for side in ("before", "after")]
    image_type = _common_type(images, image)
    source_type = _common_type([r.get("source") for r in rows], source)
    schema = pa.schema([
        ("before", image_type), ("after", image_type), ("source", source_type),
        ("op", pa.string()), ("ts_ms", pa.int64()),
    ])
    if avro_schema is not None:
        schema = schema.with_metadata({b"parquet.avro.schema": json.dumps(avro_schema).encode()})
    table = pa.Table.from_pylist(
        [{"before": r.get("before"), "after": r.get("after"), "source": r.get("source"),
          "op": r.get("op"), "ts_ms": r.get("ts_ms")} for r in rows],
        schema=schema,
    )
    return table


def parquet_bytes(table: pa.Table, row_group_size: int | None = None) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=row_group_size)
    return sink.getvalue()


def jsonl_bytes(lines: Iterable[Any]) -> bytes:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                   for line in lines).encode()


def write_events_parquet(root: Path, name: str, events: Iterable[Event], **kwargs: Any) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(parquet_bytes(events_table(events, **kwargs)))
    return path


def write_events_jsonl(root: Path, name: str, lines: Iterable[Any]) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(jsonl_bytes(lines))
    return path


def avro_envelope(
    fields: Sequence[Mapping[str, Any]], name: str = "shop.public.t"
) -> dict[str, Any]:
    """The Avro schema Kafka Connect's Avro converter makes of a Debezium envelope whose
    row has ``fields`` (Avro field entries): ``before`` defines the row record, ``after``
    refers to it by name, as Avro requires for a second use of a named type."""
    value = {"type": "record", "name": "Value", "namespace": name, "fields": list(fields)}
    return {
        "type": "record", "name": "Envelope", "namespace": name,
        "fields": [
            {"name": "before", "type": ["null", value], "default": None},
            {"name": "after", "type": ["null", f"{name}.Value"], "default": None},
            {"name": "source", "type": {"type": "record", "name": "Source",
                                        "namespace": "io.debezium.connector.postgresql",
                                        "fields": [{"name": "lsn", "type": ["null", "long"]}]}},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": ["null", "long"], "default": None},
        ],
        "connect.name": f"{name}.Envelope",
    }
