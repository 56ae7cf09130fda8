"""Benchmark of what a user lives through on the wide workload (issue 22), ours beside delta-rs.

The workload (:class:`bench._workload.WideWorkload`): N keys loaded from one Parquet
file, then change batches of R rows (70% updates, 20% new keys, 10% deletes, 5%
in-batch duplicates), each one Parquet landing file. Columns: ``key``, ``offset`` (the
order column), ``__deleted``, ``v_int`` int64, ``v_str`` (random, 50-70 ASCII
characters), ``v_float`` float64. Measured in one run:

(1) ours, the user path: one fresh ``upsertctl ingest --engine local`` command per file
    (``python -m orchestration.cli``, SQLite consensus and a local blob directory),
    wall clock from launch to exit; the initial load and the median batch; ``--modes``:
    warm (the default: forks of the warm upsertctl process) and/or cold
    (``UPSERT_LOCAL_SERVER=off``), each into a shard of its own;
(2) delta-rs: ``write_deltalake`` of the initial file, then per batch the batch
    de-duplicated (greatest offset per key) and one MERGE with a delete clause, all in
    ONE worker process (its memory apart from ours), each step timed inside the worker
    (so interpreter start and imports are not in delta-rs's figures; the worker reports
    its time from launch to ready);
(3) reads after the batches: (a) the latest snapshot, ``open_shard(...).snapshot()`` vs
    ``DeltaTable(path).to_pyarrow_table()``, each in its own warm worker process (four
    reads, the best of the last three); (b) an export to Parquet as a fresh process,
    ``upsertctl snapshot --format parquet --out`` vs ``python -c`` writing
    ``DeltaTable(path).to_pyarrow_table()``; (c) an as-of read of the first batch
    (``snapshot(as_of=1)`` vs ``DeltaTable(path, version=1)``), warm as in (a);
(4) bytes after the initial load and the first batch, and at the end: ours total (the
    blob directory plus the consensus database) and referenced (the current state's
    batch parts plus its checkpoint blobs); delta-rs total (the table directory) and
    live (the current version's data files);
(5) both ends must agree: the final snapshots compared on sorted (key, offset, v_int,
    v_str, v_float); a ``FAIL`` line says when they do not;
(6) peak RSS of every process (``/usr/bin/time``'s maximum resident set): ours per
    file, the delta-rs worker (split between initial load and batches with ``/proc``'s
    high-water mark).

Before timing, one ``upsertctl --help`` and one ``import deltalake`` process run
untimed, so neither side pays bytecode compilation or a cold page cache.

Usage: ``.venv/bin/python -m bench.wide [--keys N] [--batch-rows R] [--batches K]
[--out PATH]`` (defaults 1M keys, 100k rows, 5 batches, ``bench/out/wide.md``).
Progress goes to stderr; a table goes to stdout and ``--out``; the LAST line printed is
one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench._measure import dir_bytes, peak_mb, reset_peak, rounded
from bench._workload import dedup_batch, wide_canonical, write_wide_workload

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "out" / "wide.md"
SHARD = "bench"
READS = 4
"""Reads per warm read worker; the figure is the best of all but the first."""

DELTA_EXPORT = (
    "import sys, pyarrow.parquet as pq; from deltalake import DeltaTable; "
    "pq.write_table(DeltaTable(sys.argv[1]).to_pyarrow_table(), sys.argv[2])"
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- processes -----------------------------------------------------------------------------


@dataclass
class Proc:
    """A finished child process: wall clock from launch to exit, its peak RSS, exit
    status and stdout."""

    seconds: float
    peak_mb: float
    returncode: int
    stdout: str

    def json(self) -> dict[str, Any]:
        """The child's last stdout line, a JSON object (how workers report)."""
        return json.loads(self.stdout.strip().splitlines()[-1])


TIME = "/usr/bin/time"
_PEAK_MARK = "bench-wide-peak-kb"


