"""Sensors: one per source, turning new landing files into partitions and runs, and
keeping Dagster's partition status true to the shard.

Each tick lists the landing location (a local directory or ``s3://bucket/prefix``) and
compares it with the source's dynamic partitions (one per file already seen). For every
new file, in name order and at most ``max_requests`` per tick, it adds the partition and,
unless the shard already holds the file (ingested by ``upsertctl``, say), requests a run
of the ingest job for it with ``run_key`` = the file name, so a file never starts two
runs, whatever happens to the cursor.

Each tick also reports runless ``AssetMaterialization`` events (``SensorResult.asset_events``,
``partition=`` the file, metadata ``ts`` and ``applied_by``) for ``upsert_state``
(applied) for every file the shard holds (``ingested_files``: name -> ts) whose partition
exists or is added in the same tick and is not materialized yet: files applied by
``upsertctl ingest``, or by a run that failed after committing them. (Earlier files a
run applies are reported by that run itself, see :mod:`assets.factory`.) It never
reports ``output_shard``: a partition is published only after a blocking check covered
its ts, so the next ingest run whose checks pass publishes those files (its checks
start at the published watermark, see :mod:`assets.checks`). Cost per tick: one
listing, one shard state read and one materialized-partitions query (plus one
partition-status query while some partition's file is not in the shard, see below); a
reported partition is materialized afterwards, so it is never reported again.

Partitions are added in arrival order (Dagster lists dynamic partitions in the order they
were added): the new files of one tick in name order, after every partition already
there, so a late file appears after the later names.

The cursor (:mod:`orchestration.landing_cursor`) is the greatest file name the sensor
has handled, and what it saw (size, and mtime or ETag) of each file it requested a run
for that the shard does not hold yet. Files sorting after the name are new; files
sorting before it that have no partition are late arrivals (CONTRACT: a late file is
simply pending) and are handled too; the run for a late file applies it (and anything
else pending before it) at the next timestamp.

**A fixed file is retried.** A file whose ``upsert_state`` partition FAILED (its latest
run planned it and did not materialize it: Dagster's partition status) and whose
listing differs from the cursor's record (size, mtime or ETag: the user replaced it) is
requested again under a new run key, ``<name>@<size>-<version>``, and its record is
updated, so each change is requested once. A run applies every pending file up to its
own, so the failed partitions after it failed on it too, most likely: they are
requested again with it (run key ``<name>@<fixed file>@<size>-<version>``); one that
fails on its own file then waits for its own fix. A failed partition with no record
(failed before the cursor kept records, or never requested by the sensor) gets one,
what its file is now, and is retried when that changes. A file the shard holds is never
requested again. Failed partitions waiting for a change are named in the skip reason.

Invariants:

- The cursor's name only moves forward, and only past names whose partitions this tick
  adds.
- One run key per file version: ``<name>`` for a new file, ``<name>@...`` for a retry of
  a changed one; nothing the shard holds is requested.
- A landing that cannot be listed FAILS the tick (the error is raised, so Dagster shows
  a failed tick with the one-line reason) and leaves the cursor as it was; a tick with
  nothing new and nothing to report is a ``SkipReason``.
- Names Dagster cannot use as partition keys (containing ``...``) are skipped with a
  log line; the run of any later file still ingests them (runs apply every pending
  file up to their own).
"""

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from dagster import (
    AssetPartitionStatus,
    DagsterInstance,
    DefaultSensorStatus,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from assets.factory import STATE, SourceAssets
from assets.metadata import partition_materializations, unreported_partitions
from orchestration.landing_cursor import FileRecord, LandingCursor
from resources.stores import BlobStoreResource, ConsensusResource, open_shard
from upsert_core.errors import IngestError, ShardNotFound, UpsertPlatformError
from upsert_core.landing import LandingFile, list_landing
from upsert_core.redact import redact_url

DEFAULT_MAX_REQUESTS = 50
#: failed partitions named in a skip reason
MAX_NAMED = 10
_BAD_KEY_PARTS = ("...",)
#: ``applied_by`` of the materializations the sensor reports
APPLIED_BY_SHARD = "found in the shard by the landing sensor"

if TYPE_CHECKING:
    from dagster._core.definitions.unresolved_asset_job_definition import (
        UnresolvedAssetJobDefinition,
    )


def sensor_name(source: str) -> str:
    return f"{source}_landing_sensor"


def failed_partitions(instance: DagsterInstance, built: SourceAssets,
                      names: Collection[str]) -> list[str]:
    """The partitions of ``names`` whose ``upsert_state`` is FAILED (latest run planned it
    and did not materialize it), in name order. No query for no names."""
    if not names:
        return []
    status = instance.get_status_by_partition(
        built.key(STATE), sorted(names), built.partitions) or {}
    return sorted(n for n, s in status.items() if s == AssetPartitionStatus.FAILED)


def retries(failed: list[str], files: Mapping[str, LandingFile],
            seen: Mapping[str, FileRecord]) -> dict[str, str]:
    """The failed partitions to request again (name -> run key), in name order: each
    whose file changed since its record, and the failed ones after the first changed
    file (see the module docstring)."""
    changed = [n for n in failed
               if n in files and n in seen and FileRecord.of(files[n]) != seen[n]]
    if not changed:
        return {}
    first = changed[0]
    trigger = f"{first}@{FileRecord.of(files[first]).token}"
    keys: dict[str, str] = {}
    for name in failed:
        if name in changed:
            keys[name] = f"{name}@{FileRecord.of(files[name]).token}"
        elif name > first and name in files:
            keys[name] = f"{name}@{trigger}"
    return keys


def _named(names: list[str]) -> str:
    more = f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else ""
    return ", ".join(names[:MAX_NAMED]) + more


def landing_sensor(
    built: SourceAssets,
    job: "UnresolvedAssetJobDefinition",
    *,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    interval_seconds: int | None = None,
) -> SensorDefinition:
    """The sensor of one source (see the module docstring)."""
    spec = built.spec

    @sensor(
        name=sensor_name(spec.name),
        job=job,
        minimum_interval_seconds=interval_seconds or spec.sensor_interval_s,
        default_status=DefaultSensorStatus.STOPPED,
        description=f"New files in {redact_url(spec.landing)} -> partitions and ingest runs;"
        " a failed partition's file, once replaced, is requested again.",
    )
    def landing(
        context: SensorEvaluationContext,
        consensus: ConsensusResource,
        blob_store: BlobStoreResource,
    ) -> SensorResult | SkipReason:
        try:
            files = {f.name: f for f in list_landing(spec.landing)}
        except UpsertPlatformError as exc:
            raise IngestError(
                f"cannot list {redact_url(spec.landing)}: {redact_url(str(exc))}"
            ) from exc
        names = list(files)
        known = set(context.instance.get_dynamic_partitions(spec.partitions_name))
        cursor = LandingCursor.parse(context.cursor)
        new: list[str] = []
        for name in names:
            if name in known:
                continue
            if any(bad in name for bad in _BAD_KEY_PARTS):
                context.log.warning(f"{name}: not a valid partition key; later runs ingest it")
                continue
            new.append(name)
        new = new[:max_requests]
        try:
            state = open_shard(consensus, blob_store, spec.shard, create=False).state()
            done: dict[str, int] = dict(state.ingested_files)
        except ShardNotFound:
            done = {}
        partitions = known.union(new)
        state_key = built.key(STATE)
        events = partition_materializations(
            state_key, unreported_partitions(context.instance, state_key, done, partitions),
            APPLIED_BY_SHARD,
        )
        if events:
            context.log.info(f"reporting {len(events)} materialization(s) of files the shard"
                             " already holds")

        failed = failed_partitions(context.instance, built, known.difference(done))
        again = retries(failed, files, cursor.seen)
        for name, key in again.items():
            context.log.info(f"{name}: its partition failed and its file (or an earlier"
                             f" failed one) changed since; requesting it again as {key!r}")
        waiting = [n for n in failed if n not in again]
        if waiting:
            context.log.info(f"{len(waiting)} failed partition(s) waiting for a fixed file:"
                             f" {_named(waiting)}")
        unrecorded = [files[n] for n in waiting if n in files and n not in cursor.seen]
        requested = [n for n in new if n not in done]
        # Records: what each file requested now is, a baseline for a failed partition
        # without one; only files with a partition and not in the shard are kept.
        updated = (cursor.advanced(new)
                   .recorded([*unrecorded, *(files[n] for n in [*requested, *again])])
                   .pruned(partitions, done))
        text = updated.dumps()
        if not new and not again:
            stored = text if text != context.cursor else None
            if events:
                return SensorResult(asset_events=events, cursor=stored)
            reason = f"no new files in {redact_url(spec.landing)} ({len(names)} listed)"
            if waiting:
                reason += (f"; {len(waiting)} failed partition(s) waiting for a fixed file:"
                           f" {_named(waiting)}")
            if stored is None:
                return SkipReason(reason)
            return SensorResult(skip_reason=reason, cursor=stored)
        late = [n for n in new if n <= cursor.after]
        if late:
            context.log.info(f"late files (sorting before {cursor.after!r}): {late}")
        runs = sorted(
            [*(RunRequest(run_key=n, partition_key=n) for n in requested),
             *(RunRequest(run_key=key, partition_key=n) for n, key in again.items())],
            key=lambda r: str(r.partition_key),
        )
        return SensorResult(
            run_requests=runs,
            dynamic_partitions_requests=[built.partitions.build_add_request(new)] if new else [],
            asset_events=events,
            cursor=text,
        )

    return landing
