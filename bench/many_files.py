"""A backfill of many small files in one ``upsertctl ingest``: how long the run takes, and
how many Spark jobs it is (issue 24: "a run of many files is one job").

``python -m bench.many_files [--files N] [--rows R] [--only NAME ...]``

Each measurement ingests ``--files`` (100) JSON Lines files of ``--rows`` (100) rows into
a new shard, with a fresh ``upsertctl ingest`` process (imports, the engine's start, the
run, the commits):

- ``spark-jvm``: the Spark engine on a JVM of the process's own (``UPSERT_SPARK_SERVER=off``,
  ``SPARK_MASTER=local[2]``): the JVM's start is in the figure;
- ``spark-server``: the Spark engine on the warm local Spark Connect server (the default
  on the embedded stores; the server is started and warmed by an untimed ingest first,
  and stopped at the end);
- ``local``: the in-process engine (``--engine local``, no JVM);
- ``jobs``: the ingest called in this process on a classic ``local[2]`` session whose
  Python workers an untimed ingest of two files started, with the Spark jobs it ran
  counted by the status tracker.

Wall seconds (of which ``maintenance_s``: the GC pass the ingest runs after a run that
leaves 12 batches or more, ``ingest.maintenance``), CPU seconds (user + system of the
command's process tree, sampled from ``/proc`` while it runs, plus the warm server's
process tree for ``spark-server``) and the machine's load average around each run.
Figures are measured, never asserted. The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench._measure import descendants, rounded
from bench.latency import log, upsertctl, user_env
from bench.latency_dagster import _write_files

REPO = Path(__file__).resolve().parents[1]
NAMES = ("spark-jvm", "spark-server", "local", "jobs")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cpu_of(pid: int) -> float | None:
    """User + system seconds ``pid`` has used so far (from ``/proc``), None if gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _warm_cpu(env: dict[str, str]) -> float:
    """User + system seconds of the warm upsertctl process and the children it reaped
    (the commands it ran: their CPU is not the command's process tree's)."""
    import re

    for log_file in Path(env["UPSERT_LOCAL_SERVER_DIR"]).glob("*.log"):
        for pid in re.findall(r"\(pid (\d+)\): serving", log_file.read_text())[-1:]:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
            except (OSError, ValueError, IndexError):
                return 0.0
    return 0.0


def _tree_cpu(pid: int) -> float:
    """User + system seconds of ``pid`` and its descendants so far."""
    return sum(c for p in descendants(pid) if (c := _cpu_of(p)) is not None)


def _run_sampled(command: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str],
                                                                    str, str, float]:
    """Run ``command``; its output and the CPU seconds of its whole process tree, sampled
    every 0.1 s from ``/proc`` (a JVM and its Python workers are not reaped by the
    command, so its rusage misses them; a process's last 0.1 s may be missed here)."""
    proc = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen: dict[int, float] = {}
    out: list[str] = []
    err: list[str] = []
    def drain(stream: Any, into: list[str]) -> None:
        into.append(stream.read())

    readers = [threading.Thread(target=drain, args=(proc.stdout, out)),
               threading.Thread(target=drain, args=(proc.stderr, err))]
    for reader in readers:
        reader.start()
    while proc.poll() is None:
        for p in descendants(proc.pid):
            cpu = _cpu_of(p)
            if cpu is not None:
                seen[p] = max(seen.get(p, 0.0), cpu)
        time.sleep(0.1)
    for reader in readers:
        reader.join()
    return proc, "".join(out), "".join(err), sum(seen.values())


