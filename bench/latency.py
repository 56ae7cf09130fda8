"""Latency benchmark: how long a user waits for one new file, a command, a run, a check.

Where :mod:`bench.ingest` measures throughput (100k-row batches against 1M keys), this
measures what a user lives through per file, each figure the median of several
fresh processes (cold interpreter, imports, opening the shard, the engine's start):

(a) ``upsertctl ingest`` of one new 1,000-row file into a shard of ``--keys`` keys:
    - against a long-lived Spark Connect server (``SPARK_REMOTE``; started once here,
      from the pyspark package, on ``local[2]``), target <= 3 s;
    - with a fresh local Spark per process (the old default path), for comparison;
    - with the in-process engine (no JVM);
    - the peer: delta-rs MERGE of the same file in a fresh Python process.
(b) ``upsertctl --help``, ``inspect`` and ``errors`` on that shard (target: inspect
    <= 0.5 s).
(c) Dagster: one run of the source's ingest job for one new 1,000-row file, in a fresh
    process as a run worker is (imports, code location, engine start), from the run's
    start to the commit (target <= 10 s) and in all, with the local engine and against
    the Connect server; and (:mod:`bench.latency_dagster`) a backfill of 100 small files
    as one run (target <= 60 s in all).
(d) Blocking checks (:mod:`bench.check_cost`): their time after the batch at ts 1,000
    over their time at ts 10 on the same data rate (target <= 1.5).

Figures are measured, never asserted. Usage:
``.venv/bin/python -m bench.latency [--keys N] [--files K] [--skip-connect]
[--skip-local-spark] [--skip-dagster] [--skip-checks]``. Progress goes to stderr; a
table to stdout and ``bench/out/latency.md``; the LAST line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench._workload import write_workload
from resources.connect_server import connect_server

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out"
FILE_ROWS = 1_000


def log(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


@dataclass
class Row:
    """One measured figure: the per-run times and, if any, its target."""

    name: str
    seconds: list[float] = field(default_factory=list)
    target_s: float | None = None
    note: str = ""

    @property
    def median(self) -> float | None:
        return statistics.median(self.seconds) if self.seconds else None

    def line(self) -> str:
        median = "n/a" if self.median is None else f"{self.median:.3f}"
        target = "" if self.target_s is None else f"<= {self.target_s:g}"
        met = ""
        if self.median is not None and self.target_s is not None:
            met = "yes" if self.median <= self.target_s else "NO"
        runs = ", ".join(f"{s:.2f}" for s in self.seconds)
        return f"| {self.name} | {median} | {target} | {met} | {runs} | {self.note} |"


def user_env(work: Path) -> dict[str, str]:
    """The environment of a user's shell: embedded stores under ``work``, bytecode cached,
    and the warm upsertctl (the default) with its sockets under ``work`` (a benchmark's
    own warm process; removing ``work`` stops it)."""
    env = {
        **os.environ,
        "UPSERT_CONSENSUS_URL": f"sqlite:///{work / 'consensus.db'}",
        "UPSERT_BLOB_URL": f"file://{work / 'blob'}",
        "UPSERT_LOCAL_SERVER_DIR": str(work / "warm-upsertctl"),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
    }
    for name in ("PYTHONDONTWRITEBYTECODE", "SPARK_REMOTE", "SPARK_MASTER", "UPSERT_ENGINE"):
        env.pop(name, None)
    return env


def timed(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()[-2000:]}")
    return seconds


def upsertctl(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestration.cli", *args]


# --- (a) one new file per process ---------------------------------------------------------


@dataclass
class Landing:
    initial: Path
    files: list[Path]


def make_landing(root: Path, keys: int, files: int) -> Landing:
    initial, paths = write_workload(root, keys, FILE_ROWS, files)
    return Landing(initial, paths)


def cli_files(name: str, landing: Landing, work: Path, engine: str,
              extra_env: dict[str, str] | None = None, target: float | None = None) -> Row:
    """Load the initial file (not timed), then one fresh ``upsertctl ingest`` per file."""
    row = Row(name, target_s=target)
    env = {**user_env(work), **(extra_env or {})}
    land = work / "landing"
    land.mkdir(parents=True)
    command = upsertctl("ingest", "--shard", "bench", "--key", "key", "--order", "offset",
                        "--engine", engine, "--no-progress", str(land))
    os.link(landing.initial, land / landing.initial.name)
    timed(upsertctl("ingest", "--shard", "bench", "--key", "key", "--order", "offset",
                    "--engine", "local", "--no-progress", str(land)), env)
    for path in landing.files:
        os.link(path, land / path.name)
        row.seconds.append(timed(command, env))
        log(f"  {name}: {path.name} {row.seconds[-1]:.2f}s")
    return row


DELTA_SCRIPT = """
import sys, pyarrow.parquet as pq
from deltalake import DeltaTable
from bench._workload import dedup_batch
columns = {"offset": "s.offset", "value": "s.value", "amount": "s.amount"}
(DeltaTable(sys.argv[1]).merge(source=dedup_batch(pq.read_table(sys.argv[2])),
    predicate="t.key = s.key", source_alias="s", target_alias="t")
 .when_matched_delete(predicate="s.__deleted")
 .when_matched_update(updates=columns, predicate="NOT s.__deleted")
 .when_not_matched_insert(updates={"key": "s.key", **columns}, predicate="NOT s.__deleted")
 .execute())
