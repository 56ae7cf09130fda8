"""Benchmark of the ingest: our pipeline against delta-rs MERGE, naive PySpark and pyarrow.

The workload (:mod:`bench._workload`): N keys loaded, then change batches (70% updates,
20% new keys, 10% deletes, 5% in-batch duplicates with different order values) as
Parquet landing files. Every engine reads the same files and must end with the same
snapshot (compared on sorted key/value/amount):

(a) ours: ``upsert_core.ingest.ingest`` on the embedded defaults (SQLite consensus, a
    local blob directory) with the Spark engine on a warm ``local[2]`` session (its
    start is reported separately), and with the in-process engine as an extra row;
(b) ``deltalake`` (delta-rs) MERGE with a delete clause (source de-duplicated first);
(c) a naive PySpark job: union state and batch, window over key, keep the latest, rewrite;
(d) a pyarrow-only copy-on-write floor: read state, de-duplicate the batch, anti-join,
    write;
(e) the user path: one fresh ``upsertctl ingest --engine local`` process per file (what
    a user or a Dagster run per file lives through: interpreter start, imports, opening
    the shard, loading bucket states from checkpoints), wall clock per file; its
    ``batch 5 / batch 1`` ratio shows whether the cost follows the batch or the history.

``scale_ratio_10x`` is our per-batch time with 10x the keys over per-batch time with 1x
(full: 1M vs 10M keys; ``--quick``: 50k vs 500k).

``--read-once`` measures only the Spark engine's two read paths on one Parquet file
(``--keys`` rows, default 1M, in ``--row-groups`` row groups, default 8) loaded into a
fresh shard of ``--read-buckets`` buckets (default 8) on ``local[2]``: the one-stage
path (every slice reads the whole file; with the default 2 slices and with one per
bucket, as on that many executor cores) against the split path (one read task per row
group, a shuffle, a task per bucket), alternating ``--repeats`` times (default 3), with
the landing bytes each read (the engine's reads, the ledger's digest's own reads, and
the two together) and the tasks Spark ran; both
must give the in-process engine's snapshot (whose load is timed too, for scale). Written
to ``bench/out/read_once.md``.

Usage: ``.venv/bin/python -m bench.ingest [--quick] [--batches K] [--skip-scale]
[--skip-spark] [--skip-cli]`` or ``... --read-once [--keys N] [--row-groups G]``.
Progress goes to stderr; a table goes to stdout and ``bench/out/ingest.md``, a chart to
``docs/bench_ingest.png``; the LAST line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench._measure import descendants, dir_bytes, peak_mb, reset_peak
from bench._workload import Workload, canonical, dedup_batch, write_landing, write_workload

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "bench" / "out"
CHART = ROOT / "docs" / "bench_ingest.png"

DELTALAKE_MISSING = "deltalake not installed: pip install -e .[bench]"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Result:
    """One engine's figures on one workload."""

    name: str
    initial_s: float | None = None
    batch_s: list[float] = field(default_factory=list)
    batch_bytes: list[int] = field(default_factory=list)
    snapshot_s: float | None = None
    peak_rss_mb: float | None = None
    jvm_peak_rss_mb: float | None = None
    snapshot: pa.Table | None = None
    error: str | None = None
    loaded: dict[str, int] = field(default_factory=dict)

    @property
    def mean_batch_s(self) -> float | None:
        return statistics.fmean(self.batch_s) if self.batch_s else None

    @property
    def mean_bytes(self) -> float | None:
        return statistics.fmean(self.batch_bytes) if self.batch_bytes else None


@dataclass
class Files:
    """The workload's landing files."""

    initial: Path
    batches: list[Path]
    batch_rows: int


def make_files(root: Path, n_keys: int, batch_rows: int, batches: int) -> Files:
    initial, paths = write_workload(root, n_keys, batch_rows, batches)
    return Files(initial, paths, batch_rows)