def _server_pid(home: Path) -> int | None:
    try:
        return int(json.loads((home / "spark" / "server.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def _ingest(landing: Path, shard: str, env: dict[str, str], engine: str) -> dict[str, Any]:
    """One timed ``upsertctl ingest`` of every file of ``landing`` into a new ``shard``."""
    home = Path(env["UPSERT_HOME"])
    server = _server_pid(home) if engine == "spark" else None
    server_before = _tree_cpu(server) if server else 0.0
    load_before = os.getloadavg()[0]
    reaped = _children_cpu()
    warm_before = _warm_cpu(env)
    started = time.perf_counter()
    done, stdout, stderr, cpu = _run_sampled(
        upsertctl("ingest", str(landing), "--shard", shard, "--key", "key", "--order",
                  "offset", "--engine", engine, "--no-progress", "--json"), env)
    wall = time.perf_counter() - started
    cpu = max(cpu, _children_cpu() - reaped)  # exact for a process tree that reaps its own
    cpu += _tree_cpu(server) - server_before if server else 0.0
    cpu += _warm_cpu(env) - warm_before  # the command ran in a fork of the warm upsertctl
    if done.returncode != 0:
        raise RuntimeError(f"upsertctl ingest failed: {stderr.strip()[-2000:]}")
    report = json.loads(stdout)
    maintenance = report.get("maintenance") or {}
    return {"wall_s": wall, "cpu_s": cpu, "files": len(report.get("files", [])),
            "upper": report.get("upper"), "maintenance_s": maintenance.get("seconds"),
            "load": [load_before, os.getloadavg()[0]]}


def _jobs(landing: Path, work: Path) -> dict[str, Any]:
    """The ingest in this process on a classic ``local[2]`` session: its seconds (without
    the session's start) and the Spark jobs it ran (``statusTracker``)."""
    # heavy: pyspark and the ingest, only for this measurement
    from resources.spark_ingest import SparkEngine
    from resources.spark_session import get_spark
    from upsert_core.ingest import IngestRequest, ingest
    from upsert_core.persist.location.urls import open_blob, open_consensus
    from upsert_core.persist.shard import Shard

    spark = get_spark("local[2]", app_name="bench-many-files", log=work / "driver.log")
    try:
        request = IngestRequest(key=("key",), order="offset")
        warm = work / "warm-jobs"
        _write_files(warm, 2, 100)  # starts the Python workers: untimed
        ingest(Shard.open(open_consensus(f"sqlite:///{work / 'warm.db'}"),
                          open_blob(f"file://{work / 'warm-blob'}"), "warm"),
               str(warm), request, engine=SparkEngine(spark))
        shard = Shard.open(open_consensus(f"sqlite:///{work / 'jobs.db'}"),
                           open_blob(f"file://{work / 'jobs-blob'}"), "jobs")
        tracker = spark.sparkContext.statusTracker()
        group = "bench-many-files"
        spark.sparkContext.setJobGroup(group, "many files")
        load_before = os.getloadavg()[0]
        cpu_before = time.process_time() + _children_cpu()
        started = time.perf_counter()
        report = ingest(shard, str(landing), request, engine=SparkEngine(spark))
        wall = time.perf_counter() - started
        # The driver's CPU only: the Python workers are the JVM's, not reaped here.
        cpu = time.process_time() + _children_cpu() - cpu_before
        jobs = len(tracker.getJobIdsForGroup(group))
        return {"wall_s": wall, "driver_cpu_s": cpu, "spark_jobs": jobs,
                "files": len(report.files), "load": [load_before, os.getloadavg()[0]]}
    finally:
        spark.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--only", nargs="*", choices=NAMES, default=list(NAMES))
    args = parser.parse_args(argv)
    base = "/dev/shm" if Path("/dev/shm").is_dir() else None
    work = Path(tempfile.mkdtemp(prefix="upsert-bench-many-", dir=base))
    figures: dict[str, Any] = {"files": args.files, "rows": args.rows}
    server_home: Path | None = None
    try:
        landing = work / "landing"
        _write_files(landing, args.files, args.rows)
        log(f"{args.files} files of {args.rows} rows in {landing}")
        for name in args.only:
            home = work / name
            env = {**user_env(home), "UPSERT_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
                   "PYSPARK_DRIVER_PYTHON": sys.executable, "UPSERT_LOCAL_SERVER": "auto",
                   "UPSERT_LOCAL_SERVER_DIR": str(work / "warm-upsertctl")}
            _start_warm_upsertctl(env)  # as after a user's first command: untimed
            if name == "spark-jvm":
                env.update(UPSERT_SPARK_SERVER="off", SPARK_MASTER="local[2]")
                figures[name] = _ingest(landing, "bench", env, "spark")
            elif name == "spark-server":
                env.pop("UPSERT_SPARK_SERVER", None)
                server_home = home
                warm = work / "warm-landing"
                _write_files(warm, 2, args.rows)
                _ingest(warm, "warm", env, "spark")  # starts and warms the server: untimed
                figures[name] = _ingest(landing, "bench", env, "spark")
            elif name == "local":
                figures[name] = _ingest(landing, "bench", env, "local")
            else:
                figures[name] = _jobs(landing, work)
            log(f"{name}: {json.dumps(rounded(figures[name]))}")
    finally:
        if server_home is not None:
            subprocess.run(upsertctl("spark", "stop"), cwd=REPO, capture_output=True,
                           env={**os.environ, "UPSERT_HOME": str(server_home)})
        shutil.rmtree(work, ignore_errors=True)  # the warm upsertctl exits: no socket
    print(json.dumps(rounded(figures)))


def _start_warm_upsertctl(env: dict[str, str]) -> None:
    """The warm upsertctl process every later command runs in (started by a first
    command, as a user's; the bench then waits until it serves)."""
    sockets = Path(env["UPSERT_LOCAL_SERVER_DIR"])
    if list(sockets.glob("*.sock")):
        return
    subprocess.run(upsertctl("--help"), cwd=REPO, env=env, capture_output=True, check=True)
    deadline = time.monotonic() + 60
    while not list(sockets.glob("*.sock")) and time.monotonic() < deadline:
        time.sleep(0.1)


if __name__ == "__main__":
    main()
