"""The bucket-state cache and incremental checkpoints: a cached state is used only when
the shard's commit history vouches for it, catches up by replay after another writer's
commit, is never used after a lost race or once its checkpoint is gone; a base plus
replayed changes equals a current checkpoint, cold or cached."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from upsert_core.ingest import IngestRequest, InProcessEngine, ingest
from upsert_core.ingest.checkpoint import new_state
from upsert_core.ingest.pipeline import commit_history
from upsert_core.ingest.shard_config import (
    CONFIG_HISTORY,
    checkpoint_base_name,
    checkpoint_ref_name,
)
from upsert_core.ingest.statecache import CachedState, StateCache
from upsert_core.ingest.tasks import REPLAY_FRACTION, Base
from upsert_core.order_scope import OrderScope
from upsert_core.persist.location import Blob
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.leases import DEFAULT_LEASE_DURATION_MS
from upsert_core.persist.state.state import ShardState
from upsert_core.persist.write.append import AppendRequest, AppendResult
from upsert_core.persist.write.writers import WriterLease

from .helpers import change_rows, contents, memory_shard, snapshot_rows, write_jsonl

KEYS = 120  # enough that 3 small files stay within REPLAY_FRACTION of each base


def _dirs(root: Path) -> dict[str, Path]:
    """Landing dirs: ``f0``..``f3`` set every key, ``x`` deletes key 1 and changes key 2."""
    out = {}
    for i in range(4):
        d = root / f"f{i}"
        d.mkdir()
        write_jsonl(d, f"{i}0.jsonl", [{"key": k, "offset": i, "v": f"{i}"} for k in range(KEYS)])
        out[f"f{i}"] = d
    x = root / "x"
    x.mkdir()
    write_jsonl(x, "x.jsonl", [{"key": 1, "offset": 0, "__deleted": True},
                               {"key": 2, "offset": 0, "v": "x"}])
    out["x"] = x
    return out


def _small(root: Path, i: int) -> Path:
    """A landing dir with one file changing 3 keys (one of them deleted)."""
    d = root / f"small{i}"
    d.mkdir()
    write_jsonl(d, f"s{i}.jsonl", [{"key": i, "offset": 9, "v": "s"},
                                   {"key": i + 7, "offset": 9, "v": "t"},
                                   {"key": i + 13, "offset": 9, "__deleted": True}])
    return d


def _pair() -> tuple[Shard, Shard]:
    consensus, blob = MemoryConsensus(), MemoryBlob()
    return Shard.open(consensus, blob, "s"), Shard.open(consensus, blob, "s")


def _reference(order: Sequence[Path], scope: str) -> Shard:
    shard = memory_shard("reference")
    for d in order:
        ingest(shard, str(d), IngestRequest(order_scope=scope), engine=InProcessEngine(cache=None))
    return shard


class RacedShard:
    """A handle whose next append first lets another writer commit ``racer_dir``."""

    def __init__(self, shard: Shard, racer: Shard, racer_dir: Path) -> None:
        self.shard, self.racer, self.racer_dir = shard, racer, racer_dir
        self.armed = True

    @property
    def shard_id(self) -> str:
        return self.shard.shard_id

    @property
    def blob(self) -> Blob:
        return self.shard.blob

    def state(self) -> ShardState:
        return self.shard.state()

    def compare_and_append(
        self,
        request: AppendRequest,
        *,
        writer_id: str | None = None,
    ) -> AppendResult:
        if self.armed:
            self.armed = False
            ingest(self.racer, str(self.racer_dir), IngestRequest())
        return self.shard.compare_and_append(request, writer_id=writer_id)

    def writer_lease(self, lease_duration_ms: int = DEFAULT_LEASE_DURATION_MS) -> WriterLease:
        return self.shard.writer_lease(lease_duration_ms)


@pytest.mark.parametrize("scope", ["batch", "global"])
def test_a_lost_race_never_leaves_a_usable_cache_entry(tmp_path: Path, scope: str) -> None:
    dirs = _dirs(tmp_path)
    small = _small(tmp_path, 1)
    a, b = _pair()
    engine = InProcessEngine()
    ingest(a, str(dirs["f0"]), IngestRequest(order_scope=scope), engine=engine)
    # A drains `small` at ts 1 and caches the result under its nonce; B commits x at
    # ts 1 first, so A's append fails and it retries at ts 2. Had A reused its cached
    # state (key 1 set to "s"), it would emit nothing for key 1, which x deleted. The
    # files are small, so the batch scope keeps its bases: only the nonce tells.
    report = ingest(RacedShard(a, b, dirs["x"]), str(small), IngestRequest(), engine=engine)
    assert [f.attempts for f in report.files] == [2]
    assert contents(a) == contents(_reference([dirs["f0"], dirs["x"], small], scope))


def test_cached_states_catch_up_by_replay_after_another_writer(tmp_path: Path) -> None:
    dirs = _dirs(tmp_path)
    a, b = _pair()
    engine = InProcessEngine()
    assert engine.cache is not None
    ingest(a, str(dirs["f0"]), IngestRequest(), engine=engine)
    ingest(b, str(dirs["x"]), IngestRequest())
    hits = engine.cache.hits
    report = ingest(a, str(dirs["f1"]), IngestRequest(), engine=engine)
    assert engine.cache.hits > hits and not report.rehydrations
    assert contents(a) == contents(_reference([dirs["f0"], dirs["x"], dirs["f1"]], "batch"))


def test_global_scope_uses_only_exact_cache_entries(tmp_path: Path) -> None:
    dirs = _dirs(tmp_path)
    a, b = _pair()
    engine = InProcessEngine()
    assert engine.cache is not None
    ingest(a, str(dirs["f0"]), IngestRequest(order_scope="global"), engine=engine)
    ingest(a, str(dirs["f1"]), IngestRequest(), engine=engine)
    assert engine.cache.hits == 4  # every bucket of f1 came from the cache
    ingest(b, str(dirs["x"]), IngestRequest())
    ingest(a, str(dirs["f2"]), IngestRequest(), engine=engine)
    assert engine.cache.hits == 4  # one commit behind: loaded from checkpoints instead
    reference = _reference([dirs["f0"], dirs["f1"], dirs["x"], dirs["f2"]], "global")
    assert contents(a) == contents(reference)


def test_cache_is_not_used_once_the_checkpoint_is_gone(tmp_path: Path) -> None:
    dirs = _dirs(tmp_path)
    shard = memory_shard()
    engine = InProcessEngine()
    ingest(shard, str(dirs["f0"]), IngestRequest(), engine=engine)
    config = shard.state().config
    for b in range(4):
        shard.blob.delete(config[checkpoint_ref_name(b)])
    report = ingest(shard, str(dirs["f1"]), IngestRequest(), engine=engine)
    assert any("is missing" in note for note in report.rehydrations)
    assert contents(shard) == contents(_reference([dirs["f0"], dirs["f1"]], "batch"))


def test_bases_are_kept_and_replayed_cold_with_the_same_result(tmp_path: Path) -> None:
    dirs = _dirs(tmp_path)
    shard = memory_shard()
    ingest(shard, str(dirs["f0"]), IngestRequest(), engine=InProcessEngine())
    refs = {b: shard.state().config[checkpoint_ref_name(b)] for b in range(4)}
    order = [dirs["f0"]]
    for i in range(1, 4):
        order.append(_small(tmp_path, i))
        # A fresh engine each time: no cache, so the base is loaded and replayed.
        report = ingest(shard, str(order[-1]), IngestRequest(), engine=InProcessEngine())
        assert not report.rehydrations
    config = shard.state().config
    assert {b: config[checkpoint_ref_name(b)] for b in range(4)} == refs  # bases kept
    bases = [Base.decode(config[checkpoint_base_name(b)], 4) for b in range(4)]
    assert all(base.as_of == 1 for base in bases) and sum(b.rows for b in bases) == KEYS
    assert sum(base.pending for base in bases) == 3 * (2 * 2 + 1)  # per file: 2 set, 1 del
    assert sorted(commit_history(config)) == [1, 2, 3, 4] and CONFIG_HISTORY in config
    assert contents(shard) == contents(_reference(order, "batch"))

    # Once compaction moved the since past the bases, their changes are gone: rehydrate.
    shard.gc(retain=1)
    assert shard.state().since == 3
    order.append(dirs["f3"])
    report = ingest(shard, str(dirs["f3"]), IngestRequest(), engine=InProcessEngine())
    assert report.rehydrations
    reference = _reference(order, "batch")
    assert snapshot_rows(shard, 4) == snapshot_rows(reference, 4)
    assert change_rows(shard, 4) == change_rows(reference, 4)


def test_bases_are_rewritten_once_the_pending_updates_outgrow_them(tmp_path: Path) -> None:
    dirs = _dirs(tmp_path)
    shard = memory_shard()
    engine = InProcessEngine()
    for name in ("f0", "f1", "f2", "f3"):
        ingest(shard, str(dirs[name]), IngestRequest(), engine=engine)
        config = shard.state().config
        for b in range(4):
            base = Base.decode(config[checkpoint_base_name(b)], shard.state().upper)
            assert base.pending <= REPLAY_FRACTION * base.rows
    # Every key changes in every file (2 updates per key), so f2 had to write new bases.
    assert all(Base.decode(config[checkpoint_base_name(b)], 4).as_of >= 3 for b in range(4))


def test_state_cache_take_checks_history_upper_and_scope() -> None:
    cache = StateCache(max_keys=100)
    key = ("s", 0, 4, "batch")
    state = new_state(OrderScope.BATCH)
    cache.put(key, CachedState(state, upper=3, nonce="n3", checkpoint="ck"))
    assert cache.take(key, 3, {3: "other"}, exact=True) is None  # another writer's commit
    assert cache.take(key, 2, {3: "n3"}, exact=False) is None  # newer than asked for
    assert cache.take(key, 4, {3: "n3"}, exact=True) is None  # behind, replay not allowed
    assert cache.take(("s", 1, 4, "batch"), 3, {3: "n3"}, exact=True) is None
    entry = cache.take(key, 4, {3: "n3", 4: "n4"}, exact=False)
    assert entry is not None and entry.state is state
    assert cache.take(key, 4, {3: "n3"}, exact=False) is None  # taken means gone


def test_state_cache_evicts_beyond_its_key_budget() -> None:
    import pyarrow as pa

    from upsert_core.columnar import ColumnarState, split_keys

    cache = StateCache(max_keys=3)
    for b in range(3):
        hi, lo = split_keys(pa.array([bytes([b]) * 16, bytes([b + 10]) * 16], pa.binary()))
        state = ColumnarState.checked(hi, lo, pa.array([b"r", b"r"]), None)
        cache.put(("s", b, 4, "batch"), CachedState(state, 1, "n", ""))
    assert len(cache) == 1  # 2 keys each: only the newest fits in 3
    assert cache.take(("s", 2, 4, "batch"), 1, {1: "n"}, exact=True) is not None
