"""What the blocking checks cost as a shard ages: ``python -m bench.check_cost [--quick]``.

:func:`check_seconds_at` builds a shard with ``ts_count`` batches at the same data rate
(``rows_per_batch`` rows per landing file over ``keys`` keys: 90% upserts, 10% deletes,
random keys; the in-process engine, in-memory Consensus and Blob so no disk noise), then
times, for the last batch only:

- the blocking batch-scoped checks (``ingest.verify.check_new_batch``, what the Dagster
  ingest job runs after every run), best of a few repetitions;
- the full-history check (``persist.maintenance.check.check_shard`` +
  ``ingest.verify.compare_state``, what ``upsertctl check`` and the scheduled
  ``<source>_full_check`` job run), once.

The blocking check should cost the same at ts 10 and ts 1,000 (its cost follows the
batch and the touched buckets' states); the full check grows with the history.
``bench/latency.py`` calls :func:`check_seconds_at`.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.verify import check_new_batch, compare_state
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.maintenance.check import check_shard
from upsert_core.persist.shard import Shard

REPEATS = 5


def _write_batches(root: Path, ts_count: int, rows_per_batch: int, keys: int) -> None:
    root.mkdir(parents=True)
    rng = np.random.default_rng(7)
    for i in range(ts_count):
        key = rng.integers(0, keys, rows_per_batch)
        offset = np.arange(i * rows_per_batch, (i + 1) * rows_per_batch, dtype=np.int64)
        table = pa.table({
            "key": pa.array(key, pa.int64()),
            "offset": pa.array(offset),
            "value": pa.array([f"v{i}-{k}" for k in key.tolist()]),
            "__deleted": pa.array(rng.random(rows_per_batch) < 0.1),
        })
        pq.write_table(table, root / f"{i:07d}.parquet")


def _best(fn: object, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - started)
    return min(times)


def check_seconds_at(
    ts_count: int, rows_per_batch: int, keys: int, *, full: bool = True,
    gc_every: int | None = 100,
) -> dict[str, float | int]:
    """Build a shard of ``ts_count`` batches and time the checks of its last batch.

    ``gc_every``: run ``gc`` (compaction, rollups: what the ``rollup_gc`` schedule
    does) after every that many batches, never after the last one (None: never; the
    shard's state then lists one batch per ts and fetching it grows with the history).

    Returns ``ts_count``, ``rows_per_batch``, ``keys``, ``build_seconds``,
    ``blocking_seconds`` (best of :data:`REPEATS`), ``state_seconds`` (of that, about
    what fetching the shard's current state costs), ``touched_buckets``,
    ``new_updates``, ``batches`` and, with ``full``, ``full_seconds`` (one run). Raises
    AssertionError if a check finds a problem (the shard is built by the ingest)."""
    root = Path(tempfile.mkdtemp(prefix="check-cost-"))
    try:
        _write_batches(root / "all", ts_count, rows_per_batch, keys)
        landing = root / "landing"
        landing.mkdir()
        shard = Shard.open(MemoryConsensus(), MemoryBlob(), "bench")
        started = time.perf_counter()
        files = sorted((root / "all").iterdir())
        step = gc_every or len(files)
        for start in range(0, len(files), step):
            for file in files[start:start + step]:
                file.rename(landing / file.name)
            ingest(shard, str(landing), IngestRequest(key=("key",), order="offset"),
                   engine=None)
            if gc_every and start + step < len(files):
                shard.gc()  # what the rollup_gc schedule does: compaction and rollups
        build = time.perf_counter() - started
    finally:
        shutil.rmtree(root, ignore_errors=True)
    upper = shard.state().upper
    assert upper == ts_count, (upper, ts_count)
    report = check_new_batch(shard, upper - 1, upper)
    assert report.ok and not report.notes, (report.problems, report.notes)
    out: dict[str, float | int] = {
        "ts_count": ts_count,
        "rows_per_batch": rows_per_batch,
        "keys": keys,
        "build_seconds": build,
        "blocking_seconds": _best(lambda: check_new_batch(shard, upper - 1, upper), REPEATS),
        "state_seconds": _best(shard.state, REPEATS),
        "batches": len(shard.state().batches),
        "touched_buckets": report.counts.get("touched_buckets", 0),
        "new_updates": report.counts.get("new_updates", 0),
    }
    if full:
        started = time.perf_counter()
        full_report = check_shard(shard)
        compared = compare_state(shard)
        out["full_seconds"] = time.perf_counter() - started
        assert full_report.ok and compared.ok, (full_report.problems, compared.problems)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="ts 10 and 100 instead of 1,000")
    parser.add_argument("--rows", type=int, default=1_000, help="rows per batch")
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--gc-every", type=int, default=100,
                        help="run gc after every N batches (0: never)")
    args = parser.parse_args()
    late = 100 if args.quick else 1_000
    results = [check_seconds_at(ts, args.rows, args.keys, gc_every=args.gc_every or None)
               for ts in (10, late)]
    for r in results:
        print(
            f"ts {r['ts_count']:>5}: blocking check {r['blocking_seconds'] * 1000:7.1f} ms"
            f" (fetching the shard state {r['state_seconds'] * 1000:.1f} ms,"
            f" {r['batches']} batches; {r['new_updates']} updates,"
            f" {r['touched_buckets']} buckets), full check"
            f" {r['full_seconds'] * 1000:8.1f} ms (shard built in {r['build_seconds']:.1f} s)"
        )
    early, last = results
    print(f"blocking ratio ts {late} / ts 10: "
          f"{last['blocking_seconds'] / early['blocking_seconds']:.2f}"
          f"  (full check: {last['full_seconds'] / early['full_seconds']:.1f})")


if __name__ == "__main__":
    main()
