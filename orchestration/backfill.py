"""Backfill a source's partitions from the command line (the UI does the same with
"Materialize" -> partitions, or "Launch backfill").

``python -m orchestration.backfill SOURCE [FILE ...] [--all] [--shuffle SEED]``

- no FILE: every landing file not yet ingested; ``--all``: every landing file; or the
  named files. Each becomes a dynamic partition (if it is not one yet) and a run of
  ``SOURCE_ingest`` in this process, recorded in the Dagster instance
  (``DAGSTER_HOME``; without it a throwaway instance, with a warning).
- ``--shuffle SEED`` runs the partitions in a seeded random order, to show that the
  order does not matter (each run applies every pending file up to its own).

One line per partition on stdout (``<file>: <status>``); stops at the first failed run
with exit status 1 and its error on stderr. H9's ``upsertctl`` can expose this as a
``backfill`` command by calling :func:`main` (or :func:`run_backfill`).

Invariants: partitions are added before their runs; runs go one at a time; a file
already ingested gives a no-op run that says so.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dagster import DagsterInstance, Definitions

from assets.spec import SourceSpec
from orchestration.jobs import ingest_job_name
from resources.stores import BlobStoreResource, ConsensusResource, open_shard
from upsert_core.errors import ConfigError, ShardNotFound, UpsertPlatformError
from upsert_core.landing import list_landing, pending


@dataclass(frozen=True)
class PartitionRun:
    """One backfilled partition: the run's id, success, and what it reported."""

    partition: str
    run_id: str
    success: bool
    status: str


def _instance() -> DagsterInstance:
    if os.environ.get("DAGSTER_HOME"):
        return DagsterInstance.get()
    sys.stderr.write("warning: DAGSTER_HOME is not set; runs go to a throwaway instance\n")
    return DagsterInstance.ephemeral()


def select_partitions(
    spec: SourceSpec,
    consensus: ConsensusResource,
    blob_store: BlobStoreResource,
    files: Sequence[str] = (),
    *,
    every: bool = False,
) -> list[str]:
    """``files``, or every landing file (``every``), or every one not yet ingested."""
    if files:
        return list(files)
    names = list_landing(spec.landing)
    if every:
        return [f.name for f in names]
    try:
        shard = open_shard(consensus, blob_store, spec.shard, create=False)
        ingested: set[str] = set(shard.state().ingested_files)
    except ShardNotFound:
        ingested = set()
    return [f.name for f in pending(names, ingested)]


def find_source(sources: Sequence[SourceSpec], name: str) -> SourceSpec:
    for spec in sources:
        if spec.name == name:
            return spec
    known = ", ".join(s.name for s in sources) or "none"
    raise ConfigError(f"no source named {name!r} (sources: {known})")


def failure_message(result: Any) -> str:
    """The first failed step's message (a ``Failure``'s description when it has one)."""
    for event in result.all_events:
        if event.is_step_failure and event.step_failure_data is not None:
            data = event.step_failure_data
            if data.user_failure_data is not None and data.user_failure_data.description:
                return str(data.user_failure_data.description)
            if data.error is not None:
                return data.error.message.strip()
    return "see the run log"


def run_backfill(
    defs: Definitions,
    spec: SourceSpec,
    partitions: Sequence[str],
    *,
    instance: DagsterInstance,
    on_run: Callable[[PartitionRun], None] | None = None,
) -> list[PartitionRun]:
    """Run the source's ingest job for each partition in order; stop at a failure."""
    job = defs.resolve_job_def(ingest_job_name(spec.name))
    known = set(instance.get_dynamic_partitions(spec.partitions_name))
    missing = [p for p in partitions if p not in known]
    if missing:
        instance.add_dynamic_partitions(spec.partitions_name, list(dict.fromkeys(missing)))
    runs: list[PartitionRun] = []
    for partition in partitions:
        result = job.execute_in_process(
            partition_key=partition, instance=instance, raise_on_error=False
        )
        status = "failed"
        for event in result.get_asset_materialization_events():
            value = event.materialization.metadata.get("status")
            if value is not None:
                status = str(value.value)
        if not result.success:
            status = f"failed: {failure_message(result)}"
        run = PartitionRun(partition, result.run_id, result.success, status)
        runs.append(run)
        if on_run is not None:
            on_run(run)
        if not result.success:
            break
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orchestration.backfill",
        description="Run a source's ingest partitions (one landing file each) in Dagster.",
    )
    parser.add_argument("source", help="source name (sources.yaml or UPSERT_SHARD)")
    parser.add_argument("files", nargs="*", help="partitions (landing file names)")
    parser.add_argument("--all", action="store_true", help="every landing file")
    parser.add_argument("--shuffle", type=int, metavar="SEED", help="run in a random order")
    args = parser.parse_args(argv)
    try:
        from orchestration.definitions import SOURCES, default_resources, defs

        spec = find_source(SOURCES, args.source)
        resources = default_resources()
        partitions = select_partitions(
            spec, resources["consensus"], resources["blob_store"], args.files, every=args.all
        )
        if args.shuffle is not None:
            random.Random(args.shuffle).shuffle(partitions)
        if not partitions:
            sys.stderr.write(f"{args.source}: nothing to backfill\n")
            return 0

        def show(run: PartitionRun) -> None:
            sys.stdout.write(f"{run.partition}: {run.status}\n")
            sys.stdout.flush()

        runs = run_backfill(defs, spec, partitions, instance=_instance(), on_run=show)
    except UpsertPlatformError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    failed = [r for r in runs if not r.success]
    if failed:
        sys.stderr.write(f"error: {failed[0].partition}: {failed[0].status}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