def run(command: Sequence[str], env: dict[str, str], check: bool = True) -> Proc:
    """Run ``command`` to completion (its stderr shown only if it fails), after an
    untimed ``sync``. The peak RSS is the command's own maximum resident set, measured
    by ``/usr/bin/time`` (a small process), not by this process's ``wait4``: on Linux a
    child's ``ru_maxrss`` starts from its parent's resident set at the fork (kept
    across ``exec``), which at 30M keys is this process's 5 GB of workload; without
    ``/usr/bin/time`` it falls back to ``wait4`` (an upper bound)."""
    # Dirty pages of earlier steps (the workload just written, the other side's table)
    # are flushed first, so no run pays for another's writeback.
    os.sync()
    timed = os.access(TIME, os.X_OK)
    argv = [TIME, "-f", f"{_PEAK_MARK} %M", *command] if timed else list(command)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        errors = err.read().decode(errors="replace")
        peak_kb = usage.ru_maxrss
        if timed:
            lines = errors.rstrip("\n").split("\n")
            if lines and lines[-1].startswith(_PEAK_MARK):
                peak_kb = int(lines[-1].split()[1])
                errors = "\n".join(lines[:-1])
            if proc.returncode != 0 and "Command exited with non-zero status" in errors:
                errors = "\n".join(line for line in errors.split("\n")
                                   if not line.startswith("Command exited with"))
        if check and proc.returncode != 0:
            log(errors)
            raise RuntimeError(f"{list(command[:6])} exited with {proc.returncode}")
        text = out.read().decode()
    return Proc(seconds, round(peak_kb / 1024, 1), proc.returncode, text)


def worker(*args: str) -> list[str]:
    """The command line of one of this module's worker processes."""
    return [sys.executable, "-m", "bench.wide", "worker", *args]


# --- workers (run in their own processes; each prints one JSON line) ------------------------


def _delta_live_bytes(path: str) -> int:
    from deltalake import DeltaTable

    actions = pa.table(DeltaTable(path).get_add_actions(flatten=True))
    return int(pc.sum(actions.column("size_bytes")).as_py() or 0)


def _delta_bytes(path: str) -> dict[str, int]:
    return {"live": _delta_live_bytes(path), "total": dir_bytes(Path(path))}


def delta_ingest_worker(
    launched: float, path: str, initial: str, batches: list[str]
) -> dict[str, Any]:
    """delta-rs: write the initial load, MERGE each batch; every step timed here.
    ``launched`` is the wall clock (``time.time()``) at which the parent launched us."""
    from deltalake import DeltaTable, write_deltalake

    out: dict[str, Any] = {"startup_s": time.time() - launched, "batch_s": []}
    me = [os.getpid()]
    reset_peak(me)
    started = time.perf_counter()
    write_deltalake(path, pq.read_table(initial).drop_columns(["__deleted"]))
    out["initial_s"] = time.perf_counter() - started
    out["peak_initial_mb"] = peak_mb(me)
    reset_peak(me)
    for i, batch in enumerate(batches):
        started = time.perf_counter()
        source = dedup_batch(pq.read_table(batch))
        (
            DeltaTable(path)
            .merge(source=source, predicate="t.key = s.key", source_alias="s",
                   target_alias="t")
            .when_matched_delete(predicate="s.__deleted")
            .when_matched_update_all(predicate="NOT s.__deleted", except_cols=["__deleted"])
            .when_not_matched_insert_all(predicate="NOT s.__deleted",
                                         except_cols=["__deleted"])
            .execute()
        )
        out["batch_s"].append(time.perf_counter() - started)
        if i == 0:
            out["bytes_after_batch1"] = _delta_bytes(path)
    out["bytes_end"] = _delta_bytes(path)
    out["peak_batches_mb"] = peak_mb(me)
    return out


