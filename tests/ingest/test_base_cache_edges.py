"""Edge cases of the local base cache (``ingest.base_cache``), found by a review of
its first version: no home directory, a lost base, malformed settings, a read-only
cache, two stores, an intact entry of another layout."""

from __future__ import annotations

import json
import pwd
from pathlib import Path

import pytest

from upsert_core.order_scope import OrderScope
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.base_cache import BaseCache
from upsert_core.ingest.checkpoint import CheckpointUnusable, load_checkpoint
from upsert_core.ingest.engine import InProcessEngine
from upsert_core.ingest.shard_config import ShardIngestConfig
from upsert_core.ingest.verify import compare_state
from upsert_core.persist.keys import checkpoint_prefix
from upsert_core.persist.location.blob_local import LocalBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.shard import Shard

from .helpers import write_jsonl

BUCKETS = 2
REQUEST = IngestRequest(order_scope="batch", buckets=BUCKETS, inline_threshold=0)


def _shard(tmp: Path) -> Shard:
    return Shard.open(MemoryConsensus(), LocalBlob(tmp / "blob"), "s")


def _two_files(landing: Path) -> None:
    landing.mkdir(parents=True, exist_ok=True)
    write_jsonl(landing, "000.jsonl", [{"key": k, "offset": 0, "v": f"v{k}"} for k in range(200)])
    # more than REPLAY_FRACTION of every bucket: each bucket writes a typed base at ts 1
    write_jsonl(landing, "001.jsonl", [{"key": k, "offset": 1, "v": f"w{k}"}
                                       for k in range(0, 200, 2)])


def _typed_base_refs(shard: Shard) -> dict[int, str]:
    refs = ShardIngestConfig.read(shard.state().config).checkpoint_refs
    return {b: r for b, r in refs.items() if r.startswith(checkpoint_prefix(shard.shard_id))}


def test_without_a_home_directory_the_cache_is_just_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The module promises "an unusable cache directory changes nothing", and Spark
    executors / containers often run as a uid without a passwd entry and without HOME.
    Then ``Path.home()`` raises RuntimeError inside ``load_checkpoint`` and the ingest
    fails instead of reading the blob."""
    landing = tmp_path / "landing"
    _two_files(landing)
    shard = _shard(tmp_path)
    monkeypatch.setenv("UPSERT_BASE_CACHE", "0")
    ingest(shard, str(landing), REQUEST, engine=InProcessEngine(cache=None))
    write_jsonl(landing, "002.jsonl", [{"key": 3, "offset": 2, "v": "x"}])
    # A fresh process as a uid with no passwd entry and no HOME (nor any cache setting).
    monkeypatch.delenv("UPSERT_BASE_CACHE")
    for name in ("HOME", "XDG_CACHE_HOME", "UPSERT_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)

    def no_entry(uid: int) -> pwd.struct_passwd:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    # Loads the bases (a cold engine), so the cache is consulted.
    ingest(shard, str(landing), REQUEST, engine=InProcessEngine(cache=None))
    assert shard.state().upper == 3


def test_a_lost_base_is_noticed_with_the_cache_as_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``load_checkpoint`` on the fetched path raises CheckpointUnusable("missing")
    for a base blob that is gone (the ingest then rebuilds the bucket and writes a new
    base; the state comparison reports it). The cached path never asks the blob store:
    on a machine that once read the base, a lost base is served from the cache, so
    ``compare_state`` (``upsertctl check``'s state part, the Dagster
    ``state_matches_shard`` checks) and the ingest treat a shard whose checkpoint is
    gone as healthy, and the ingest never repairs it (it keeps referencing the
    missing blob)."""
    monkeypatch.setenv("UPSERT_CACHE_DIR", str(tmp_path / "cache"))
    landing = tmp_path / "landing"
    _two_files(landing)
    shard = _shard(tmp_path)
    ingest(shard, str(landing), REQUEST, engine=InProcessEngine(cache=None))
    refs = _typed_base_refs(shard)
    assert refs, "the second file should write typed bases"
    for bucket, ref in refs.items():  # read once: now cached on this machine
        load_checkpoint(shard.blob, ref, "s", bucket, BUCKETS, OrderScope.BATCH)
        shard.blob.delete(ref)  # the base is lost from the blob store
    # The fetched path says so:
    monkeypatch.setenv("UPSERT_BASE_CACHE", "0")
    for bucket, ref in refs.items():
        with pytest.raises(CheckpointUnusable, match="missing"):
            load_checkpoint(shard.blob, ref, "s", bucket, BUCKETS, OrderScope.BATCH)
    without_cache = compare_state(shard)
    assert not without_cache.ok
    # The cached path must not say otherwise.
    monkeypatch.setenv("UPSERT_BASE_CACHE", "1")
    with_cache = compare_state(shard)
    assert with_cache.problems == without_cache.problems