class Peak:
    """Measures the peak RSS of this process (and optionally Spark's JVM tree)."""

    def __init__(self, jvm_pid: int | None = None) -> None:
        self.jvm_pid = jvm_pid

    def __enter__(self) -> Peak:
        reset_peak([os.getpid()])
        if self.jvm_pid is not None:
            reset_peak(descendants(self.jvm_pid))
        return self

    def read(self, result: Result) -> None:
        result.peak_rss_mb = peak_mb([os.getpid()])
        if self.jvm_pid is not None:
            result.jvm_peak_rss_mb = peak_mb(descendants(self.jvm_pid))

    def __exit__(self, *exc: object) -> None:
        return None


# --- (a) our pipeline ------------------------------------------------------------------


def _our_snapshot(shard: Any) -> tuple[pa.Table, float]:
    """The typed snapshot through the Python read API (read and decode, timed)."""
    from upsert_core.shard_table import ShardTable

    started = time.perf_counter()
    table = ShardTable(shard).snapshot()
    seconds = time.perf_counter() - started
    return canonical(table), seconds


class Recording:
    """Wraps an engine and counts where each bucket step got its state from."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.loaded: Counter[str] = Counter()

    def run_file(self, task: Any, shard: Any) -> Any:
        outcome = self.inner.run_file(task, shard)
        self.loaded.update(b.loaded for b in outcome.buckets)
        return outcome


def run_ours(
    name: str, files: Files, work: Path, engine: Any, jvm_pid: int | None = None
) -> Result:
    from upsert_core.ingest import IngestRequest, ingest
    from upsert_core.persist.location.blob_local import LocalBlob
    from upsert_core.persist.location.urls import open_consensus
    from upsert_core.persist.shard import Shard

    result = Result(name)
    landing = work / "landing"
    landing.mkdir(parents=True)
    consensus = open_consensus(f"sqlite:///{work / 'consensus.db'}")
    blob = LocalBlob(str(work / "blob"))
    shard = Shard.open(consensus, blob, "bench")
    request = IngestRequest()
    recording = Recording(engine)

    def step(path: Path) -> tuple[float, int]:
        os.link(path, landing / path.name)
        started = time.perf_counter()
        report = ingest(shard, f"file://{landing}", request, engine=recording)
        seconds = time.perf_counter() - started
        if len(report.files) != 1:
            raise RuntimeError(f"{name}: expected one file ingested, got {report.files}")
        return seconds, report.files[0].bytes_written

    with Peak(jvm_pid) as peak:
        result.initial_s, _ = step(files.initial)
        log(f"  {name}: initial load {result.initial_s:.2f}s")
        recording.loaded.clear()
        for path in files.batches:
            seconds, written = step(path)
            result.batch_s.append(seconds)
            result.batch_bytes.append(written)
            log(f"  {name}: {path.name} {seconds:.3f}s, {written / 1e6:.2f} MB written")
        result.snapshot, result.snapshot_s = _our_snapshot(shard)
        peak.read(result)
    result.loaded = dict(recording.loaded)
    if result.loaded:
        log(f"  {name}: bucket states came from {result.loaded}")
    return result


def warm_up_spark(engine: Any, work: Path) -> None:
    """One tiny ingest so the batches do not pay the first job's start-up."""
    small = Files(work / "in" / "0000-initial.parquet", [], 0)
    write_landing(small.initial, Workload(100, 10).initial())
    run_ours("spark warm-up", small, work / "run", engine)


# --- (e) the user path: one upsertctl process per file -------------------------------------