def ours_ingest_worker(
    launched: float, work: str, initial: str, batches: list[str]
) -> dict[str, Any]:
    """Ours in one process (the issue's "in-process warm"): the initial load and each
    batch ingested in turn by one ``InProcessEngine``, with ``upsertctl``'s memory
    settings, every step timed here as delta-rs's are."""
    from upsert_core.arrow_startup import defer_pandas, keep_freed_memory, prefer_jemalloc

    keep_freed_memory()
    prefer_jemalloc()
    defer_pandas()
    from upsert_core.ingest import IngestRequest, InProcessEngine, ingest
    from upsert_core.persist.location.urls import open_blob, open_consensus
    from upsert_core.persist.shard import Shard

    out: dict[str, Any] = {"startup_s": time.time() - launched, "batch_s": []}
    root = Path(work)
    landing = root / "landing"
    landing.mkdir(parents=True)
    shard = Shard.open(open_consensus(f"sqlite:///{root / 'consensus.db'}"),
                       open_blob(f"file://{root / 'blob'}"), SHARD)
    engine, request = InProcessEngine(), IngestRequest()
    me = [os.getpid()]
    reset_peak(me)
    for i, path in enumerate([initial, *batches]):
        os.link(path, landing / Path(path).name)
        started = time.perf_counter()
        report = ingest(shard, f"file://{landing}", request, engine=engine)
        seconds = time.perf_counter() - started
        if len(report.files) != 1:
            raise RuntimeError(f"expected one file ingested, got {report.files}")
        if i == 0:
            out["initial_s"] = seconds
            out["peak_initial_mb"] = peak_mb(me)
            reset_peak(me)
        else:
            out["batch_s"].append(seconds)
    out["peak_batches_mb"] = peak_mb(me)
    return out


def read_worker(kind: str, location: str, as_of: int | None) -> dict[str, Any]:
    """:data:`READS` reads in this process: ours (``location`` is ``consensus|blob``) or
    delta-rs (``location`` is the table path), at ``as_of`` (a ts or a version)."""
    if kind == "ours":
        from upsert_core import open_shard

        consensus, blob = location.split("|", 1)

        def read() -> pa.Table:
            return open_shard(SHARD, consensus, blob).snapshot(as_of=as_of)
    else:
        from deltalake import DeltaTable

        def read() -> pa.Table:
            return DeltaTable(location, version=as_of).to_pyarrow_table()

    times = []
    rows = 0
    for _ in range(READS):
        started = time.perf_counter()
        rows = read().num_rows
        times.append(time.perf_counter() - started)
    return {"first_s": times[0], "best_s": min(times[1:]), "rows": rows}


def worker_main(argv: list[str]) -> int:
    kind = argv[0]
    if kind == "delta-ingest":
        result = delta_ingest_worker(float(argv[1]), argv[2], argv[3], argv[4:])
    elif kind == "ours-ingest":
        result = ours_ingest_worker(float(argv[1]), argv[2], argv[3], argv[4:])
    elif kind in ("ours-read", "delta-read"):
        as_of = None if argv[2] == "latest" else int(argv[2])
        result = read_worker(kind.split("-")[0], argv[1], as_of)
    else:
        raise SystemExit(f"unknown worker {kind!r}")
    print(json.dumps(result), flush=True)
    # deltalake 1.6 with pyarrow 26 often aborts at interpreter teardown once a table
    # was read ("terminate called without an active exception", delta-rs issue 2184):
    # a worker's figures are taken, so it leaves without the teardown.
    sys.stderr.flush()
    os._exit(0)


# --- ours: bytes ---------------------------------------------------------------------------


def our_bytes(work: Path, consensus_url: str, blob_url: str) -> dict[str, int]:
    """Ours on disk: ``total`` (blob directory + consensus database files) and
    ``referenced`` (the current state's batch parts, error parts and checkpoints)."""
    from upsert_core import open_shard
    from upsert_core.persist.keys import shard_prefix
    from upsert_core.persist.state.state import BLOB_REF_PREFIX

    shard = open_shard(SHARD, consensus_url, blob_url).shard
    state = shard.state()
    sizes = {m.key: m.size_in_bytes for m in shard.blob.list_keys(shard_prefix(SHARD))}
    parts = state.encoded_size_bytes()  # batch parts and error parts
    part_keys = {p.key for b in state.batches for p in b.parts if hasattr(p, "key")}
    # A part base is a batch part the checkpoint ref names too: counted once, as a part.
    checkpoints = sum(
        sizes.get(key, 0) for name, key in state.config.items()
        if name.startswith(BLOB_REF_PREFIX) and key and key not in part_keys
    )
    consensus = sum(p.stat().st_size for p in work.glob("consensus.db*"))
    return {
        "total": dir_bytes(work / "blob") + consensus,
        "referenced": parts + checkpoints,
        "parts": parts,
        "checkpoints": checkpoints,
        "consensus": consensus,
    }


# --- the run -------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def wait_for_warm_process(directory: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not list(directory.glob("*.sock")):
        if time.monotonic() > deadline:
            raise SystemExit(f"no warm upsertctl process started in {directory}")
        time.sleep(0.1)