def test_a_malformed_cache_setting_is_refused_before_anything_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A malformed UPSERT_BASE_CACHE_MB is refused (tested upstream), but only when a
    base is first loaded: an ingest commits the files before that and then stops in
    the middle of the run (compare ``engine.check_streaming_settings``, which refuses
    malformed streaming settings before anything commits)."""
    monkeypatch.setenv("UPSERT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("UPSERT_BASE_CACHE_MB", "lots")
    landing = tmp_path / "landing"
    _two_files(landing)
    write_jsonl(landing, "002.jsonl", [{"key": 3, "offset": 2, "v": "x"}])
    shard = _shard(tmp_path)
    try:
        ingest(shard, str(landing), REQUEST, engine=InProcessEngine(cache=None))
    except Exception as exc:  # noqa: BLE001 - whatever form the refusal takes
        refused = exc
    else:
        refused = None
    upper = shard.state().upper
    assert refused is None or upper == 0, (
        f"refused only after committing {upper} file(s): {refused!r}"
    )


def test_a_read_only_cache_entry_is_still_used_and_not_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache shared read-only (e.g. baked into an image, or another user's): ``get``
    verifies the whole entry and then fails on ``os.utime`` (not permitted), treats
    the entry as *damaged*, tries to delete it and returns None, so every process
    pays the CRC pass and the blob read: the read-only cache is never used. Checked
    by making utime fail as it does for a file of another owner."""
    import os

    cache = BaseCache(tmp_path / "cache" / "x", limit_bytes=1 << 30)
    import pyarrow as pa

    table = pa.table({"key": [b"k" * 16], "diff": [1]})
    cache.put(0, "base", table)

    def not_permitted(*args: object, **kwargs: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "utime", not_permitted)
    assert cache.get(0, "base") is not None, "a valid entry was discarded"


def test_cache_entries_of_two_stores_with_relative_homes_stay_apart(tmp_path: Path) -> None:
    """Two stores at different paths never share entries (the location is resolved)."""
    a = BaseCache.for_blob(LocalBlob(tmp_path / "a"), "s")
    b = BaseCache.for_blob(LocalBlob(tmp_path / "b"), "s")
    assert a is not None and b is not None and a.root != b.root
    assert json.dumps(str(a.root)) != json.dumps(str(b.root))


def test_an_unusable_but_intact_entry_falls_back_to_the_blob(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry that passes its CRC but does not load (written by another version that
    caches other columns, or whose metadata lies) makes ``load_checkpoint`` raise
    CheckpointUnusable, so the ingest REBUILDS the bucket from the shard, although the
    blob is fine; the entry is not deleted, so every later process rebuilds again.
    Expected: like a damaged entry, it is dropped and the blob read."""
    import pyarrow.parquet as pq

    monkeypatch.setenv("UPSERT_CACHE_DIR", str(tmp_path / "cache"))
    landing = tmp_path / "landing"
    _two_files(landing)
    shard = _shard(tmp_path)
    ingest(shard, str(landing), REQUEST, engine=InProcessEngine(cache=None))
    bucket, ref = sorted(_typed_base_refs(shard).items())[0]
    # An entry holding what the blob holds, with one more column (ts) read.
    full = pq.read_table(pa_buffer(shard.blob.get(ref)))
    BaseCache.for_blob(shard.blob, "s").put(bucket, ref, full)
    state = load_checkpoint(shard.blob, ref, "s", bucket, BUCKETS, OrderScope.BATCH)
    assert len(state) > 0


def pa_buffer(data: bytes):  # noqa: ANN201
    import pyarrow as pa

    return pa.BufferReader(data)
