"""Ingest through seeded unreliable stores (fail, timeout, did-then-timeout), retried by
re-running the ingest until it is done: the final shard equals a clean ingest.

Runs on memory stores and on SQLite + local files. Every failure a run sees must be a
platform error with a message (what the user would read), never a stray exception."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from upsert_core.errors import UpsertPlatformError
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.persist.location import Blob, Consensus
from upsert_core.persist.location.blob_local import LocalBlob
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.location.consensus_sql import SqlConsensus
from upsert_core.persist.location.unreliable import FaultRates, UnreliableBlob, UnreliableConsensus
from upsert_core.persist.shard import Shard
from upsert_core.shard_table import ShardTable

from .helpers import GLOBAL_REQUEST, REQUEST, assert_recovered, make_landing, reference_shard

MAX_RUNS = 400


def _stores(kind: str, tmp_path: Path) -> tuple[Consensus, Blob]:
    if kind == "memory":
        return MemoryConsensus(), MemoryBlob()
    return SqlConsensus(f"sqlite:///{tmp_path}/consensus.db"), LocalBlob(tmp_path / "blob")


def _ingest_until_done(
    consensus: UnreliableConsensus, blob: UnreliableBlob, landing: Path,
    request: IngestRequest = REQUEST,
) -> tuple[int, Counter[str]]:
    """Re-run the ingest (opening the shard anew each time) until a run succeeds."""
    failures: Counter[str] = Counter()
    for run in range(1, MAX_RUNS + 1):
        try:
            shard = Shard.open(consensus, blob, "flaky")
            ingest(shard, str(landing), request)
            return run, failures
        except UpsertPlatformError as exc:
            message = str(exc)
            assert message.strip(), f"{type(exc).__name__} without a message"
            assert len(message.strip().splitlines()) == 1, message
            failures[type(exc).__name__] += 1
    raise AssertionError(f"no ingest run completed in {MAX_RUNS} runs: {failures}")


@pytest.mark.parametrize("kind", ["memory", "sqlite_local"])
@pytest.mark.parametrize(("seed", "request_"), [(1, REQUEST), (2, REQUEST), (3, REQUEST),
                                                (4, GLOBAL_REQUEST)])
def test_ingest_through_unreliable_stores_equals_clean_ingest(
    tmp_path: Path, kind: str, seed: int, request_: IngestRequest
) -> None:
    """Seed 4 in the global order scope: late rows are committed exactly once too."""
    landing = make_landing(tmp_path / "landing", files=6, rows=40, keys=25, seed=seed)
    reference = reference_shard(landing, request_)
    inner_consensus, inner_blob = _stores(kind, tmp_path)
    rates = FaultRates(fail=0.03, timeout=0.03, effect_then_timeout=0.03)
    consensus = UnreliableConsensus(inner_consensus, seed=seed, rates=rates)
    blob = UnreliableBlob(inner_blob, seed=seed + 100, rates=rates)

    runs, failures = _ingest_until_done(consensus, blob, landing, request_)

    injected = Counter(consensus.injected) + Counter(blob.injected)
    assert sum(injected.values()) > 0, "the seed injected no fault: the test proves nothing"
    assert runs > 1 and sum(failures.values()) == runs - 1
    # A run after success has nothing pending: it must not move the upper.
    consensus.enabled = blob.enabled = False
    shard = Shard.open(inner_consensus, inner_blob, "flaky", create=False)
    upper = shard.upper
    ingest(shard, str(landing), request_)
    assert shard.upper == upper
    assert_recovered(shard, reference)
    if request_ is GLOBAL_REQUEST:  # the landing made late rows for it to compare
        assert ShardTable(reference).late().num_rows > 0


def test_effect_then_timeout_on_every_write_still_applies_each_file_once(tmp_path: Path) -> None:
    """The nastiest fault only: every write succeeds and then reports a timeout."""
    landing = make_landing(tmp_path / "landing", files=3, rows=20, keys=10, seed=9)
    reference = reference_shard(landing)
    inner_consensus, inner_blob = MemoryConsensus(), MemoryBlob()
    rates = FaultRates(fail=0.0, timeout=0.0, effect_then_timeout=0.5)
    consensus = UnreliableConsensus(inner_consensus, seed=5, rates=rates)
    blob = UnreliableBlob(inner_blob, seed=6, rates=rates)
    runs, _ = _ingest_until_done(consensus, blob, landing)
    assert runs > 1
    shard = Shard.open(inner_consensus, inner_blob, "flaky", create=False)
    assert_recovered(shard, reference)


@pytest.mark.parametrize("seed", range(1, 5))
def test_ingest_and_gc_with_commits_seen_late_lose_nothing(tmp_path: Path, seed: int) -> None:
    """Commits that time out and are missed by the next read (a lagging replica),
    through ingest and then GC (compaction, rollups, truncation) under the same faults:
    nothing referenced is deleted, each file is applied once, and GC then leaves
    exactly the referenced blobs. (A guard for the whole path; the data is small, so
    merged batches are mostly inline and the compaction regression itself is pinned
    by ``tests/persist/test_compact.py``.)"""
    landing = make_landing(tmp_path / "landing", files=6, rows=40, keys=25, seed=seed)
    reference = reference_shard(landing)
    inner_consensus, inner_blob = MemoryConsensus(), MemoryBlob()
    rates = FaultRates(fail=0.02, timeout=0.02, effect_then_timeout=0.2)
    consensus = UnreliableConsensus(inner_consensus, seed=seed, rates=rates, stale_reads=1)
    blob = UnreliableBlob(inner_blob, seed=seed + 100, rates=FaultRates(0.02, 0.02, 0.02))
    _ingest_until_done(consensus, blob, landing)
    for _ in range(20):
        try:
            Shard.open(consensus, blob, "flaky", create=False).gc(retain=2, leak_grace_ms=0)
            break
        except UpsertPlatformError:
            continue
    else:
        raise AssertionError("no GC run completed in 20 runs")
    assert consensus.stale_reads_served > 0
    shard = Shard.open(inner_consensus, inner_blob, "flaky", create=False)
    assert_recovered(shard, reference)