def stop_warm_process(directory: Path) -> None:
    for socket_file in directory.glob("*.sock"):
        socket_file.unlink()  # the warm process exits within its tick


def warm_up_spark(cli: list[str], env: dict[str, str], work: Path, sample: Path) -> None:
    """Start the local Spark server and its Python workers (untimed): an ingest of the
    first 1,000 rows of ``sample`` into a shard of its own."""
    landing = work / "landing"
    landing.mkdir(parents=True)
    pq.write_table(pq.read_table(sample).slice(0, 1000), landing / "warm-up.parquet")
    run([*cli, "ingest", "--shard", "warm-up", "--engine", "spark", "--no-progress",
         str(landing)], env)


def measure(n_keys: int, rows: int, batches: int, root: Path,
            modes: tuple[str, ...] = ("warm", "cold"), engine: str = "local",
            inproc: bool = True) -> dict[str, Any]:
    figures: dict[str, Any] = {"keys": n_keys, "batch_rows": rows, "batches": batches,
                               "modes": list(modes), "engine": engine}
    log(f"workload: {n_keys} keys, {batches} batches of {rows} rows")
    started = time.perf_counter()
    initial, batch_files = write_wide_workload(root / "files", n_keys, rows, batches)
    figures["workload_gen_s"] = time.perf_counter() - started
    figures["landing_bytes_initial"] = initial.stat().st_size
    figures["landing_bytes_batch"] = batch_files[0].stat().st_size if batch_files else 0
    log(f"  written in {figures['workload_gen_s']:.1f}s")

    env = {**os.environ}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # a user's Python caches bytecode
    run([sys.executable, "-c", "import deltalake, pyarrow.parquet"], env)
    cli = [sys.executable, "-m", "orchestration.cli"]  # what the console script runs

    # (1) ours: one upsertctl per file; warm (the default: forks of the warm upsertctl
    # process) and cold (UPSERT_LOCAL_SERVER=off: every command imports everything)
    for mode in modes:
        prefix = "ours" if mode == modes[0] else f"ours_{mode}"
        ours_dir = root / f"ours-{mode}"
        landing = ours_dir / "landing"
        landing.mkdir(parents=True)
        consensus_url = f"sqlite:///{ours_dir / 'consensus.db'}"
        blob_url = f"file://{ours_dir / 'blob'}"
        our_env = {**env, "UPSERT_CONSENSUS_URL": consensus_url, "UPSERT_BLOB_URL": blob_url,
                   "UPSERT_LOCAL_SERVER": "auto" if mode == "warm" else "off",
                   "UPSERT_LOCAL_SERVER_DIR": str(root / "warm-upsertctl"),
                   # The Spark engine: the warm local Spark Connect server of this home.
                   "UPSERT_HOME": str(root / "upsert-home"), "UPSERT_SPARK_SERVER": "auto"}
        for name in ("SPARK_REMOTE", "SPARK_MASTER"):
            our_env.pop(name, None)
        log(f"ours ({mode}) warm-up (untimed): upsertctl --help")
        run([*cli, "--help"], our_env)
        if mode == "warm":
            wait_for_warm_process(root / "warm-upsertctl")
        if engine == "spark":
            log(f"ours ({mode}) warm-up (untimed): a Spark ingest of a small file")
            warm_up_spark(cli, our_env, root / f"warm-up-{mode}", batch_files[0])
        log(f"ours ({mode}): upsertctl ingest --engine {engine} per file")
        ingest = [*cli, "ingest", "--shard", SHARD, "--engine", engine, "--no-progress",
                  str(landing)]
        our_runs: list[Proc] = []
        for i, path in enumerate([initial, *batch_files]):
            os.link(path, landing / path.name)
            proc = run(ingest, our_env)
            our_runs.append(proc)
            log(f"  {path.name}: {proc.seconds:.3f}s, peak RSS {proc.peak_mb:.0f} MB")
            if i == 1:
                figures[f"{prefix}_bytes_after_batch1"] = our_bytes(
                    ours_dir, consensus_url, blob_url)
        figures[f"{prefix}_bytes_end"] = our_bytes(ours_dir, consensus_url, blob_url)
        figures[f"{prefix}_initial_s"] = our_runs[0].seconds
        figures[f"{prefix}_batch_s_list"] = [p.seconds for p in our_runs[1:]]
        figures[f"{prefix}_batch_s"] = median(figures[f"{prefix}_batch_s_list"])
        # A warm command runs in a fork of the warm process: this process's peak RSS is
        # the client's, not the command's, so peaks come from the cold run only.
        cold = mode == "cold"
        figures[f"{prefix}_peak_initial_mb"] = our_runs[0].peak_mb if cold else None
        figures[f"{prefix}_peak_batches_mb"] = max(
            (p.peak_mb for p in our_runs[1:]), default=None) if cold else None
        if mode == modes[0]:
            main_env, main_dir = our_env, ours_dir
            main_urls = (consensus_url, blob_url)
    our_env, ours_dir = main_env, main_dir
    consensus_url, blob_url = main_urls
    if "cold" in modes and modes[0] != "cold":
        figures["ours_peak_initial_mb"] = figures["ours_cold_peak_initial_mb"]
        figures["ours_peak_batches_mb"] = figures["ours_cold_peak_batches_mb"]

    # (2) delta-rs: one worker process
    log("delta-rs: write_deltalake + MERGE per batch, one worker process")
    delta_path = str(root / "delta")
    proc = run(worker("delta-ingest", repr(time.time()), delta_path, str(initial),
                      *map(str, batch_files)), env)
    delta = proc.json()
    for i, seconds in enumerate(delta["batch_s"], 1):
        log(f"  batch {i}: {seconds:.3f}s")
    figures["delta_startup_s"] = delta["startup_s"]
    figures["delta_worker_wall_s"] = proc.seconds
    figures["delta_initial_s"] = delta["initial_s"]
    figures["delta_batch_s_list"] = delta["batch_s"]
    figures["delta_batch_s"] = median(delta["batch_s"])
    figures["delta_bytes_after_batch1"] = delta.get("bytes_after_batch1")
    figures["delta_bytes_end"] = delta["bytes_end"]
    figures["delta_peak_mb"] = proc.peak_mb
    figures["delta_peak_initial_mb"] = delta["peak_initial_mb"] or proc.peak_mb
    figures["delta_peak_batches_mb"] = delta["peak_batches_mb"] or proc.peak_mb

    if inproc and engine == "local":
        log("ours in one process (in-process warm): InProcessEngine per file, timed inside")
        proc = run(worker("ours-ingest", repr(time.time()), str(root / "ours-inproc"),
                          str(initial), *map(str, batch_files)), env)
        inproc_figures = proc.json()
        for i, seconds in enumerate(inproc_figures["batch_s"], 1):
            log(f"  batch {i}: {seconds:.3f}s")
        figures["ours_inproc_initial_s"] = inproc_figures["initial_s"]
        figures["ours_inproc_batch_s_list"] = inproc_figures["batch_s"]
        figures["ours_inproc_batch_s"] = median(inproc_figures["batch_s"])
        figures["ours_inproc_peak_initial_mb"] = inproc_figures["peak_initial_mb"]
        figures["ours_inproc_peak_batches_mb"] = inproc_figures["peak_batches_mb"]

    # (3a, 3c) warm reads
    ours_location = f"{consensus_url}|{blob_url}"
    for label, as_of in (("snapshot", "latest"), ("as_of", "1")):
        for side, args in (("ours", ("ours-read", ours_location, as_of)),
                           ("delta", ("delta-read", delta_path, as_of))):
            proc = run(worker(*args), env)
            result = proc.json()
            figures[f"{side}_{label}_s"] = result["best_s"]
            figures[f"{side}_{label}_first_s"] = result["first_s"]
            figures[f"{side}_{label}_rows"] = result["rows"]
            figures[f"{side}_{label}_peak_mb"] = proc.peak_mb
            log(f"  {side} {label} (warm, best of {READS - 1}): {result['best_s']:.3f}s, "
                f"first {result['first_s']:.3f}s, {result['rows']} rows")

    # (3b) fresh-process export to Parquet
    exports = root / "exports"
    exports.mkdir()
    ours_export = exports / "ours.parquet"
    delta_export = exports / "delta.parquet"
    proc = run([*cli, "snapshot", "--shard", SHARD, "--format", "parquet", "--out",
                str(ours_export)], our_env)
    figures["ours_export_s"] = proc.seconds
    figures["ours_export_peak_mb"] = proc.peak_mb if modes[0] == "cold" else None
    # The export is complete before teardown; see worker_main for a teardown abort.
    proc = run([sys.executable, "-c", DELTA_EXPORT, delta_path, str(delta_export)], env,
               check=False)
    figures["delta_export_s"], figures["delta_export_peak_mb"] = proc.seconds, proc.peak_mb
    figures["delta_export_exit"] = proc.returncode
    log(f"  export (fresh process): ours {figures['ours_export_s']:.3f}s, "
        f"delta-rs {figures['delta_export_s']:.3f}s")

    # (5) both ends agree: our snapshot, read here, against delta-rs's exported table
    # (read through a file: deltalake's to_pyarrow_table here could abort our teardown)
    from upsert_core import open_shard

    ours_final = wide_canonical(open_shard(SHARD, consensus_url, blob_url).snapshot())
    delta_final = wide_canonical(pq.read_table(delta_export))
    figures["final_rows"] = {"ours": ours_final.num_rows, "delta": delta_final.num_rows}
    figures["snapshots_equal"] = ours_final.equals(delta_final)
    figures["ours_export_equal"] = wide_canonical(pq.read_table(ours_export)).equals(ours_final)
    stop_warm_process(root / "warm-upsertctl")
    if engine == "spark":
        run([*cli, "spark", "stop"], our_env, check=False)
    return figures


