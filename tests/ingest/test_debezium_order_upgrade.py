"""The upgrade path of a Debezium shard's stored order (``SourceSchema.envelope_order``).

A Debezium shard written before the order got reserved names stores it under the field's
own name (``source.lsn``, ``ts_ms``) with a version-1 or -2 schema. Such a shard is built
here in its stored form: its options entries exactly as the release before stored them
(``MAIN_ENTRIES``, recorded from that release), so every file is then written the way
that release wrote it, which the schema stored after the first file pins byte for byte
(``MAIN_SCHEMA``, also that release's). It keeps reading and ingesting as before: its
layout, the same rows and error rows (a field of ``after`` named like the order is still
one), late rows, ``check``; and for events without such a field, what reads show is what
a shard created now shows. (Cross-checked once against that release itself: the same
files ingested by it and by this code into such a shard gave identical schemas, reads,
late rows, error rows and checks.)"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.debezium_events import write_events_jsonl, write_events_parquet
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.shard_config import CONFIG_SCHEMA
from upsert_core.landing import SourceSchema
from upsert_core.landing.schema import ENVELOPE_ORDER_PREFIX
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.state import ShardState
from upsert_core.shard_table import ShardTable

from .helpers import memory_shard

# What upsert-platform at main 5a3f3f6 (before reserved names) stored for
# ``--envelope debezium --key id [--order ts_ms] --order-scope global --buckets 2`` after
# a first file with no rows (recorded from that release) ...
MAIN_ENTRIES = {
    "source.lsn": {
        "ingest.buckets": "2", "ingest.envelope": "debezium", "ingest.order_scope": "global",
        "ingest.schema": '{"columns":[],"deleted":"(debezium delete)","key":["id"],'
                         '"order":"source.lsn","version":1}',
    },
    "ts_ms": {
        "ingest.buckets": "2", "ingest.envelope": "debezium", "ingest.order_scope": "global",
        "ingest.schema": '{"columns":[],"deleted":"(debezium delete)","key":["id"],'
                         '"order":"ts_ms","version":1}',
    },
    "source.lsn,ts_ms": {
        "ingest.buckets": "2", "ingest.envelope": "debezium", "ingest.order_scope": "global",
        "ingest.schema": '{"columns":[],"deleted":"(debezium delete)","key":["id"],'
                         '"order":["source.lsn","ts_ms"],"version":2}',
    },
}
# ... and its schema once it had ingested FILES[0].
MAIN_SCHEMA = {
    "source.lsn": '{"columns":[["id","int64"],["name","string"],["source.lsn","int64"]],'
                  '"deleted":"(debezium delete)","key":["id"],"order":"source.lsn","version":1}',
    "ts_ms": '{"columns":[["id","int64"],["name","string"],["ts_ms","int64"]],'
             '"deleted":"(debezium delete)","key":["id"],"order":"ts_ms","version":1}',
    "source.lsn,ts_ms": '{"columns":[["id","int64"],["name","string"],["source.lsn","int64"],'
                        '["ts_ms","int64"]],"deleted":"(debezium delete)","key":["id"],'
                        '"order":["source.lsn","ts_ms"],"version":2}',
}
LATE_ORDERS = {  # the late rows' orders, as reads show them
    "source.lsn": [9, 8], "ts_ms": [1009, 1008],
    "source.lsn,ts_ms": [{"source.lsn": 9, "ts_ms": 1009}, {"source.lsn": 8, "ts_ms": 1008}],
}


def _e(op: str, lsn: int, **images: Any) -> dict[str, Any]:
    return {"op": op, "source": {"lsn": lsn, "db": "shop"}, "ts_ms": 1000 + lsn, **images}


FILES: list[list[dict[str, Any]]] = [
    [_e("r", 10, after={"id": 1, "name": "ann"}), _e("r", 11, after={"id": 2, "name": "bob"}),
     _e("r", 12, after={"id": 3, "name": "cy"})],
    [_e("u", 13, after={"id": 1, "name": "ann"}),  # only the order changes
     _e("u", 14, after={"id": 2, "name": "bobby"}),
     _e("u", 9, after={"id": 3, "name": "old"}),  # late
     _e("d", 15, before={"id": 3})],
    [_e("c", 16, after={"id": 4, "name": "dee"}), _e("u", 8, after={"id": 2, "name": "x"})],
]


def _old_shard(order: str) -> Shard:
    """A shard holding the options the release before stored: its first ingest."""
    shard = memory_shard()

    def as_before(state: ShardState) -> ShardState:
        return state.evolve(config={**state.config, **MAIN_ENTRIES[order]})

    shard.machine.apply(as_before)
    return shard


def _ingest(shard: Shard, root: Path, order: str) -> int:
    request = IngestRequest(key=("id",), envelope="debezium", order_scope="global", buckets=2,
                            order=None if order == "source.lsn" else order)
    return ingest(shard, str(root), request).errors


def _reads(shard: Shard) -> dict[str, Any]:
    """Everything reads show, at every ts."""
    table = ShardTable(shard)
    upper = shard.state().upper

    def rows(t: Any) -> list[Any]:
        return sorted(json.dumps(r, sort_keys=True, default=str) for r in t.to_pylist())

    return {
        "columns": table.schema.names,
        "snapshots": [rows(table.snapshot(ts)) for ts in range(upper)],
        "changes": [rows(table.changes(ts, ts + 1)) for ts in range(upper)],
        "late": table.late().to_pylist(),
        "errors": table.errors().to_pylist(),
        "inspect": {k: table.inspect()[k] for k in ("order", "columns", "envelope")},
    }


def _schema(shard: Shard) -> str:
    return shard.state().config[CONFIG_SCHEMA]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
@pytest.mark.parametrize("order", ["source.lsn", "ts_ms", "source.lsn,ts_ms"])
def test_a_shard_written_before_keeps_reading_and_ingesting_as_before(
    order: str, fmt: str
) -> None:
    old, new = _old_shard(order), memory_shard()
    with tempfile.TemporaryDirectory() as tmp_old, tempfile.TemporaryDirectory() as tmp_new:
        for i, events in enumerate(FILES):
            for root in (Path(tmp_old), Path(tmp_new)):
                if fmt == "jsonl":
                    write_events_jsonl(root, f"{i:04d}.jsonl", events)
                else:
                    write_events_parquet(root, f"{i:04d}.parquet", events)
            assert _ingest(old, Path(tmp_old), order) == 0
            assert _ingest(new, Path(tmp_new), order) == 0
            if i == 0:  # the release before would have stored exactly this
                assert _schema(old) == MAIN_SCHEMA[order]
    fields = order.split(",")
    stored = SourceSchema.from_json(_schema(old))
    assert not stored.envelope_order and set(fields) <= set(stored.names)  # its layout
    assert _schema(old).endswith(f'"version":{len(fields)}}}')
    fresh = SourceSchema.from_json(_schema(new))
    assert fresh.envelope_order and '"version":3' in _schema(new)
    assert {ENVELOPE_ORDER_PREFIX + f for f in fields} <= set(fresh.names)
    # what the user sees is the same (late orders of several fields named by the fields)
    assert _reads(old) == _reads(new)
    assert _reads(old)["columns"] == ["id", "name"]
    assert [r["order"] for r in _reads(old)["late"]] == LATE_ORDERS[order]
    assert old.check().ok and new.check().ok


def test_the_old_layout_keeps_its_error_rows_the_new_one_has_none() -> None:
    """In a shard written before, a field of ``after`` named like the order is still an
    error row (the stored layout has one column of that name); in a new shard it is the
    table's column."""
    events = [_e("r", 10, after={"id": 1, "ts_ms": 5}), _e("r", 11, after={"id": 2})]
    old, new = _old_shard("ts_ms"), memory_shard()
    with tempfile.TemporaryDirectory() as tmp:
        write_events_jsonl(Path(tmp), "0001.jsonl", events)
        assert _ingest(old, Path(tmp), "ts_ms") == 1
        assert _ingest(new, Path(tmp), "ts_ms") == 0
    [error] = ShardTable(old).errors().to_pylist()
    assert error["row"] == 1 and "named like the envelope's order" in error["reason"]
    assert ShardTable(old).snapshot().to_pylist() == [{"id": 2}]
    assert sorted(ShardTable(new).snapshot().to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "ts_ms": 5}, {"id": 2, "ts_ms": None}]
