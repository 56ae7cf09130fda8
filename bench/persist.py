"""Benchmark of the persist layer: commits, snapshot reads and GC.

(a) Compare-and-set latency (p50, p99) and commits/s of state transitions (one small
    config change each, so each is one diff and one compare-and-set; automatic rollups
    off) on SQLite (a file in a temp dir) and on the local PostgreSQL (a fresh schema,
    dropped afterwards).
(b) Snapshot read throughput (rows/s, MB/s of Arrow data) of a shard of N distinct keys
    in 4 batches on local files, against reading the same Parquet parts with plain
    pyarrow (``pq.read_table`` per file): the floor. The ratio is shard time / pyarrow
    time (target: under 1.5), best of 5 runs each, interleaved. Measured twice: with
    history (the 4 batches, whose parts the read merges by key) and compacted (one
    batch after ``compact``; ``..._compacted`` figures). CPU-time ratios (all threads)
    are reported too: on a busy machine they are the steadier figure.
(d) Typed snapshot reads (``upsert_core.open_shard(...).snapshot()``: the shard read plus
    decoding every row into typed columns) of a shard ingested from one Parquet file of
    N rows (int64 key and order, string, float64, timestamp), against ``pq.read_table``
    of that file and delta-rs's ``DeltaTable(...).to_pyarrow_table()`` of the same rows
    (when ``deltalake`` is installed); best of 3, interleaved; plus ``upsertctl snapshot
    --format parquet --out`` as a fresh process (what a user runs), against both and
    against the same export with delta-rs as a fresh process (read, ``pq.write_table``).
    Then the snapshot again after four batches updating 10% of the keys each (buckets
    of several parts), after ``gc`` (its compaction keeps buckets apart, and the
    history) and after ``gc --retain 1`` (history folded into one time).
(c) GC time for a shard with V versions on SQLite + local files (mostly small config
    changes, a one-row append every 20th version), including its compaction.

Usage: ``.venv/bin/python -m bench.persist [--quick] [--typed-only]``. ``--quick`` (under a minute):
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

from upsert_core.persist.location import Blob, Consensus
from upsert_core.persist.location.blob_local import LocalBlob
from upsert_core.persist.location.consensus_sql import SqlConsensus
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.state import BlobPart, ShardState

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


def _read_once(shard: Shard, paths: list[Path], as_of: int) -> dict[str, float]:
    """Best-of-5 wall and CPU times of a shard snapshot and of plain pyarrow."""
    best = {"shard_s": float("inf"), "shard_cpu": float("inf"),
            "arrow_s": float("inf"), "arrow_cpu": float("inf")}
    rows = {"shard": 0, "arrow": 0}
    nbytes = {"shard": 0, "arrow": 0}
    for _ in range(5):  # interleaved, so load changes hit both alike
        t0, c0 = time.perf_counter(), time.process_time()
        n = b = 0
        for batch in shard.snapshot(as_of):
            n += batch.num_rows
            b += batch.nbytes
        best["shard_s"] = min(best["shard_s"], time.perf_counter() - t0)
        best["shard_cpu"] = min(best["shard_cpu"], time.process_time() - c0)
        rows["shard"], nbytes["shard"] = n, b
        t0, c0 = time.perf_counter(), time.process_time()
        n = b = 0
        for path in paths:
            table = pq.read_table(path)
            n += table.num_rows
            b += table.nbytes
        best["arrow_s"] = min(best["arrow_s"], time.perf_counter() - t0)
        best["arrow_cpu"] = min(best["arrow_cpu"], time.process_time() - c0)
        rows["arrow"], nbytes["arrow"] = n, b
    assert rows["shard"] == rows["arrow"], rows
    return {
        "rows": rows["shard"],
        "seconds": best["shard_s"],
        "mb_per_s": nbytes["shard"] / best["shard_s"] / 1e6,
        "pyarrow_seconds": best["arrow_s"],
        "pyarrow_mb_per_s": nbytes["arrow"] / best["arrow_s"] / 1e6,
        "ratio": best["shard_s"] / best["arrow_s"],
        "cpu_ratio": best["shard_cpu"] / best["arrow_cpu"],
    }


def _part_paths(root: Path, shard: Shard) -> list[Path]:
    paths = [
        root / "blob" / part.key
        for batch in shard.state().batches for part in batch.parts
        if isinstance(part, BlobPart)
    ]
    assert all(p.exists() for p in paths), "parts are not files where LocalBlob keeps them"
    return paths


def read_figures(root: Path, n: int) -> dict[str, float]:
    log(f"snapshot: writing {n:,} rows in 4 batches")
    shard = build_read_shard(root, n)
    as_of = shard.state().upper - 1
    history = _read_once(shard, _part_paths(root, shard), as_of)
    assert history["rows"] == n, (history["rows"], n)
    log("snapshot: compacting to one batch")
    shard.compact()
    assert len(shard.state().batches) == 1
    compacted = _read_once(shard, _part_paths(root, shard), as_of)
    assert compacted["rows"] == n
    return {
        "snapshot_rows": n,
        "snapshot_seconds": round(history["seconds"], 4),
        "snapshot_rows_per_s": round(n / history["seconds"]),
        "snapshot_mb_per_s": round(history["mb_per_s"], 1),
        "pyarrow_seconds": round(history["pyarrow_seconds"], 4),
        "pyarrow_rows_per_s": round(n / history["pyarrow_seconds"]),
        "pyarrow_mb_per_s": round(history["pyarrow_mb_per_s"], 1),
        "snapshot_read_ratio_vs_pyarrow": round(history["ratio"], 3),
        "snapshot_cpu_ratio_vs_pyarrow": round(history["cpu_ratio"], 3),
        "snapshot_seconds_compacted": round(compacted["seconds"], 4),
        "snapshot_rows_per_s_compacted": round(n / compacted["seconds"]),
        "pyarrow_seconds_compacted": round(compacted["pyarrow_seconds"], 4),
        "snapshot_read_ratio_vs_pyarrow_compacted": round(compacted["ratio"], 3),
        "snapshot_cpu_ratio_vs_pyarrow_compacted": round(compacted["cpu_ratio"], 3),
    }


# --- (d) typed snapshot reads -----------------------------------------------------------------


def typed_read_figures(root: Path, n: int) -> dict[str, float]:
    import subprocess

    from upsert_core.ingest import IngestRequest, ingest
    from upsert_core.shard_table import ShardTable

    landing = root / "typed-landing"
    landing.mkdir()
    rng = np.random.default_rng(11)
    source = pa.table({
        "key": pa.array(np.arange(n, dtype=np.int64)),
        "offset": pa.array(np.zeros(n, dtype=np.int64)),
        "value": pa.array([f"value-{i:08d}" for i in range(n)]),
        "amount": pa.array(rng.random(n)),
        "at": pa.array(rng.integers(0, 2**40, n), pa.timestamp("us", tz="UTC")),
    })
    parquet = landing / "000.parquet"
    pq.write_table(source, parquet)
    consensus_url, blob_url = f"sqlite:///{root}/typed.db", f"file://{root}/typed-blob"
    shard = Shard.open(SqlConsensus(consensus_url), LocalBlob(root / "typed-blob"), "typed")
    log(f"typed snapshot: ingesting {n:,} rows")
    started = time.perf_counter()
    ingest(shard, str(landing), IngestRequest())
    ingest_s = time.perf_counter() - started
    reader = ShardTable(shard)
    delta_path = root / "typed-delta"
    try:
        from deltalake import DeltaTable, write_deltalake
    except ImportError:
        log("typed snapshot: deltalake not installed (pip install -e .[bench]): no delta-rs figure")
        DeltaTable = None  # noqa: N806
    else:
        write_deltalake(str(delta_path), source)
    best_api = best_arrow = best_delta = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        table = reader.snapshot()
        best_api = min(best_api, time.perf_counter() - t0)
        t0 = time.perf_counter()
        floor = pq.read_table(parquet)
        best_arrow = min(best_arrow, time.perf_counter() - t0)
        if DeltaTable is not None:
            t0 = time.perf_counter()
            delta = DeltaTable(str(delta_path)).to_pyarrow_table()
            best_delta = min(best_delta, time.perf_counter() - t0)
            assert delta.num_rows == n
    assert table.num_rows == floor.num_rows == n
    assert table.sort_by("key").equals(floor.sort_by("key")), "typed snapshot differs"
    out = root / "typed-out.parquet"
    env = {**os.environ, "UPSERT_CONSENSUS_URL": consensus_url, "UPSERT_BLOB_URL": blob_url}
    cli_s = delta_cli_s = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "orchestration.cli", "snapshot", "--shard",
                        "typed", "--format", "parquet", "--out", str(out)], env=env, check=True)
        cli_s = min(cli_s, time.perf_counter() - t0)
        assert pq.read_table(out).num_rows == n
        if DeltaTable is not None:
            # The same export with delta-rs, also as a fresh process: read, write Parquet.
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", (
                "import sys, pyarrow.parquet as pq; from deltalake import DeltaTable;"
                " pq.write_table(DeltaTable(sys.argv[1]).to_pyarrow_table(), sys.argv[2])"
            ), str(delta_path), str(root / "delta-out.parquet")], check=True)
            delta_cli_s = min(delta_cli_s, time.perf_counter() - t0)
    # History: four batches of updates to 10% of the keys each (buckets of several
    # parts, consolidated by (key, row) on read), then GC (bucket-preserving compaction).
    for b in range(1, 5):
        keys = rng.choice(n, n // 10, replace=False)
        pq.write_table(source.take(pa.array(keys)).set_column(
            1, "offset", pa.array(np.full(len(keys), b, dtype=np.int64))),
            landing / f"{b:03d}.parquet")
    ingest(shard, str(landing), IngestRequest())
    history_s = min(_timed(reader.snapshot) for _ in range(3))
    shard.gc()
    compacted_s = min(_timed(reader.snapshot) for _ in range(3))
    assert reader.snapshot().num_rows == n
    # gc --retain 1: the since moves to the newest time, so compaction folds the history
    # into one consolidated time per bucket: the layout of a fresh load again.
    shard.gc(retain=1)
    retained_s = min(_timed(reader.snapshot) for _ in range(3))
    assert reader.snapshot().num_rows == n
    return {
        "typed_rows": n,
        "typed_ingest_seconds": round(ingest_s, 3),
        "typed_snapshot_seconds": round(best_api, 4),
        "typed_pyarrow_seconds": round(best_arrow, 4),
        "typed_snapshot_ratio_vs_pyarrow": round(best_api / best_arrow, 3),
        "typed_snapshot_with_history_seconds": round(history_s, 4),
        "typed_snapshot_with_history_ratio_vs_pyarrow": round(history_s / best_arrow, 3),
        "typed_snapshot_after_gc_seconds": round(compacted_s, 4),
        "typed_snapshot_after_gc_ratio_vs_pyarrow": round(compacted_s / best_arrow, 3),
        "typed_snapshot_after_gc_retain_1_seconds": round(retained_s, 4),
        "typed_snapshot_after_gc_retain_1_ratio_vs_pyarrow": round(retained_s / best_arrow, 3),
        "typed_cli_parquet_seconds": round(cli_s, 3),
        "typed_cli_parquet_ratio_vs_pyarrow": round(cli_s / best_arrow, 3),
        **({} if DeltaTable is None else {
            "typed_deltalake_seconds": round(best_delta, 4),
            "typed_snapshot_ratio_vs_deltalake": round(best_api / best_delta, 3),
            "typed_snapshot_with_history_ratio_vs_deltalake": round(history_s / best_delta, 3),
            "typed_snapshot_after_gc_ratio_vs_deltalake": round(compacted_s / best_delta, 3),
            "typed_snapshot_after_gc_retain_1_ratio_vs_deltalake": round(
                retained_s / best_delta, 3),
            "typed_cli_parquet_ratio_vs_deltalake": round(cli_s / best_delta, 3),
            "typed_deltalake_export_process_seconds": round(delta_cli_s, 3),
            "typed_cli_parquet_ratio_vs_deltalake_export_process": round(
                cli_s / delta_cli_s, 3),
        }),
    }


def _timed(fn: object) -> float:
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t0


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
    parser.add_argument("--typed-only", action="store_true", help="only (d): typed snapshots")
    args = parser.parse_args(argv)
    if args.typed_only:
        with tempfile.TemporaryDirectory(prefix="bench-persist-") as tmp:
            typed = typed_read_figures(Path(tmp), 200_000 if args.quick else 1_000_000)
        for name, value in typed.items():
            log(f"  {name}: {value}")
        print(json.dumps(typed, sort_keys=True))
        return 0
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
        figures.update(typed_read_figures(root, 200_000 if args.quick else 1_000_000))
        figures.update(gc_figures(root, versions))
    for name, value in figures.items():
        log(f"  {name}: {value}")
    print(json.dumps(figures, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
