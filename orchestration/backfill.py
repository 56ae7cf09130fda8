"""Backfill a source's partitions from the command line, as ONE run (the UI does the
same with "Materialize" -> partitions, or "Launch backfill": the assets' backfill policy
is ``BackfillPolicy.single_run()``).

``python -m orchestration.backfill SOURCE [FILE ...] [--all] [--shuffle SEED]``

- no FILE: every landing file not yet ingested; ``--all``: every landing file; or the
  named files. Each becomes a dynamic partition (if it is not one yet; new ones are
  added in name order) and the whole selection is ONE run of ``SOURCE_ingest`` in this
  process (one ingest, one engine, one Spark session), recorded in the Dagster instance
  (``DAGSTER_HOME``; without it a throwaway instance, with a warning).
- A Dagster run covers a key *range* of partitions, in the order they were added, not
  by name: the run covers the range from the first to the last selected partition in
  that order, so it may cover (and apply, and report) partitions between them that were
  not selected. The run applies every pending file up to the greatest name it covers.
- ``--shuffle SEED`` selects the partitions in a seeded random order, to show that the
  order does not matter (the run sorts them).

One line per partition on stdout, in name order (``<file>: <status>``, e.g.
``b-02.jsonl: applied at ts 1``); exit status 0 when the run succeeded, 1 when it failed
(its error on stderr; files committed before the failure are listed as applied, files
already in the shard before the run as already ingested at their ts, the rest as
failed; a run that failed after applying every file, e.g. in its blocking checks, also
exits 1), 2 for a usage or configuration error. H9's ``upsertctl`` can expose
this as a ``backfill`` command by calling :func:`main` (or :func:`run_backfill`).

Invariants: partitions are added before the run; one run per backfill; files already
ingested are reported with the ts they went in at, and nothing is re-applied.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dagster import AssetKey, DagsterEventType, DagsterInstance, Definitions
from dagster._core.storage.tags import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
)

from assets.factory import STATE
from assets.metadata import APPLIED_BEFORE, partition_status
from assets.spec import SourceSpec
from orchestration.jobs import ingest_job_name
from resources.stores import BlobStoreResource, ConsensusResource, open_shard
from upsert_core.errors import ConfigError, IngestError, ShardNotFound, UpsertPlatformError
from upsert_core.landing import list_landing, pending
from upsert_core.redact import redact_url


@dataclass(frozen=True)
class PartitionRun:
    """One backfilled partition: the run's id, success, and what it reported.

    ``success``: the partition's file is in the shard (applied by this run or before);
    ``run_error``: why the run failed (None when it succeeded). A run can fail after
    it applied every file (its blocking checks failed: nothing was published), so a
    backfill succeeded only when every partition succeeded and the run did."""

    partition: str
    run_id: str
    success: bool
    status: str
    run_error: str | None = None


def _instance(ephemeral: bool) -> DagsterInstance:
    """The instance the runs go to: ``DAGSTER_HOME``'s (what ``dagster dev`` shows), or,
    only when asked for, a throwaway one (nothing of it reaches a UI)."""
    if ephemeral:
        return DagsterInstance.ephemeral()
    if os.environ.get("DAGSTER_HOME"):
        return DagsterInstance.get()
    raise ConfigError(
        "DAGSTER_HOME is not set, so the runs would go to a throwaway instance no UI shows:"
        " set it to the instance `dagster dev` uses (e.g. DAGSTER_HOME=$PWD/.dagster), or"
        " pass --ephemeral for a throwaway one"
    )


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


def covering_range(instance: DagsterInstance, spec: SourceSpec,
                   partitions: Sequence[str]) -> list[str]:
    """The partitions of the key range (in the order they were added) from the first to
    the last of ``partitions``: what one run for them covers."""
    order = instance.get_dynamic_partitions(spec.partitions_name)
    index = {p: i for i, p in enumerate(order)}
    first = min(index[p] for p in partitions)
    last = max(index[p] for p in partitions)
    return list(order[first:last + 1])


def _statuses(instance: DagsterInstance, run_id: str, state_key: AssetKey) -> dict[str, str]:
    """Partition -> ``partition_status`` of the run's ``upsert_state`` materializations
    (from the instance: a failed step's events are not in the in-process result)."""
    statuses: dict[str, str] = {}
    for entry in instance.all_logs(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION):
        event = entry.asset_materialization
        if event is None or event.asset_key != state_key or event.partition is None:
            continue
        value = event.metadata.get("partition_status")
        if value is not None:
            statuses[event.partition] = str(value.value)
    return statuses


def _ingested(defs: Definitions, spec: SourceSpec) -> dict[str, int]:
    """The shard's ingested files (name -> ts), through the definitions' own stores."""
    resources = defs.resources or {}
    consensus, blob_store = resources.get("consensus"), resources.get("blob_store")
    if not isinstance(consensus, ConsensusResource) or not isinstance(
            blob_store, BlobStoreResource):
        return {}
    try:
        shard = open_shard(consensus, blob_store, spec.shard, create=False)
    except ShardNotFound:
        return {}
    return dict(shard.state().ingested_files)


def run_backfill(
    defs: Definitions,
    spec: SourceSpec,
    partitions: Sequence[str],
    *,
    instance: DagsterInstance,
    on_run: Callable[[PartitionRun], None] | None = None,
) -> list[PartitionRun]:
    """Run the source's ingest job ONCE over ``partitions`` (see the module docstring);
    one :class:`PartitionRun` per partition the run covered, in name order."""
    if not partitions:
        return []
    job = defs.resolve_job_def(ingest_job_name(spec.name))
    known = set(instance.get_dynamic_partitions(spec.partitions_name))
    missing = sorted({p for p in partitions if p not in known})
    if missing:
        # Dynamic partitions are never deleted: a name that is neither in the landing
        # nor in the shard (a typo) is refused before it becomes one.
        listed = {f.name for f in list_landing(spec.landing)}
        absent = [p for p in missing if p not in listed and p not in _ingested(defs, spec)]
        if absent:
            raise IngestError(
                f"{absent[0]}: no such file in the landing location"
                f" {redact_url(spec.landing)} ({len(absent)} name(s) not found:"
                f" {absent[:10]}); nothing was run: name landing files (or give none to"
                " backfill every pending one)")
        instance.add_dynamic_partitions(spec.partitions_name, missing)
    covered = covering_range(instance, spec, partitions)
    result = job.execute_in_process(
        instance=instance, raise_on_error=False,
        tags={ASSET_PARTITION_RANGE_START_TAG: covered[0],
              ASSET_PARTITION_RANGE_END_TAG: covered[-1]},
    )
    statuses = _statuses(instance, result.run_id, AssetKey([spec.name, STATE]))
    message = None if result.success else failure_message(result)
    ingested = {} if result.success else _ingested(defs, spec)
    runs: list[PartitionRun] = []
    for partition in sorted(covered):
        status = statuses.get(partition)
        if status is None and partition in ingested:
            # In the shard before this run (the run reports what it committed itself).
            status = partition_status(partition, ingested[partition], APPLIED_BEFORE)
        ok = status is not None
        if not result.success and status is None:
            status = f"failed: {message}"
        runs.append(PartitionRun(partition, result.run_id, ok, status or "failed", message))
        if on_run is not None:
            on_run(runs[-1])
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orchestration.backfill",
        description="Run a source's ingest partitions (one landing file each) in Dagster,"
        " as one run.",
    )
    parser.add_argument("source", help="source name (sources.yaml or UPSERT_SHARD)")
    parser.add_argument("files", nargs="*", help="partitions (landing file names)")
    parser.add_argument("--all", action="store_true", help="every landing file")
    parser.add_argument("--shuffle", type=int, metavar="SEED",
                        help="select in a random order (the run sorts them)")
    parser.add_argument("--ephemeral", action="store_true",
                        help="run in a throwaway instance (no DAGSTER_HOME needed; no UI sees it)")
    args = parser.parse_args(argv)
    try:
        instance = _instance(args.ephemeral)  # before the code location loads: fail fast
        # heavy: the whole code location (~1.4 s), after the arguments parsed; its
        # ConfigError (a bad sources.yaml) is reported like any other below
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

        runs = run_backfill(defs, spec, partitions, instance=instance, on_run=show)
    except UpsertPlatformError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    failed = [r for r in runs if not r.success]
    if failed:
        sys.stderr.write(f"error: {failed[0].partition}: {failed[0].status}\n")
        return 1
    # SUBTLE: every file applied, yet the run failed after (e.g. its blocking checks
    # found the batch corrupt, so nothing was published): the backfill failed too.
    run_error = next((r.run_error for r in runs if r.run_error is not None), None)
    if run_error is not None:
        sys.stderr.write(f"error: run {runs[0].run_id} failed after applying the files"
                         f" (not published): {run_error}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