# --- reporting -----------------------------------------------------------------------------

MB = 1e6


def table_lines(f: dict[str, Any]) -> list[str]:
    def row(label: str, delta: float | None, ours: float | None, digits: int = 3) -> str:
        def cell(v: float | None) -> str:
            return "-" if v is None else f"{v:.{digits}f}"

        ratio = f"{ours / delta:.2f}" if delta and ours is not None else "-"
        return f"| {label} | {cell(delta)} | {cell(ours)} | {ratio} |"

    def mb(side: str, point: str, kind: str) -> float | None:
        value = (f.get(f"{side}_bytes_{point}") or {}).get(kind)
        return None if value is None else value / MB

    lines = ["| figure | delta-rs | ours | ratio ours/delta |", "|---|---:|---:|---:|"]
    lines += [
        row(f"initial load, s ({f['modes'][0]} upsertctl)", f["delta_initial_s"],
            f["ours_initial_s"]),
        row(f"batch, median s ({f['modes'][0]} upsertctl)", f["delta_batch_s"],
            f["ours_batch_s"]),
        *([row("initial load, s (cold upsertctl)", f["delta_initial_s"],
                f["ours_cold_initial_s"]),
            row("batch, median s (cold upsertctl)", f["delta_batch_s"],
                f["ours_cold_batch_s"])] if "ours_cold_batch_s" in f else []),
        *([row("initial load, s (in one process, as delta-rs's)", f["delta_initial_s"],
                f["ours_inproc_initial_s"]),
            row("batch, median s (in one process, as delta-rs's)", f["delta_batch_s"],
                f["ours_inproc_batch_s"])] if "ours_inproc_batch_s" in f else []),
        row("snapshot read, warm process, s", f.get("delta_snapshot_s"),
            f.get("ours_snapshot_s")),
        row("as-of read (ts / version 1), warm process, s", f.get("delta_as_of_s"),
            f.get("ours_as_of_s")),
        row("export to Parquet, fresh process, s", f["delta_export_s"], f["ours_export_s"]),
        row("MB after initial + batch 1: total", mb("delta", "after_batch1", "total"),
            mb("ours", "after_batch1", "total"), 1),
        row("MB after initial + batch 1: live / referenced",
            mb("delta", "after_batch1", "live"), mb("ours", "after_batch1", "referenced"), 1),
        row(f"MB after {f['batches']} batches: total", mb("delta", "end", "total"),
            mb("ours", "end", "total"), 1),
        row(f"MB after {f['batches']} batches: live / referenced", mb("delta", "end", "live"),
            mb("ours", "end", "referenced"), 1),
        row("peak RSS MB, initial load", f["delta_peak_initial_mb"],
            f["ours_peak_initial_mb"], 0),
        row("peak RSS MB, batches", f["delta_peak_batches_mb"], f["ours_peak_batches_mb"], 0),
        row("peak RSS MB, snapshot read worker", f.get("delta_snapshot_peak_mb"),
            f.get("ours_snapshot_peak_mb"), 0),
        row("peak RSS MB, export process", f["delta_export_peak_mb"],
            f["ours_export_peak_mb"], 0),
    ]
    return lines