def run_cli(files: Files, work: Path, engine: str = "local") -> Result:
    """One fresh ``upsertctl ingest`` process per file, timed from launch to exit."""
    import subprocess

    name = f"ours (upsertctl --engine {engine}, a process per file)"
    result = Result(name)
    landing = work / "landing"
    landing.mkdir(parents=True)
    env = {
        **os.environ,
        "UPSERT_CONSENSUS_URL": f"sqlite:///{work / 'consensus.db'}",
        "UPSERT_BLOB_URL": f"file://{work / 'blob'}",
    }
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # a user's Python caches bytecode
    command = [sys.executable, "-m", "orchestration.cli", "ingest", "--shard", "bench",
               "--engine", engine, "--no-progress", str(landing)]

    def step(path: Path) -> tuple[float, int]:
        os.link(path, landing / path.name)
        before = dir_bytes(work / "blob") if (work / "blob").exists() else 0
        started = time.perf_counter()
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
        seconds = time.perf_counter() - started
        return seconds, dir_bytes(work / "blob") - before

    result.initial_s, _ = step(files.initial)
    log(f"  {name}: initial load {result.initial_s:.2f}s")
    for path in files.batches:
        seconds, written = step(path)
        result.batch_s.append(seconds)
        result.batch_bytes.append(written)
        log(f"  {name}: {path.name} {seconds:.3f}s")
    from upsert_core.persist.location.blob_local import LocalBlob
    from upsert_core.persist.location.urls import open_consensus
    from upsert_core.persist.shard import Shard

    shard = Shard.open(open_consensus(env["UPSERT_CONSENSUS_URL"]),
                       LocalBlob(str(work / "blob")), "bench")
    result.snapshot, result.snapshot_s = _our_snapshot(shard)
    return result


# --- (b) deltalake MERGE --------------------------------------------------------------------


def run_deltalake(files: Files, work: Path) -> Result:
    result = Result("deltalake MERGE")
    try:
        from deltalake import DeltaTable, write_deltalake
    except ImportError:
        result.error = DELTALAKE_MISSING
        return result
    path = str(work / "delta")
    columns = {"offset": "s.offset", "value": "s.value", "amount": "s.amount"}
    inserts = {"key": "s.key", **columns}
    with Peak() as peak:
        started = time.perf_counter()
        write_deltalake(path, pq.read_table(files.initial).drop_columns(["__deleted"]))
        result.initial_s = time.perf_counter() - started
        for batch in files.batches:
            before = dir_bytes(Path(path))
            started = time.perf_counter()
            source = dedup_batch(pq.read_table(batch))
            (
                DeltaTable(path)
                .merge(source=source, predicate="t.key = s.key", source_alias="s",
                       target_alias="t")
                .when_matched_delete(predicate="s.__deleted")
                .when_matched_update(updates=columns, predicate="NOT s.__deleted")
                .when_not_matched_insert(updates=inserts, predicate="NOT s.__deleted")
                .execute()
            )
            result.batch_s.append(time.perf_counter() - started)
            result.batch_bytes.append(dir_bytes(Path(path)) - before)
            log(f"  deltalake: {batch.name} {result.batch_s[-1]:.3f}s")
        started = time.perf_counter()
        table = DeltaTable(path).to_pyarrow_table()
        result.snapshot_s = time.perf_counter() - started
        result.snapshot = canonical(table)
        peak.read(result)
    return result


# --- (c) naive PySpark ------------------------------------------------------------------


def run_naive_spark(spark: Any, files: Files, work: Path, jvm_pid: int | None) -> Result:
    from pyspark.sql import Window
    from pyspark.sql import functions as F  # noqa: N812 - the usual alias

    result = Result("naive PySpark")
    with Peak(jvm_pid) as peak:
        state = str(work / "state-0000")
        started = time.perf_counter()
        spark.read.parquet(str(files.initial)).drop("__deleted").write.parquet(state)
        result.initial_s = time.perf_counter() - started
        for i, batch in enumerate(files.batches, 1):
            out = str(work / f"state-{i:04d}")
            started = time.perf_counter()
            old = spark.read.parquet(state).withColumn("__deleted", F.lit(False))
            new = spark.read.parquet(str(batch))
            union = old.withColumn("_b", F.lit(0)).unionByName(new.withColumn("_b", F.lit(1)))
            window = Window.partitionBy("key").orderBy(F.col("_b").desc(), F.col("offset").desc())
            (
                union.withColumn("_rn", F.row_number().over(window))
                .filter("_rn = 1 AND NOT __deleted")
                .drop("_rn", "_b", "__deleted")
                .write.parquet(out)
            )
            result.batch_s.append(time.perf_counter() - started)
            result.batch_bytes.append(dir_bytes(Path(out)))
            log(f"  naive spark: {batch.name} {result.batch_s[-1]:.3f}s")
            state = out
        started = time.perf_counter()
        table = pq.read_table(state)
        result.snapshot_s = time.perf_counter() - started
        result.snapshot = canonical(table)
        peak.read(result)
    return result


