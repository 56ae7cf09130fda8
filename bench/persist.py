"""Benchmark of the persist layer: commits, snapshot reads and GC.

(a) Compare-and-set latency (p50, p99) and commits/s of state transitions (one small
    config change each, so each is one diff and one compare-and-set; automatic rollups
    off) on SQLite (a file in a temp dir) and on the local PostgreSQL (a fresh schema,
    dropped afterwards).
(b) Snapshot read throughput (rows/s, MB/s of Arrow data) of a shard of N distinct keys
    in 4 batches on local files, against reading the same Parquet parts with plain
    pyarrow (``pq.read_table`` per file): the floor. The ratio is shard time / pyarrow
    time (target: under 1.5).
(c) GC time for a shard with V versions on SQLite + local files (mostly small config
    changes, a one-row append every 20th version), including its compaction.

Usage: ``.venv/bin/python -m bench.persist [--quick]``. ``--quick`` (under a minute):
200 commits, N=300,000, V=2,000; the default: 1,000 commits, N=2,000,000, V=10,000.
Progress goes to stderr; the last line printed is one JSON object with every figure
(``snapshot_read_ratio_vs_pyarrow``, ``postgres_commit_ms_p50``, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from upsert_core.persist.blob_local import LocalBlob
from upsert_core.persist.consensus_sql import SqlConsensus
from upsert_core.persist.location import Blob, Consensus
from upsert_core.persist.shard import Shard
from upsert_core.persist.state import BlobPart, ShardState

PG_DSN = os.environ.get("UPSERT_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def bump(state: ShardState) -> ShardState:
    n = int(state.config.get("n", "0")) + 1
    return state.evolve(config={**state.config, "n": str(n)})


# --- (a) commits ---------------------------------------------------------------------------


def commit_latency(consensus: Consensus, blob: Blob, commits: int) -> dict[str, float]:
    shard = Shard.open(consensus, blob, f"cas-{uuid.uuid4().hex[:8]}", rollup_every=10**9)
    machine = shard.machine
    for _ in range(10):  # warm up connections and caches
        machine.apply(bump)
    times = np.empty(commits)
    started = time.perf_counter()
    for i in range(commits):
        t0 = time.perf_counter()
        machine.apply(bump)
        times[i] = time.perf_counter() - t0
    total = time.perf_counter() - started
    return {
        "commit_ms_p50": round(float(np.percentile(times, 50)) * 1000, 3),
        "commit_ms_p99": round(float(np.percentile(times, 99)) * 1000, 3),
        "commits_per_s": round(commits / total, 1),
    }


def postgres_figures(commits: int, blob: Blob) -> dict[str, float | None]:
    try:
        import psycopg

        admin = psycopg.connect(PG_DSN, autocommit=True, connect_timeout=5)
    except Exception as exc:  # a missing server is reported, not fatal
        log(f"PostgreSQL not reachable at {PG_DSN}: {exc}")
        return {"commit_ms_p50": None, "commit_ms_p99": None, "commits_per_s": None}
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    admin.execute(f'CREATE SCHEMA "{schema}"')
    try:
        url = PG_DSN.replace("postgresql://", "postgresql+psycopg://", 1)
        url += ("&" if "?" in url else "?") + "options=" + quote(f"-csearch_path={schema}")
        consensus = SqlConsensus(url)
        try:
            return dict(commit_latency(consensus, blob, commits))
        finally:
            consensus.close()
    finally:
        admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.close()


# --- (b) snapshot reads ---------------------------------------------------------------------


def build_read_shard(root: Path, n: int) -> Shard:
    consensus = SqlConsensus(f"sqlite:///{root}/read.db")
    shard = Shard.open(consensus, LocalBlob(root / "blob"), "reads")
    rng = np.random.default_rng(7)
    keys = rng.bytes(16 * n)
    per_batch = n // 4
    for b in range(4):
        lo, hi = b * per_batch, (n if b == 3 else (b + 1) * per_batch)
        count = hi - lo
        table = pa.table({
            "key": pa.array([keys[16 * i:16 * i + 16] for i in range(lo, hi)], pa.binary()),
            "row": pa.array([b"row-%d-%s" % (i, b"x" * 40) for i in range(lo, hi)],
                            pa.binary()),
            "ts": pa.array(np.full(count, b, dtype=np.int64)),
            "diff": pa.array(np.ones(count, dtype=np.int64)),
        })
        assert shard.append(table, b).committed
    return shard


def read_figures(root: Path, n: int) -> dict[str, float]:
    log(f"snapshot: writing {n:,} rows in 4 batches")
    shard = build_read_shard(root, n)
    state = shard.state()
    paths = [
        root / "blob" / part.key
        for batch in state.batches for part in batch.parts if isinstance(part, BlobPart)
    ]
    assert all(p.exists() for p in paths), "parts are not files where LocalBlob keeps them"

    def shard_read() -> tuple[int, int]:
        rows = nbytes = 0
        for batch in shard.snapshot(state.upper - 1):
            rows += batch.num_rows
            nbytes += batch.nbytes
        return rows, nbytes

    def pyarrow_read() -> tuple[int, int]:
        rows = nbytes = 0
        for path in paths:
            table = pq.read_table(path)
            rows += table.num_rows
            nbytes += table.nbytes
        return rows, nbytes

    def best_of(fn: object, runs: int = 3) -> tuple[float, int, int]:
        best = float("inf")
        rows = nbytes = 0
        for _ in range(runs):
            t0 = time.perf_counter()
            rows, nbytes = fn()  # type: ignore[operator]
            best = min(best, time.perf_counter() - t0)
        return best, rows, nbytes

    shard_s, shard_rows, shard_bytes = best_of(shard_read)
    arrow_s, arrow_rows, arrow_bytes = best_of(pyarrow_read)
    assert shard_rows == arrow_rows == n, (shard_rows, arrow_rows, n)
    return {
        "snapshot_rows": n,
        "snapshot_seconds": round(shard_s, 4),
        "snapshot_rows_per_s": round(shard_rows / shard_s),
        "snapshot_mb_per_s": round(shard_bytes / shard_s / 1e6, 1),
        "pyarrow_seconds": round(arrow_s, 4),
        "pyarrow_rows_per_s": round(arrow_rows / arrow_s),
        "pyarrow_mb_per_s": round(arrow_bytes / arrow_s / 1e6, 1),
        "snapshot_read_ratio_vs_pyarrow": round(shard_s / arrow_s, 3),
    }


# --- (c) GC -----------------------------------------------------------------------------------


def gc_figures(root: Path, versions: int) -> dict[str, float | int]:
    log(f"gc: building a shard with {versions:,} versions")
    consensus = SqlConsensus(f"sqlite:///{root}/gc.db")
    shard = Shard.open(consensus, LocalBlob(root / "gcblob"), "gc", inline_threshold=0)
    upper = 0
    while shard.machine.cached_state().seqno < versions:
        if shard.machine.cached_state().seqno % 20 == 0:
            key = upper.to_bytes(16, "big")
            table = pa.table({"key": [key], "row": [b"r%d" % upper], "ts": [upper],
                              "diff": [1]}, schema=pa.schema([
                                  ("key", pa.binary()), ("row", pa.binary()),
                                  ("ts", pa.int64()), ("diff", pa.int64())]))
            assert shard.append(table, upper).committed
            upper += 1
        else:
            shard.machine.apply(bump)
    before = shard.inspect()
    t0 = time.perf_counter()
    report = shard.gc()
    seconds = time.perf_counter() - t0
    after = shard.inspect()
    consensus.close()
    return {
        "gc_versions": int(before["live_diffs"]),  # type: ignore[call-overload]
        "gc_batches_before": int(before["batches"]),  # type: ignore[call-overload]
        "gc_batches_after": int(after["batches"]),  # type: ignore[call-overload]
        "gc_seconds": round(seconds, 3),
        "gc_diffs_truncated": report.diffs_truncated,
        "gc_compaction_merges": report.compaction_merges,
        "gc_parts_deleted": report.parts_deleted,
        "gc_rollups_deleted": report.rollups_deleted,
        "gc_live_diffs_after": int(after["live_diffs"]),  # type: ignore[call-overload]
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (under a minute)")
    args = parser.parse_args(argv)
    commits, rows, versions = (200, 300_000, 2_000) if args.quick else (1_000, 2_000_000, 10_000)
    figures: dict[str, object] = {"quick": args.quick}
    with tempfile.TemporaryDirectory(prefix="bench-persist-") as tmp:
        root = Path(tmp)
        blob = LocalBlob(root / "casblob")
        log(f"commits: {commits} on SQLite")
        sqlite = SqlConsensus(f"sqlite:///{root}/cas.db")
        try:
            figures.update({f"sqlite_{k}": v for k, v in commit_latency(sqlite, blob,
                                                                          commits).items()})
        finally:
            sqlite.close()
        log(f"commits: {commits} on PostgreSQL")
        figures.update({f"postgres_{k}": v for k, v in postgres_figures(commits, blob).items()})
        figures.update(read_figures(root, rows))
        figures.update(gc_figures(root, versions))
    for name, value in figures.items():
        log(f"  {name}: {value}")
    print(json.dumps(figures, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