def report(f: dict[str, Any]) -> list[str]:
    def fmt(values: list[float]) -> str:
        return ", ".join(f"{v:.2f}" for v in values)

    title = (f"{f['keys']:,} keys, {f['batches']} batches of {f['batch_rows']:,} rows "
             "(70% upd, 20% new, 10% del, 5% dup; key, offset, v_int, v_str 50-70 chars, "
             "v_float)")
    lines = [f"### Wide workload: {title}", "", *table_lines(f), ""]
    lines += [
        f"Batches, s: ours {fmt(f['ours_batch_s_list'])}"
        + (f" (cold: {fmt(f['ours_cold_batch_s_list'])})" if "ours_cold_batch_s_list" in f
           else "")
        + (f" (in one process: {fmt(f['ours_inproc_batch_s_list'])})"
           if "ours_inproc_batch_s_list" in f else "")
        + f"; delta-rs {fmt(f['delta_batch_s_list'])}.",
        f"Ours: a fresh `upsertctl ingest --engine {f.get('engine', 'local')}` command per"
        " file, launch to exit (spark: the warm local Spark Connect server, started by an"
        " untimed ingest); "
        "warm: run by a fork of the warm upsertctl process (the default), cold: "
        "`UPSERT_LOCAL_SERVER=off`, every command imports everything (peak RSS figures "
        "are the cold commands': a warm command's memory is its fork's). "
        "delta-rs: timed inside one worker (read + de-duplicate + MERGE); its start "
        f"(interpreter and imports, launch to ready: {f['delta_startup_s']:.2f} s) is not "
        "in its figures.",
        "Referenced = the current state's batch parts + checkpoint blobs; live = the "
        "current Delta version's data files. Warm reads: best of the last "
        f"{READS - 1} of {READS} in one process.",
    ]
    rows = f["final_rows"]
    if f["snapshots_equal"]:
        lines.append(f"Final snapshots agree: {rows['ours']:,} rows, equal on sorted "
                     "(key, offset, v_int, v_str, v_float).")
    else:
        lines.append(f"FAIL: final snapshots differ (ours {rows['ours']:,} rows, delta-rs "
                     f"{rows['delta']:,} rows)")
    if not f["ours_export_equal"]:
        lines.append("FAIL: our Parquet export differs from our snapshot")
    if f["delta_export_exit"] != 0:
        lines.append(f"Note: the delta-rs export process exited with {f['delta_export_exit']} "
                     "after writing its file (an abort at interpreter teardown).")
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        return worker_main(argv[1:])
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000, help="keys loaded (1M)")
    parser.add_argument("--batch-rows", type=int, default=100_000, help="rows per batch")
    parser.add_argument("--batches", type=int, default=5, help="change batches (5)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="markdown output")
    parser.add_argument("--engine", choices=("local", "spark"), default="local",
                        help="our engine: local (in-process, default) or spark (the warm"
                             " local Spark Connect server, local[*])")
    parser.add_argument("--skip-inproc", action="store_true",
                        help="no in-process run (ours in one process, timed inside)")
    parser.add_argument("--modes", default="warm,cold",
                        help="our runs, the first one's shard read after: warm (the warm"
                             " upsertctl process), cold (UPSERT_LOCAL_SERVER=off); default"
                             " warm,cold")
    args = parser.parse_args(argv)
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if not modes or any(m not in ("warm", "cold") for m in modes):
        parser.error("--modes: warm, cold or both")
    if args.batches < 1:
        parser.error("--batches must be at least 1")
    with tempfile.TemporaryDirectory(prefix="bench-wide-") as tmp:
        figures = measure(args.keys, args.batch_rows, args.batches, Path(tmp), modes,
                          args.engine, not args.skip_inproc)
    lines = report(figures)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(json.dumps(rounded(figures)))
    return 0 if figures["snapshots_equal"] and figures["ours_export_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
