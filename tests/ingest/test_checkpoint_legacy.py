"""Format-1 (Parquet of ``StateValue`` encodings) checkpoints, as the per-key engine
wrote them, load into the same state (global scope: orders and tombstones kept), and
malformed ones are refused with :class:`CheckpointUnusable`."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from tests.oracle.drain import GLOBAL_POSITION, OrderScope
from tests.oracle.state import StateValue
from upsert_core.columnar.checkpoint_format import METADATA_KEY
from upsert_core.ingest.buckets import bucket_of
from upsert_core.ingest.checkpoint import LEGACY_SCHEMA, CheckpointUnusable, load_checkpoint
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.write.parts import encode_parquet

BUCKETS = 4


def keys_of_bucket(bucket: int, n: int) -> list[bytes]:
    out = []
    i = 0
    while len(out) < n:
        k = (i * 0x9E3779B97F4A7C15 % 2**64).to_bytes(8, "big") + i.to_bytes(8, "big")
        if bucket_of(k, BUCKETS) == bucket:
            out.append(k)
        i += 1
    return out


def legacy_blob(items: list[tuple[bytes, StateValue]], scope: OrderScope, bucket: int = 1,
                meta: dict | None = None) -> tuple[MemoryBlob, str]:
    meta = meta or {"format": 1, "shard": "s", "bucket": bucket, "buckets": BUCKETS,
                    "order_scope": scope.value, "upper": 3}
    table = pa.table(
        [pa.array([k for k, _ in items], pa.binary()),
         pa.array([v.encode() for _, v in items], pa.binary())],
        schema=LEGACY_SCHEMA,
    ).replace_schema_metadata({METADATA_KEY: json.dumps(meta).encode()})
    blob = MemoryBlob()
    blob.set("ck", encode_parquet(table))
    return blob, "ck"


def test_global_scope_legacy_checkpoint_keeps_orders_and_tombstones() -> None:
    k = keys_of_bucket(1, 3)
    items = [  # unsorted on purpose, as the per-key backend iterated
        (k[2], StateValue.new_finalized_value(b"row2", (7, GLOBAL_POSITION))),
        (k[0], StateValue.finalized_tombstone((-5, GLOBAL_POSITION))),
        (k[1], StateValue.new_finalized_value(b"", (0, GLOBAL_POSITION))),
    ]
    blob, key = legacy_blob(items, OrderScope.GLOBAL)
    state = load_checkpoint(blob, key, "s", 1, BUCKETS, OrderScope.GLOBAL)
    assert list(state.items()) == sorted(
        [(k[2], b"row2", 7), (k[0], None, -5), (k[1], b"", 0)]
    )


def test_batch_scope_legacy_checkpoint() -> None:
    k = keys_of_bucket(1, 2)
    items = [(k[1], StateValue.new_finalized_value(b"b", None)),
             (k[0], StateValue.new_finalized_value(b"a", None))]
    blob, key = legacy_blob(items, OrderScope.BATCH)
    state = load_checkpoint(blob, key, "s", 1, BUCKETS, OrderScope.BATCH)
    assert list(state.items()) == sorted([(k[0], b"a", None), (k[1], b"b", None)])


@pytest.mark.parametrize("case", ["foreign", "duplicate", "tombstone_in_batch",
                                  "no_order_in_global", "consolidating", "wrong_meta"])
def test_malformed_legacy_checkpoints_are_unusable(case: str) -> None:
    k = keys_of_bucket(1, 2)
    scope = OrderScope.BATCH
    value = StateValue.new_finalized_value(b"a", None)
    items = [(k[0], value), (k[1], value)]
    meta = None
    if case == "foreign":
        items = [(keys_of_bucket(2, 1)[0], value)]
    elif case == "duplicate":
        items = [(k[0], value), (k[0], value)]
    elif case == "tombstone_in_batch":
        items = [(k[0], StateValue.finalized_tombstone(None))]
    elif case == "no_order_in_global":
        scope = OrderScope.GLOBAL
    elif case == "consolidating":
        items = [(k[0], StateValue.consolidating())]
    elif case == "wrong_meta":
        meta = {"format": 1, "shard": "s", "bucket": 2, "buckets": BUCKETS,
                "order_scope": "batch", "upper": 3}
    blob, key = legacy_blob(items, scope, meta=meta)
    with pytest.raises(CheckpointUnusable):
        load_checkpoint(blob, key, "s", 1, BUCKETS, scope)


def test_legacy_checkpoint_with_a_null_state_is_unusable() -> None:
    # StateValue.decode(None) raised a TypeError, which no caller catches: the ingest
    # crashed instead of rehydrating the bucket.
    k = keys_of_bucket(1, 1)
    meta = {"format": 1, "shard": "s", "bucket": 1, "buckets": BUCKETS,
            "order_scope": "batch", "upper": 3}
    table = pa.table([pa.array(k, pa.binary()), pa.array([None], pa.binary())],
                     schema=LEGACY_SCHEMA).replace_schema_metadata(
        {METADATA_KEY: json.dumps(meta).encode()})
    blob = MemoryBlob()
    blob.set("ck", encode_parquet(table))
    with pytest.raises(CheckpointUnusable):
        load_checkpoint(blob, "ck", "s", 1, BUCKETS, OrderScope.BATCH)
