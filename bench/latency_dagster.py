"""Dagster latency: a single-run backfill of many small files, and one run for one file.

- :func:`backfill_seconds`: wall time of ``python -m orchestration.backfill SOURCE`` (a
  fresh process: imports, code location, one run for every pending file) over
  ``n_files`` landing files of ``rows_per_file`` rows each, on temporary embedded stores
  and a temporary ``DAGSTER_HOME`` with ``deploy/dagster-dev.yaml``.
- :func:`one_file_run_seconds`: one run of the ingest job for one new file of ``rows``
  rows, in this process, from the run's RUN_START event to ``upsert_state``'s
  materialization (logged right after the file's commit).

``engine`` is ``local`` (in-process engine) or ``spark``. Called by ``bench/latency.py``;
``python -m bench.latency_dagster [N_FILES ROWS_PER_FILE ROWS ENGINE]`` prints both.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = "bench"


def _tmp() -> Path:
    base = "/dev/shm" if Path("/dev/shm").is_dir() else None
    return Path(tempfile.mkdtemp(prefix="upsert-bench-dagster-", dir=base))


def _write_files(landing: Path, n_files: int, rows: int, start: int = 0) -> list[str]:
    landing.mkdir(parents=True, exist_ok=True)
    names = []
    for i in range(start, start + n_files):
        name = f"f-{i:06d}.jsonl"
        lines = (json.dumps({"key": f"k{(i * 7919 + j) % (rows * 4)}", "offset": i * rows + j,
                             "v": f"{i}-{j}"}) for j in range(rows))
        (landing / name).write_text("\n".join(lines) + "\n")
        names.append(name)
    return names


def _dagster_home(root: Path) -> Path:
    home = root / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "deploy" / "dagster-dev.yaml", home / "dagster.yaml")
    return home


def backfill_seconds(n_files: int, rows_per_file: int, engine: str = "local") -> float:
    """Wall seconds of one ``python -m orchestration.backfill`` over ``n_files`` files."""
    root = _tmp()
    try:
        _write_files(root / "landing", n_files, rows_per_file)
        env = {
            **os.environ,
            "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "UPSERT_HOME": str(root / "home"),
            "UPSERT_LANDING": str(root / "landing"),
            "UPSERT_SHARD": SOURCE,
            "UPSERT_ENGINE": engine,
            "DAGSTER_HOME": str(_dagster_home(root)),
        }
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "orchestration.backfill", SOURCE],
                              cwd=REPO, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        lines = proc.stdout.splitlines()
        if proc.returncode != 0 or len(lines) != n_files:
            raise RuntimeError(f"backfill failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return seconds
    finally:
        shutil.rmtree(root, ignore_errors=True)


def one_file_run_seconds(rows: int, engine: str = "local") -> float:
    """Seconds from RUN_START to the commit of one new ``rows``-row file (one run)."""
    from dagster import DagsterEventType, DagsterInstance
    from dagster._core.instance.ref import InstanceRef

    from assets.spec import SourceSpec
    from orchestration.definitions import build_definitions
    from resources.spark import spark_resource_from_env
    from resources.stores import LocalBlobStore, SqliteConsensus

    root = _tmp()
    try:
        # One file already in the shard, so the measured run ingests into a live shard.
        first = _write_files(root / "landing", 1, rows)
        spec = SourceSpec(name=SOURCE, landing=str(root / "landing"), shard=SOURCE)
        resources = {
            "consensus": SqliteConsensus(path=str(root / "home" / "consensus.db")),
            "blob_store": LocalBlobStore(root=str(root / "home" / "blob")),
            "spark": spark_resource_from_env({"UPSERT_ENGINE": engine}),
        }
        job = build_definitions([spec], resources).resolve_job_def(f"{SOURCE}_ingest")
        with DagsterInstance.from_ref(InstanceRef.from_dir(str(_dagster_home(root)))) as inst:
            inst.add_dynamic_partitions(spec.partitions_name, first)
            assert job.execute_in_process(partition_key=first[0], instance=inst).success
            [new] = _write_files(root / "landing", 1, rows, start=1)
            inst.add_dynamic_partitions(spec.partitions_name, [new])
            result = job.execute_in_process(partition_key=new, instance=inst)
            assert result.success
            events = inst.all_logs(result.run_id)
            start = next(e.timestamp for e in events
                         if e.dagster_event_type == DagsterEventType.RUN_START)
            committed = next(
                e.timestamp for e in events
                if e.dagster_event_type == DagsterEventType.ASSET_MATERIALIZATION
                and e.step_key == f"{SOURCE}__upsert_state"
            )
            return committed - start
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str]) -> int:
    n_files = int(argv[0]) if argv else 100
    rows_per_file = int(argv[1]) if len(argv) > 1 else 100
    rows = int(argv[2]) if len(argv) > 2 else 1000
    engine = argv[3] if len(argv) > 3 else os.environ.get("UPSERT_ENGINE", "local")
    seconds = backfill_seconds(n_files, rows_per_file, engine)
    print(f"backfill of {n_files} files x {rows_per_file} rows ({engine}), one run,"
          f" wall: {seconds:.2f} s")
    seconds = one_file_run_seconds(rows, engine)
    print(f"one run for one new {rows}-row file ({engine}), run start -> committed:"
          f" {seconds:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