"""


def delta_files(landing: Landing, work: Path) -> Row:
    row = Row("peer: delta-rs MERGE, a Python process per file")
    try:
        import pyarrow.parquet as pq
        from deltalake import write_deltalake
    except ImportError:
        row.note = "deltalake not installed (pip install '.[bench]')"
        return row
    path = work / "delta"
    write_deltalake(str(path), pq.read_table(landing.initial).drop_columns(["__deleted"]))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    for file in landing.files:
        row.seconds.append(timed([sys.executable, "-c", DELTA_SCRIPT, str(path), str(file)], env))
        log(f"  delta-rs: {file.name} {row.seconds[-1]:.2f}s")
    return row


# --- (b) read commands --------------------------------------------------------------------


def command_rows(work: Path, repeats: int = 5) -> list[Row]:
    env = user_env(work)
    rows = [
        Row("upsertctl --help", target_s=0.5),
        Row("upsertctl inspect (shard of the runs above)", target_s=0.5),
        Row("upsertctl errors", target_s=None),
    ]
    commands = [upsertctl("--help"), upsertctl("inspect", "--shard", "bench"),
                upsertctl("errors", "--shard", "bench")]
    for row, command in zip(rows, commands, strict=True):
        for _ in range(repeats):
            row.seconds.append(timed(command, env))
        log(f"  {row.name}: best {min(row.seconds):.3f}s")
    return rows


# --- main ------------------------------------------------------------------------------------


def guarded(rows: list[Row], name: str, fn: Callable[[], list[Row]]) -> None:
    try:
        rows.extend(fn())
    except Exception as exc:  # noqa: BLE001 - one failed part must not hide the others
        log(f"  {name} failed: {type(exc).__name__}: {exc}")
        rows.append(Row(name, note=f"failed: {type(exc).__name__}: {str(exc)[:200]}"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__)
    parser.add_argument("--keys", type=int, default=100_000, help="keys in the shard")
    parser.add_argument("--files", type=int, default=5, help="new files per engine")
    parser.add_argument("--skip-connect", action="store_true")
    parser.add_argument("--skip-local-spark", action="store_true")
    parser.add_argument("--skip-dagster", action="store_true")
    parser.add_argument("--skip-checks", action="store_true")
    args = parser.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="upsert-latency-"))
    rows: list[Row] = []
    try:
        log(f"workload: {args.keys} keys, {args.files} new files of {FILE_ROWS} rows")
        landing = make_landing(root / "files", args.keys, args.files)
        if not args.skip_connect:
            def connect() -> list[Row]:
                with connect_server("local[2]", log=root / "connect-server.log") as url:
                    log(f"  Connect server at {url}")
                    return [cli_files("upsertctl ingest, Spark Connect server", landing,
                                      root / "connect", "spark", {"SPARK_REMOTE": url},
                                      target=3.0)]
            guarded(rows, "upsertctl ingest, Spark Connect server", connect)
        if not args.skip_local_spark:
            short = Landing(landing.initial, landing.files[:2])
            guarded(rows, "upsertctl ingest, fresh local Spark", lambda: [cli_files(
                "upsertctl ingest, fresh local Spark per process", short, root / "local-spark",
                "spark", {"UPSERT_SPARK_SERVER": "off"})])  # not the warm local server
        guarded(rows, "upsertctl ingest --engine local", lambda: [cli_files(
            "upsertctl ingest --engine local (no JVM)", landing, root / "local", "local")])
        guarded(rows, "delta-rs", lambda: [delta_files(landing, root / "delta")])
        guarded(rows, "read commands", lambda: command_rows(root / "local"))
        if not args.skip_dagster:
            if not args.skip_connect:
                def dagster_connect() -> list[Row]:
                    with connect_server("local[2]", log=root / "connect-server-dagster.log") as url:
                        return dagster_file_runs(landing, root / "dagster-connect", "spark",
                                                 {"SPARK_REMOTE": url})
                guarded(rows, "Dagster runs, Spark Connect", dagster_connect)
            guarded(rows, "Dagster runs, local engine", lambda: dagster_file_runs(
                landing, root / "dagster-local", "local"))
            guarded(rows, "Dagster backfill", dagster_backfill_row)
        if not args.skip_checks:
            guarded(rows, "blocking checks", check_rows)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    header = ["| figure | median s | target | met | runs (s) | note |",
              "|---|---|---|---|---|---|"]
    table = "\n".join(header + [r.line() for r in rows])
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "latency.md").write_text(table + "\n")
    print(table)
    print(json.dumps({r.name: {"median_s": r.median, "runs_s": r.seconds, "target_s": r.target_s,
                               "note": r.note} for r in rows}, sort_keys=True))
    return 0


DAGSTER_RUN = """
import sys, time
from dagster import DagsterEventType, DagsterInstance
started = time.time()
from orchestration.definitions import SOURCES, defs
spec = SOURCES[0]
instance = DagsterInstance.get()
instance.add_dynamic_partitions(spec.partitions_name, [sys.argv[1]])
job = defs.resolve_job_def(spec.name + "_ingest")
result = job.execute_in_process(partition_key=sys.argv[1], instance=instance)
assert result.success
events = instance.all_logs(result.run_id)
start = next(e.timestamp for e in events if e.dagster_event_type == DagsterEventType.RUN_START)
committed = next(e.timestamp for e in events
                 if e.dagster_event_type == DagsterEventType.ASSET_MATERIALIZATION
                 and e.step_key.endswith("upsert_state"))
