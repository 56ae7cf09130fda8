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
listing, one shard state read and one materialized-partitions query; a reported
partition is materialized afterwards, so it is never reported again.

The cursor is the greatest file name the sensor has handled. Files sorting after it are
new; files sorting before it that have no partition are late arrivals (CONTRACT: a late
file is simply pending) and are handled too; the run for a late file applies it (and
anything else pending before it) at the next timestamp.

Invariants:

- The cursor only moves forward, and only past names whose partitions this tick adds.
- A landing that cannot be listed FAILS the tick (the error is raised, so Dagster shows
  a failed tick with the one-line reason) and leaves the cursor as it was; a tick with
  nothing new and nothing to report is a ``SkipReason``.
- Names Dagster cannot use as partition keys (containing ``...``) are skipped with a
  log line; the run of any later file still ingests them (runs apply every pending
  file up to their own).
"""

from typing import TYPE_CHECKING

from dagster import (
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
from resources.stores import BlobStoreResource, ConsensusResource, open_shard
from upsert_core.errors import IngestError, ShardNotFound, UpsertPlatformError
from upsert_core.landing import list_landing
from upsert_core.redact import redact_url

DEFAULT_MAX_REQUESTS = 50
_BAD_KEY_PARTS = ("...",)
#: ``applied_by`` of the materializations the sensor reports
APPLIED_BY_SHARD = "found in the shard by the landing sensor"

if TYPE_CHECKING:
    from dagster._core.definitions.unresolved_asset_job_definition import (
        UnresolvedAssetJobDefinition,
    )


def sensor_name(source: str) -> str:
    return f"{source}_landing_sensor"


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
        description=f"New files in {redact_url(spec.landing)} -> partitions and ingest runs.",
    )
    def landing(
        context: SensorEvaluationContext,
        consensus: ConsensusResource,
        blob_store: BlobStoreResource,
    ) -> SensorResult | SkipReason:
        try:
            names = [f.name for f in list_landing(spec.landing)]
        except UpsertPlatformError as exc:
            raise IngestError(
                f"cannot list {redact_url(spec.landing)}: {redact_url(str(exc))}"
            ) from exc
        known = set(context.instance.get_dynamic_partitions(spec.partitions_name))
        cursor = context.cursor or ""
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
        if not new:
            if events:
                return SensorResult(asset_events=events)
            return SkipReason(
                f"no new files in {redact_url(spec.landing)} ({len(names)} listed)"
            )
        late = [n for n in new if n <= cursor]
        if late:
            context.log.info(f"late files (sorting before {cursor!r}): {late}")
        runs = [RunRequest(run_key=n, partition_key=n) for n in new if n not in done]
        return SensorResult(
            run_requests=runs,
            dynamic_partitions_requests=[built.partitions.build_add_request(new)],
            asset_events=events,
            cursor=max([cursor, *new]),
        )

    return landing
