"""First-hour latency (issue 23): the four targets a new user meets on the embedded
defaults (SQLite consensus, local blobs under ``UPSERT_HOME``) with the warm local Spark
(``resources.local_spark``, the default; ``UPSERT_SPARK_SERVER=auto``), each a fresh process per
file or command, as a user's shell runs them:

(1) ``upsertctl ingest`` of one new 1,000-row file into a shard of ``--keys`` keys, the
    second and later commands (the first starts the server and is reported apart);
    target <= 2 s wall.
(2) a file-level error found from the schema (a new shard's file without its key
    column; a Parquet file whose value column changed type), with no Spark running and
    the default engine: answered before any JVM starts; target <= 1 s wall.
(3) a Dagster run of the source's ingest job for one new file, in a fresh process as a
    run worker is, from the run's RUN_START to ``upsert_state``'s materialization (the
    commit), on the warm server; target <= 5 s.
(4) landing to materialized with the landing sensor: a real ``dagster dev`` (webserver,
    daemon, code server) on the source with the default ``sensor_interval_s`` (10 s), the
    sensor turned on through GraphQL; a file is renamed into the landing and the time to
    its partition's ``upsert_state`` materialization (the event's own timestamp) is
    taken; target <= 20 s. The first file of (3) and (4) starts the server and is
    reported apart.

Figures are measured, never asserted; the machine's load average is printed beside
them (the machine is shared). Usage: ``.venv/bin/python -m bench.first_hour [--keys N]
[--files K] [--only errors cli dagster sensor]``. Progress goes to stderr, a table to stdout and
``bench/out/first_hour.md``; the LAST line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from bench.latency import (
    FILE_ROWS,
    OUT,
    REPO,
    Landing,
    Row,
    dagster_file_runs,
    log,
    make_landing,
    timed,
    upsertctl,
    user_env,
)

WARM = {"UPSERT_SPARK_SERVER": "auto"}
SOURCE = "bench"


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def warm_env(work: Path) -> dict[str, str]:
    """A user's shell with the warm local Spark: its state under ``work/home``."""
    return {**user_env(work), **WARM, "UPSERT_HOME": str(work / "home")}


def stop_server(env: dict[str, str]) -> None:
    subprocess.run(upsertctl("spark", "stop"), env=env, capture_output=True, check=False)


def load_initial(landing: Landing, land: Path, env: dict[str, str]) -> None:
    """The shard's initial load, in-process (not timed)."""
    land.mkdir(parents=True, exist_ok=True)
    os.link(landing.initial, land / landing.initial.name)
    timed(upsertctl("ingest", "--shard", SOURCE, "--key", "key", "--order", "offset",
                    "--engine", "local", "--no-progress", str(land)), env)


# --- (1) the warm CLI ------------------------------------------------------------------------


def warm_cli(landing: Landing, work: Path) -> Row:
    row = Row("(1) `upsertctl ingest` of a new 1,000-row file, warm local Spark, 2nd and later",
              target_s=2.0)
    env = warm_env(work)
    land = work / "landing"
    load_initial(landing, land, env)
    command = upsertctl("ingest", "--shard", SOURCE, "--no-progress", str(land))
    try:
        for i, path in enumerate(landing.files):
            os.link(path, land / path.name)
            seconds = timed(command, env)
            log(f"  warm CLI: {path.name} {seconds:.2f}s (load {load_average()})")
            if i == 0:
                row.note = f"first command (starts the server): {seconds:.1f} s"
            else:
                row.seconds.append(seconds)
    finally:
        stop_server(env)
    return row


# --- (2) file-level errors from the schema ---------------------------------------------------


def failing(command: list[str], env: dict[str, str], expect: str) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode == 0 or expect not in done.stderr:
        raise RuntimeError(f"expected a failure naming {expect!r}, got {done.returncode}: "
                           f"{done.stderr.strip()[-1000:]}")
    return seconds