print(f"{committed - start:.4f} {committed - started:.4f}")
"""


def dagster_file_runs(landing: Landing, work: Path, engine: str,
                      extra_env: dict[str, str] | None = None,
                      label: str | None = None) -> list[Row]:
    """One fresh process per new file running the source's ingest job for it (imports,
    code location, engine start, ingest, checks): what a run worker lives through."""
    if label is None:
        label = "Spark Connect server" if extra_env and "SPARK_REMOTE" in extra_env else engine
    in_run = Row(f"Dagster run for one new 1,000-row file ({label}): run start to committed",
                 target_s=10.0)
    whole = Row(f"Dagster run for one new 1,000-row file ({label}): whole process")
    home = work / "dagster"
    home.mkdir(parents=True)
    shutil.copy(REPO / "deploy" / "dagster-dev.yaml", home / "dagster.yaml")
    land = work / "landing"
    land.mkdir()
    env = {**user_env(work), **(extra_env or {}), "DAGSTER_HOME": str(home),
           "UPSERT_LANDING": str(land), "UPSERT_SHARD": "bench", "UPSERT_KEY": "key",
           "UPSERT_ORDER": "offset", "UPSERT_ENGINE": engine,
           "UPSERT_SOURCES": str(work / "sources.yaml")}
    (work / "sources.yaml").write_text("sources: []\n")  # only the UPSERT_LANDING source
    os.link(landing.initial, land / landing.initial.name)
    timed(upsertctl("ingest", "--shard", "bench", "--key", "key", "--order", "offset",
                    "--engine", "local", "--no-progress", str(land)), env)
    for path in landing.files:
        os.link(path, land / path.name)
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", DAGSTER_RUN, path.name], env=env,
                              capture_output=True, text=True, cwd=REPO)
        whole.seconds.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise RuntimeError(f"the Dagster run failed: {done.stderr.strip()[-2000:]}")
        in_run.seconds.append(float(done.stdout.split()[-2]))
        log(f"  Dagster ({label}): {path.name} {in_run.seconds[-1]:.2f}s in the run,"
            f" {whole.seconds[-1]:.2f}s in all")
    return [in_run, whole]


def dagster_backfill_row() -> list[Row]:
    from bench import latency_dagster

    row = Row("Dagster: backfill of 100 files of 100 rows, one run (CLI backfill)",
              target_s=60.0)
    row.seconds.append(latency_dagster.backfill_seconds(100, 100, "local"))
    return [row]


def check_rows() -> list[Row]:
    from bench import check_cost

    at_10 = check_cost.check_seconds_at(10, 1_000, 10_000, full=False)
    at_1000 = check_cost.check_seconds_at(1_000, 1_000, 10_000, full=False)
    first, last = float(at_10["blocking_seconds"]), float(at_1000["blocking_seconds"])
    ratio = Row("blocking checks: time at ts 1,000 / time at ts 10 (ratio, GC every 100)",
                target_s=1.5, note=f"{first * 1000:.1f} ms at ts 10, {last * 1000:.1f} ms at"
                f" ts 1,000")
    ratio.seconds.append(last / first)
    return [ratio]


if __name__ == "__main__":
    sys.exit(main())