# --- (d) pyarrow copy-on-write floor ------------------------------------------------------


def run_pyarrow(files: Files, work: Path) -> Result:
    result = Result("pyarrow floor")
    work.mkdir(parents=True, exist_ok=True)
    with Peak() as peak:
        state = work / "state-0000.parquet"
        started = time.perf_counter()
        pq.write_table(pq.read_table(files.initial).drop_columns(["__deleted"]), state)
        result.initial_s = time.perf_counter() - started
        for i, batch in enumerate(files.batches, 1):
            out = work / f"state-{i:04d}.parquet"
            started = time.perf_counter()
            table = pq.read_table(state)
            changes = dedup_batch(pq.read_table(batch))
            kept = table.filter(pc.invert(pc.is_in(table.column("key"), changes.column("key"))))
            added = changes.filter(pc.invert(changes.column("__deleted")))
            merged = pa.concat_tables([kept, added.drop_columns(["__deleted"])])
            pq.write_table(merged, out)
            result.batch_s.append(time.perf_counter() - started)
            result.batch_bytes.append(out.stat().st_size)
            state = out
        started = time.perf_counter()
        final = pq.read_table(state)
        result.snapshot_s = time.perf_counter() - started
        result.snapshot = canonical(final)
        peak.read(result)
    return result


# --- reporting -----------------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table_lines(results: list[Result], rows: int, floor: Result, delta: Result) -> list[str]:
    head = (
        "| engine | s/batch | rows/s | vs deltalake | vs pyarrow floor | initial load s "
        "| snapshot read s | MB written/batch | peak RSS MB (py / JVM) |"
    )
    lines = [head, "|" + "---|" * 9]
    for r in results:
        if r.error:
            lines.append(f"| {r.name} | {r.error} |" + " |" * 7)
            continue
        mean = r.mean_batch_s
        rate = None if not mean else rows / mean
        vs_delta = None if not (mean and delta.mean_batch_s) else mean / delta.mean_batch_s
        vs_floor = None if not (mean and floor.mean_batch_s) else mean / floor.mean_batch_s
        mb = None if r.mean_bytes is None else r.mean_bytes / 1e6
        jvm = "" if r.jvm_peak_rss_mb is None else f" / {r.jvm_peak_rss_mb:.0f}"
        lines.append(
            f"| {r.name} | {_fmt(mean)} | {_fmt(rate, 0)} | {_fmt(vs_delta, 2)} "
            f"| {_fmt(vs_floor, 2)} | {_fmt(r.initial_s, 2)} | {_fmt(r.snapshot_s, 3)} "
            f"| {_fmt(mb, 2)} | {_fmt(r.peak_rss_mb, 0)}{jvm} |"
        )
    return lines