def schema_errors(landing: Landing, work: Path, repeats: int) -> list[Row]:
    env = {**user_env(work), "UPSERT_HOME": str(work / "home")}  # default engine, no server
    missing = Row("(2a) file-level error: a new shard's file without its key column",
                  target_s=1.0)
    land = work / "no-key"
    land.mkdir(parents=True)
    pq.write_table(pa.table({"offset": [1, 2], "value": ["a", "b"]}), land / "f-000.parquet")
    for _ in range(repeats):
        missing.seconds.append(failing(
            upsertctl("ingest", "--shard", "nokey", "--key", "key", "--order", "offset",
                      "--no-progress", str(land)), env, "missing key column"))
        log(f"  missing key column: {missing.seconds[-1]:.2f}s")
    changed = Row("(2b) file-level error: a Parquet value column changed type (shard of"
                  " the keys above)", target_s=1.0)
    typed = work / "typed"
    load_initial(landing, typed, env)
    pq.write_table(pa.table({"key": [1], "offset": [10**12], "value": ["x"],
                             "amount": ["not a float"], "__deleted": [False]}),
                   typed / "zz-changed.parquet")
    for _ in range(repeats):
        changed.seconds.append(failing(
            upsertctl("ingest", "--shard", SOURCE, "--no-progress", str(typed)), env,
            "changed type"))
        log(f"  changed type: {changed.seconds[-1]:.2f}s")
    return [missing, changed]


# --- (3) a Dagster run on the warm server ----------------------------------------------------


def warm_dagster_runs(landing: Landing, work: Path) -> list[Row]:
    env = {**WARM, "UPSERT_HOME": str(work / "home")}
    try:
        in_run, whole = dagster_file_runs(landing, work, "spark", env, label="warm local Spark")
    finally:
        stop_server(warm_env(work))
    first_in, first_whole = in_run.seconds.pop(0), whole.seconds.pop(0)
    in_run.name = "(3) " + in_run.name + ", 2nd and later"
    in_run.target_s = 5.0
    in_run.note = f"first run (starts the server): {first_in:.1f} s"
    whole.note = f"first: {first_whole:.1f} s"
    return [in_run, whole]


