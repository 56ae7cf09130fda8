"""Shared pieces of the fault-injection tests: a seeded landing, a clean reference
ingest of it, and the one assertion every fault case ends with.

``assert_recovered(shard, reference)`` is the promise of issue 6 part 3: after the fault
and the user's re-run (+ ``gc`` with grace 0), the shard

- passes ``check_shard`` (consolidation and storage) and ``compare_state`` (the upsert
  state checkpoints equal the shard);
- has the clean reference's history, timestamp by timestamp from its since (snapshot and
  changes), so nothing was applied twice and nothing was lost;
- records the same ingested files at the same timestamps, the same error rows and the
  same late rows (of the batches from its since on), exactly once each;
- holds no blob that no live state references (nothing leaked).
"""

from __future__ import annotations

import random
import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.ingest.helpers import change_rows, snapshot_rows, write_jsonl
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.verify import compare_state
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.maintenance.check import check_shard
from upsert_core.persist.shard import Shard
from upsert_core.persist.testing import unreferenced_blobs
from upsert_core.shard_table import ShardTable

REQUEST = IngestRequest(key=("key",), order="offset", buckets=2, inline_threshold=256)
"""Small inline threshold so most batches write real part blobs (more blob traffic)."""
GLOBAL_REQUEST = IngestRequest(key=("key",), order="offset", buckets=2, inline_threshold=256,
                               order_scope="global")
""":data:`REQUEST` in the global order scope: random offsets make many late rows."""


def make_landing(root: Path, *, files: int, rows: int, keys: int, seed: int) -> Path:
    """``files`` JSON Lines batches of upserts, deletes and one bad row each."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        batch: list[dict[str, Any]] = []
        for r in range(rows):
            key = rng.randrange(keys)
            row: dict[str, Any] = {"key": key, "offset": rng.randrange(1000)}
            if rng.random() < 0.15:
                row["__deleted"] = True
            else:
                row["v"] = f"f{f}-r{r}-{rng.randrange(10**6)}"
            batch.append(row)
        batch.append({"key": None, "offset": f})  # one row error per file
        write_jsonl(root, f"{f:03d}.jsonl", batch)
    return root


def reference_shard(landing: Path, request: IngestRequest = REQUEST) -> Shard:
    """A clean, fault-free ingest of ``landing`` into memory stores."""
    shard = Shard.open(MemoryConsensus(), MemoryBlob(), "reference")
    ingest(shard, str(landing), request)
    return shard


def error_rows(shard: Shard) -> Counter[tuple[object, object, object]]:
    return Counter((e["file"], e["row"], e["reason"]) for e in shard.errors())


def assert_recovered(shard: Shard, reference: Shard) -> None:
    """See the module docstring; runs ``gc`` (grace 0) first."""
    shard.gc(leak_grace_ms=0)
    report = check_shard(shard)
    assert report.ok, report.problems
    comparison = compare_state(shard)
    assert comparison.ok, comparison.problems
    state, ref_state = shard.state(), reference.state()
    assert state.upper == ref_state.upper
    assert dict(state.ingested_files) == dict(ref_state.ingested_files)
    for ts in range(state.since, state.upper):
        assert snapshot_rows(shard, ts) == snapshot_rows(reference, ts), f"snapshot at {ts}"
        if ts > state.since:  # changes at since include the compacted history before it
            assert change_rows(shard, ts) == change_rows(reference, ts), f"changes at {ts}"
    errors = error_rows(shard)
    assert errors == error_rows(reference)
    assert all(n == 1 for n in errors.values()), "an error row was recorded twice"
    files = state.ingested_files
    late = list(ShardTable(shard).late_records())
    assert late == [r for r in ShardTable(reference).late_records()
                    if files[r["file"]] >= state.since]
    assert not unreferenced_blobs(shard)


@contextmanager
def reaped(proc: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """``proc`` for the ``with`` block; killed and waited for if still running after it
    (a failing test must not leave an ingest running into the next one)."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
