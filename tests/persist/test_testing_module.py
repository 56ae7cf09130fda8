"""``upsert_core.persist.testing``: the delegating blob forwards, and the leak finder
reports exactly the data blobs no live state references."""

from __future__ import annotations

from upsert_core.persist.keys import shard_prefix
from upsert_core.persist.location import RangedBlob
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.shard import Shard
from upsert_core.persist.testing import DelegatingBlob, unreferenced_blobs
from upsert_core.persist.write.parts import write_parts

from .test_parts import key, updates_table


def test_delegating_blob_forwards_the_four_calls_and_offers_no_ranged_reads() -> None:
    inner = MemoryBlob()
    blob = DelegatingBlob(inner)
    blob.set("a/x", b"1")
    assert inner.get("a/x") == b"1" and blob.get("a/x") == b"1"
    assert [m.key for m in blob.list_keys("a/")] == ["a/x"]
    assert blob.delete("a/x") == 1 and blob.get("a/x") is None
    assert not isinstance(blob, RangedBlob)  # reads go through get (and its overrides)


def test_unreferenced_blobs_reports_only_data_blobs_no_state_references() -> None:
    blob = MemoryBlob()
    shard = Shard.open(MemoryConsensus(), blob, "s", inline_threshold=0)
    rows = updates_table([(key(i), b"v", 0, 1) for i in range(5)])
    assert shard.append(rows, 0).committed
    assert unreferenced_blobs(shard) == set()
    (leaked,) = write_parts(blob, "s", rows, inline_threshold=0)  # written, never committed
    assert unreferenced_blobs(shard) == {leaked.key}  # type: ignore[union-attr]
    assert unreferenced_blobs(shard, ("checkpoint",)) == set()
    blob.set(shard_prefix("s") + "unrelated", b"x")  # not a data kind: never reported
    assert unreferenced_blobs(shard) == {leaked.key}  # type: ignore[union-attr]
