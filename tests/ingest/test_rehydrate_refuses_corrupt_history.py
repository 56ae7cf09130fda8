"""Review 5: rehydration refuses a snapshot with a negative multiplicity.

docs/architecture.md ("Rehydration"): the rebuilt state is verified to be an upsert
collection, and a negative multiplicity raises ``InvalidUpsertState``: a corrupted
history is never decoded into a state. Rehydration read the snapshot with the default
``positive_only=True``, which drops negative rows before the verification sees them, so
a retraction of a row the key never held was silently ignored and the next ingest
built on the rest as if nothing were wrong.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from upsert_core.errors import IngestError, InvalidUpsertState
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.engine import InProcessEngine
from upsert_core.ingest.rehydrate import rehydrate_bucket
from upsert_core.landing import SourceSchema
from upsert_core.order_scope import OrderScope
from upsert_core.persist.state.state import HollowBatch
from upsert_core.persist.write.append import AppendRequest
from upsert_core.persist.write.consolidate import UPDATE_SCHEMA
from upsert_core.persist.write.parts import write_parts

from .helpers import memory_shard, schema_of, write_jsonl


@pytest.mark.parametrize("scope", ["batch", "global"])
def test_rehydration_refuses_a_negative_multiplicity(tmp_path: Path, scope: str) -> None:
    shard = memory_shard()
    write_jsonl(tmp_path, "0.jsonl", [{"key": 1, "offset": 1, "v": "a"}])
    ingest(shard, str(tmp_path), IngestRequest(order_scope=scope, buckets=1),
           engine=InProcessEngine(cache=None))
    state = shard.state()
    [[key, row]] = [
        (k, r) for b in shard.snapshot(0)
        for k, r in zip(b.column("key").to_pylist(), b.column("row").to_pylist(), strict=True)
    ]
    # A corrupt batch: key 1 retracts a row it never held (its own row, one byte longer).
    bogus = pa.table([pa.array([key]), pa.array([row + b"\x00"]), pa.array([1], pa.int64()),
                      pa.array([-1], pa.int64())], schema=UPDATE_SCHEMA)
    parts = write_parts(shard.blob, shard.shard_id, bogus)
    result = shard.compare_and_append(
        AppendRequest(HollowBatch(lower=1, upper=2, since=0, parts=parts), state.upper))
    assert result.committed
    state = shard.state()
    schema: SourceSchema = schema_of(shard)
    with pytest.raises(InvalidUpsertState):
        rehydrate_bucket(shard.blob, state, 0, 1, OrderScope(scope), schema)
    # The next ingest must rebuild the bucket (the checkpoints are not current): it stops
    # with the problem named instead of building on the corrupt history.
    write_jsonl(tmp_path, "1.jsonl", [{"key": 2, "offset": 1, "v": "b"}])
    with pytest.raises(IngestError, match="multiplicit"):
        ingest(shard, str(tmp_path), IngestRequest(), engine=InProcessEngine(cache=None))
    assert shard.state().upper == 2