# --- (4) landing to materialized with the sensor ---------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_in_a_terminal() -> None:
    """Ctrl-C's default disposition for ``dagster dev``. Started from a background job,
    it inherits SIGINT ignored, and Dagster maps SIGTERM to SIGINT's handler, so it
    would then ignore both."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class DagsterDev:
    """``dagster dev`` in its own process group, on a loopback port."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.url = f"http://127.0.0.1:{_free_port()}"
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("dagster")), "dev", "-h", "127.0.0.1",
             "-p", self.url.rsplit(":", 1)[1], "-w", "workspace.yaml"],
            cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_as_in_a_terminal)
        deadline = time.monotonic() + 180
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dagster dev exited; see {log_path}")
            try:
                with urllib.request.urlopen(f"{self.url}/server_info", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("dagster dev did not answer within 180 s") from None
                time.sleep(0.5)

    def gql(self, query: str, **variables: Any) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": variables}).encode()
        request = urllib.request.Request(f"{self.url}/graphql", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.load(response)
        if "errors" in answer:
            raise RuntimeError(str(answer["errors"])[:2000])
        return dict(answer["data"])

    def stop(self) -> None:
        """Ctrl-C, as a user stops it; then make sure nothing of the group is left."""
        for sig, wait in ((signal.SIGINT, 60), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(wait)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        self._log.close()


LOCATION = "orchestration.definitions:defs"


def _materialized_at(dev: DagsterDev, name: str) -> float | None:
    data = dev.gql(
        """query($k: AssetKeyInput!, $p: [String!]) { assetOrError(assetKey: $k) {
             ... on Asset { assetMaterializations(partitions: $p, limit: 1) { timestamp } } } }""",
        k={"path": [SOURCE, "upsert_state"]}, p=[name])
    found = data["assetOrError"].get("assetMaterializations") or []
    return float(found[0]["timestamp"]) / 1000 if found else None


def _run_times(dev: DagsterDev, name: str) -> tuple[float, float]:
    """(creation, start) of the run the sensor requested for ``name``."""
    data = dev.gql("""query($f: RunsFilter) { runsOrError(filter: $f) { ... on Runs {
        results { creationTime startTime } } } }""",
                   f={"tags": [{"key": "dagster/partition", "value": name}]})
    [run] = data["runsOrError"]["results"]
    return float(run["creationTime"]), float(run["startTime"])


def sensor_latency(landing: Landing, work: Path) -> list[Row]:
    row = Row("(4) landing to materialized with the sensor (interval 10 s), warm local Spark,"
              " 2nd and later", target_s=20.0)
    phases = [Row("(4) of which: landing to the sensor's run request (the tick)"),
              Row("(4) of which: run request to RUN_START (queue, launch, run process start)"),
              Row("(4) of which: RUN_START to the commit")]
    land = work / "landing"
    home = work / "dagster"
    home.mkdir(parents=True)
    shutil.copy(REPO / "deploy" / "dagster-dev.yaml", home / "dagster.yaml")
    (work / "sources.yaml").write_text("sources: []\n")  # only the UPSERT_LANDING source
    env = {**warm_env(work), "DAGSTER_HOME": str(home), "UPSERT_LANDING": str(land),
           "UPSERT_SHARD": SOURCE, "UPSERT_KEY": "key", "UPSERT_ORDER": "offset",
           "UPSERT_SOURCES": str(work / "sources.yaml")}
    load_initial(landing, land, env)
    dev = DagsterDev(env, work / "dagster-dev.log")
    try:
        started = dev.gql(
            """mutation($s: SensorSelector!) { startSensor(sensorSelector: $s) {
                 __typename ... on Sensor { name } ... on PythonError { message } } }""",
            s={"repositoryLocationName": LOCATION, "repositoryName": "__repository__",
               "sensorName": f"{SOURCE}_landing_sensor"})["startSensor"]
        if started["__typename"] != "Sensor":
            raise RuntimeError(f"startSensor: {started}")
        time.sleep(12)  # the first tick adds the initial file's partition (in the shard)
        for i, path in enumerate(landing.files):
            hidden = land / f".{path.name}"
            shutil.copy(path, hidden)
            landed = time.time()
            hidden.rename(land / path.name)
            deadline = time.monotonic() + 300
            while (done := _materialized_at(dev, path.name)) is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{path.name} was not materialized within 300 s; "
                                       f"see {work / 'dagster-dev.log'}")
                time.sleep(0.25)
            seconds = done - landed
            created, start = _run_times(dev, path.name)
            parts = [created - landed, start - created, done - start]
            log(f"  sensor: {path.name} materialized {seconds:.2f}s after landing"
                f" ({', '.join(f'{p:.1f}' for p in parts)}; load {load_average()})")
            if i == 0:
                row.note = f"first file (starts the server): {seconds:.1f} s"
            else:
                row.seconds.append(seconds)
                for phase, part in zip(phases, parts, strict=True):
                    phase.seconds.append(part)
    finally:
        dev.stop()
        stop_server(env)
    return [row, *phases]


# --- main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.first_hour", description=__doc__)
    parser.add_argument("--keys", type=int, default=100_000, help="keys in the shard")
    parser.add_argument("--files", type=int, default=6,
                        help="new files per figure (the first starts the server)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each failing ingest")
    parser.add_argument("--only", choices=["errors", "cli", "dagster", "sensor"], nargs="*",
                        help="measure only these figures (default: all)")
    args = parser.parse_args(argv)
    chosen = set(args.only or ["errors", "cli", "dagster", "sensor"])
    root = Path(tempfile.mkdtemp(prefix="upsert-first-hour-"))
    rows: list[Row] = []
    loads = [load_average()]
    try:
        log(f"workload: {args.keys} keys, {args.files} new files of {FILE_ROWS} rows;"
            f" load {loads[0]}")
        landing = make_landing(root / "files", args.keys, args.files)
        if "errors" in chosen:
            rows.extend(schema_errors(landing, root / "errors", args.repeats))
            loads.append(load_average())
        if "cli" in chosen:
            rows.append(warm_cli(landing, root / "cli"))
            loads.append(load_average())
        if "dagster" in chosen:
            rows.extend(warm_dagster_runs(landing, root / "dagster-run"))
            loads.append(load_average())
        if "sensor" in chosen:
            rows.extend(sensor_latency(landing, root / "sensor"))
            loads.append(load_average())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    header = ["| figure | median s | target | met | runs (s) | note |",
              "|---|---|---|---|---|---|"]
    table = "\n".join(header + [r.line() for r in rows])
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "first_hour.md").write_text(table + f"\n\nload averages (1/5/15 min) between"
                                       f" figures: {' | '.join(loads)}\n")
    print(table)
    print(f"load averages between figures: {' | '.join(loads)}")
    print(json.dumps({"load_averages": loads, **{
        r.name: {"median_s": r.median, "runs_s": r.seconds, "target_s": r.target_s,
                 "note": r.note} for r in rows}}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