def write_chart(results: list[Result], title: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: pip install -e .[bench]"
    shown = [r for r in results if r.mean_batch_s is not None]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    names = [r.name for r in shown]
    values = [r.mean_batch_s or 0.0 for r in shown]
    bars = ax.barh(names, values, color=["#2a7" if "ours" in n else "#888" for n in names])
    ax.bar_label(bars, labels=[f"{v:.2f}s" for v in values], padding=3)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per batch (lower is better)")
    ax.set_title(title)
    ax.set_xlim(0, max(values, default=1) * 1.2)
    fig.tight_layout()
    CHART.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(CHART, dpi=110)
    plt.close(fig)
    return None


def check_same(results: list[Result], reference: Result) -> list[str]:
    problems = []
    for r in results:
        if r.snapshot is None or r is reference or reference.snapshot is None:
            continue
        if not r.snapshot.equals(reference.snapshot):
            problems.append(
                f"{r.name}: final snapshot differs from {reference.name} "
                f"({r.snapshot.num_rows} vs {reference.snapshot.num_rows} rows)"
            )
    return problems


# --- main ----------------------------------------------------------------------------------


def _timed(label: str, fn: Callable[[], Result]) -> Result:
    log(f"{label} ...")
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - one failing engine must not hide the others
        log(f"{label} failed: {type(exc).__name__}: {exc}")
        return Result(label, error=f"failed: {type(exc).__name__}: {str(exc)[:120]}")


def read_once(n_rows: int, row_groups: int, repeats: int, buckets: int = 8) -> int:
    """The ``--read-once`` comparison (module docstring); returns the exit status."""
    from resources.spark_ingest import SparkEngine
    from resources.spark_paths import SPLIT_BYTES_ENV, SPLIT_ENV
    from resources.spark_session import get_spark
    from upsert_core.ingest import IngestRequest, InProcessEngine, ingest
    from upsert_core.landing import listing
    from upsert_core.persist.location.blob_local import LocalBlob
    from upsert_core.persist.location.urls import open_consensus
    from upsert_core.persist.shard import Shard
    from upsert_core.shard_table import ShardTable

    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-read-once-") as tmp:
        root = Path(tmp)
        landing = root / "landing"
        landing.mkdir()
        table = Workload(n_rows, 10).initial()
        path = landing / "0000-initial.parquet"
        pq.write_table(table, path, row_group_size=-(-table.num_rows // row_groups))
        size = path.stat().st_size
        groups = pq.ParquetFile(path).metadata.num_row_groups
        log(f"read-once: {table.num_rows} rows, {size / 1e6:.1f} MB, {groups} row groups")

        def load(name: str, engine: Any) -> tuple[dict[str, Any], pa.Table]:
            # As in a fresh upsertctl process: no digest remembered from an earlier read.
            listing._digests.clear()  # noqa: SLF001
            work = root / name
            shard = Shard.open(open_consensus(f"sqlite:///{work}.db"),
                               LocalBlob(str(work)), "bench")
            started = time.perf_counter()
            report = ingest(shard, f"file://{landing}", IngestRequest(buckets=buckets),
                            engine=engine)
            seconds = time.perf_counter() - started
            (file,) = report.files
            figures = {"seconds": round(seconds, 3), "size": size,
                       "engine_bytes": file.landing_bytes_read - file.digest_bytes_read,
                       "digest_bytes": file.digest_bytes_read,
                       "read_tasks": file.read_tasks, "drain_tasks": file.drain_tasks}
            return figures, canonical(ShardTable(shard).snapshot())

        local, reference = load("in-process", InProcessEngine())
        local["path"] = "in-process"
        rows.append(local)
        log(f"  {local}")
        spark = get_spark("local[2]", app_name="bench-read-once", shuffle_partitions=4)
        engine = SparkEngine(spark)
        os.environ[SPLIT_BYTES_ENV] = str(-(-size // groups))
        os.environ[SPLIT_ENV] = "on"
        load("warm-up", engine)  # the first jobs pay the workers' start-up
        # The one-stage path as it runs with as many slices as buckets (a cluster with
        # that many executor cores): every slice reads the whole file.
        wide = SparkEngine(spark, slices=buckets)
        many = f"one-stage, {buckets} slices"
        paths = {"one-stage": ("off", engine), many: ("off", wide),
                 "split": ("on", engine)}
        for repeat in range(repeats):
            for label, (mode, runner) in paths.items():
                os.environ[SPLIT_ENV] = mode
                figures, snapshot = load(f"{mode}-{repeat}-{len(rows)}", runner)
                figures["path"] = label
                rows.append(figures)
                log(f"  {figures}")
                if not snapshot.equals(reference):
                    problems.append(f"{figures['path']} (repeat {repeat}): snapshot differs")
        spark.stop()

    def mean(path: str, key: str) -> float:
        return statistics.fmean(r[key] for r in rows if r["path"] == path)

    lines = [f"### Read once: {n_rows:,} rows, {size / 1e6:.1f} MB Parquet, {groups} row"
             f" groups, {buckets} buckets, local[2]", "",
             "| path | s (each run) | landing bytes read / file size | digest | in all"
             " | read tasks | drain tasks |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for path_name in ("in-process", "one-stage", f"one-stage, {buckets} slices", "split"):
        mine = [r for r in rows if r["path"] == path_name]
        lines.append(
            f"| {path_name} | {', '.join(format(r['seconds'], '.2f') for r in mine)}"
            f" | {mean(path_name, 'engine_bytes') / size:.3f}"
            f" | {mean(path_name, 'digest_bytes') / size:.3f}"
            f" | {(mean(path_name, 'engine_bytes') + mean(path_name, 'digest_bytes')) / size:.3f}"
            f" | {mine[0]['read_tasks']} | {mine[0]['drain_tasks']} |")
    lines.extend(f"MISMATCH: {p}" for p in problems)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "read_once.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(json.dumps({"rows": n_rows, "size": size, "row_groups": groups, "runs": rows,
                      "snapshots_equal": not problems}))
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, a few minutes")
    parser.add_argument("--keys", type=int, help="keys loaded (default 1M; quick 50k)")
    parser.add_argument("--batch-rows", type=int, help="rows per batch (100k; quick 10k)")
    parser.add_argument("--batches", type=int, help="change batches (default 5; quick 3)")
    parser.add_argument("--skip-scale", action="store_true", help="no 10x-keys run")
    parser.add_argument("--skip-peers", action="store_true", help="only our pipeline")
    parser.add_argument("--skip-spark", action="store_true",
                        help="no Spark engine rows (ours on Spark, naive PySpark)")
    parser.add_argument("--skip-cli", action="store_true",
                        help="no user-path rows (an upsertctl process per file)")
    parser.add_argument("--read-once", action="store_true",
                        help="only the Spark engine's one-stage vs split read of one file")
    parser.add_argument("--row-groups", type=int, default=8, help="--read-once: row groups")
    parser.add_argument("--repeats", type=int, default=3, help="--read-once: runs per path")
    parser.add_argument("--read-buckets", type=int, default=8, help="--read-once: buckets")
    args = parser.parse_args(argv)
    n_keys = args.keys or (50_000 if args.quick else 1_000_000)
    if args.read_once:
        return read_once(n_keys, args.row_groups, args.repeats, args.read_buckets)
    rows = args.batch_rows or (10_000 if args.quick else 100_000)
    batches = args.batches or (3 if args.quick else 5)

    from upsert_core.ingest import InProcessEngine
    from upsert_core.ingest.statecache import MAX_KEYS_ENV

    figures: dict[str, Any] = {"keys": n_keys, "batch_rows": rows, "batches": batches}
    # Room in every process's bucket-state cache for the largest run (Spark's Python
    # workers inherit the environment when the session starts).
    os.environ.setdefault(MAX_KEYS_ENV, str(int(n_keys * 10 * 1.5)))
    spark = spark_engine = jvm_pid = None
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        root = Path(tmp)
        log(f"workload: {n_keys} keys, {batches} batches of {rows} rows")
        files = make_files(root / "landing", n_keys, rows, batches)

        results: list[Result] = []
        if not args.skip_spark:
            from resources.spark_ingest import SparkEngine
            from resources.spark_session import get_spark

            started = time.perf_counter()
            spark = get_spark("local[2]", app_name="bench-ingest", shuffle_partitions=4)
            figures["spark_session_start_s"] = round(time.perf_counter() - started, 2)
            gateway = getattr(spark.sparkContext, "_gateway", None)
            proc = getattr(gateway, "proc", None)
            jvm_pid = getattr(proc, "pid", None)
            spark_engine = SparkEngine(spark)
            warm_up_spark(spark_engine, root / "warm")
            results.append(_timed("ours (Spark)", lambda: run_ours(
                "ours (Spark)", files, root / "ours-spark", spark_engine, jvm_pid)))
        results.append(_timed("ours (in-process)", lambda: run_ours(
            "ours (in-process)", files, root / "ours-local", InProcessEngine())))
        cli = Result("cli", error="skipped")
        if not args.skip_cli:
            cli = _timed("ours (upsertctl per file)", lambda: run_cli(files, root / "cli"))
            results.append(cli)
        floor = _timed("pyarrow floor", lambda: run_pyarrow(files, root / "pyarrow"))
        if args.skip_peers:
            delta = Result("deltalake MERGE", error="skipped")
        else:
            delta = _timed("deltalake MERGE", lambda: run_deltalake(files, root / "delta"))
            results.append(delta)
            if spark is not None:
                results.append(_timed("naive PySpark", lambda: run_naive_spark(
                    spark, files, root / "naive", jvm_pid)))
        results.append(floor)
        for r in results:
            if r.error:
                log(f"{r.name}: {r.error}")
        problems = check_same(results, floor)
        for p in problems:
            log(f"MISMATCH: {p}")

        scale: dict[str, float | None] = {}
        if not args.skip_scale:
            big = make_files(root / "landing-10x", n_keys * 10, rows, batches)
            engines: list[tuple[str, Any]] = [("local", InProcessEngine())]
            if spark_engine is not None:
                engines.insert(0, ("spark", spark_engine))
            by_label = {r.name: r for r in results}
            for label, engine in engines:
                with Peak() as peak:
                    r10 = _timed(f"ours ({label}) 10x keys", lambda e=engine, lb=label: run_ours(
                        f"ours ({lb}) 10x", big, root / f"ours-{lb}-10x", e))
                    peak.read(r10)
                base = by_label["ours (Spark)" if label == "spark" else "ours (in-process)"]
                if r10.mean_batch_s and base.mean_batch_s:
                    scale[label] = r10.mean_batch_s / base.mean_batch_s
                    scale[f"{label}_batch_s_10x"] = r10.mean_batch_s
                    scale[f"{label}_initial_s_10x"] = r10.initial_s
                    scale[f"{label}_peak_rss_mb_10x"] = r10.peak_rss_mb
            if not args.skip_cli:
                c10 = _timed("ours (upsertctl per file) 10x keys",
                             lambda: run_cli(big, root / "cli-10x"))
                scale["cli_batch_s_10x"] = c10.mean_batch_s
                scale["cli_initial_s_10x"] = c10.initial_s
                if not args.skip_peers:
                    d10 = _timed("deltalake MERGE 10x keys",
                                 lambda: run_deltalake(big, root / "delta-10x"))
                    scale["deltalake_batch_s_10x"] = d10.mean_batch_s
                    scale["deltalake_initial_s_10x"] = d10.initial_s
            shutil.rmtree(root / "landing-10x", ignore_errors=True)
        if spark is not None:
            spark.stop()

    by_name = {r.name: r for r in results}
    missing = Result("missing")
    ours = by_name.get("ours (Spark)", missing)
    local = by_name["ours (in-process)"]
    naive = by_name.get("naive PySpark", Result("naive PySpark"))

    def r3(v: float | None) -> float | None:
        return None if v is None else round(v, 3)

    def ratio(a: float | None, b: float | None) -> float | None:
        return r3(a / b) if a and b else None

    figures.update(
        {
            "ingest_batch_s": r3(ours.mean_batch_s),
            "ingest_local_batch_s": r3(local.mean_batch_s),
            "deltalake_batch_s": r3(delta.mean_batch_s),
            "ratio_vs_deltalake": ratio(ours.mean_batch_s, delta.mean_batch_s),
            "local_ratio_vs_deltalake": ratio(local.mean_batch_s, delta.mean_batch_s),
            "pyarrow_floor_batch_s": r3(floor.mean_batch_s),
            "ratio_vs_pyarrow_floor": ratio(ours.mean_batch_s, floor.mean_batch_s),
            "naive_spark_batch_s": r3(naive.mean_batch_s),
            "ingest_rows_per_s": round(rows / ours.mean_batch_s) if ours.mean_batch_s else None,
            "scale_ratio_10x": r3(scale.get("spark")),
            "scale_ratio_10x_local": r3(scale.get("local")),
            "ingest_batch_s_10x": r3(scale.get("spark_batch_s_10x")),
            "ingest_local_batch_s_10x": r3(scale.get("local_batch_s_10x")),
            "ingest_local_initial_s_10x": r3(scale.get("local_initial_s_10x")),
            "ingest_local_peak_rss_mb_10x": scale.get("local_peak_rss_mb_10x"),
            "ingest_initial_s": r3(ours.initial_s),
            "ingest_local_initial_s": r3(local.initial_s),
            "deltalake_initial_s": r3(delta.initial_s),
            "local_initial_ratio_vs_deltalake": ratio(local.initial_s, delta.initial_s),
            "ingest_snapshot_s": r3(local.snapshot_s),
            "deltalake_snapshot_s": r3(delta.snapshot_s),
            "ingest_bytes_per_batch": round(local.mean_bytes) if local.mean_bytes else None,
            "deltalake_bytes_per_batch": round(delta.mean_bytes) if delta.mean_bytes else None,
            "ingest_peak_rss_mb": local.peak_rss_mb,
            "ingest_jvm_peak_rss_mb": ours.jvm_peak_rss_mb,
            "cli_batch_s": r3(cli.mean_batch_s),
            "cli_batch_s_list": [r3(x) for x in cli.batch_s],
            "cli_ratio_vs_deltalake": ratio(cli.mean_batch_s, delta.mean_batch_s),
            "cli_last_over_first_batch": ratio(cli.batch_s[-1], cli.batch_s[0])
            if cli.batch_s else None,
            "cli_initial_s": r3(cli.initial_s),
            "cli_initial_ratio_vs_deltalake": ratio(cli.initial_s, delta.initial_s),
            "cli_batch_s_10x": r3(scale.get("cli_batch_s_10x")),
            "cli_initial_s_10x": r3(scale.get("cli_initial_s_10x")),
            "deltalake_batch_s_10x": r3(scale.get("deltalake_batch_s_10x")),
            "deltalake_initial_s_10x": r3(scale.get("deltalake_initial_s_10x")),
            "cli_ratio_vs_deltalake_10x": ratio(scale.get("cli_batch_s_10x"),
                                                scale.get("deltalake_batch_s_10x")),
            "snapshots_equal": not problems,
            "deltalake_error": delta.error,
        }
    )
    title = f"{n_keys:,} keys, {rows:,}-row batches (70% upd, 20% new, 10% del, 5% dup)"
    lines = [f"### Ingest: {title}", "", *table_lines(results, rows, floor, delta), ""]
    if scale:
        lines.append(
            f"scale_ratio_10x (Spark engine, {n_keys * 10:,} vs {n_keys:,} keys): "
            f"{_fmt(scale.get('spark'), 2)}; in-process: {_fmt(scale.get('local'), 2)}"
        )
    if "spark_session_start_s" in figures:
        lines.append(
            f"Spark session start: {figures['spark_session_start_s']} s (not in s/batch)"
        )
    if figures["cli_batch_s_list"]:
        lines.append(
            f"upsertctl per file: batches {figures['cli_batch_s_list']} s, last/first "
            f"{figures['cli_last_over_first_batch']}; 10x keys: {figures['cli_batch_s_10x']} s"
            f"/batch vs deltalake {figures['deltalake_batch_s_10x']} s"
        )
    if problems:
        lines.extend(f"MISMATCH: {p}" for p in problems)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "ingest.md").write_text("\n".join(lines) + "\n")
    chart_error = write_chart(results, title)
    if chart_error:
        log(chart_error)
    print("\n".join(lines))
    print(json.dumps(figures))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
