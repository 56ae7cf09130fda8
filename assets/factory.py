"""The asset factory: one group of four assets (and their checks) per source.

For a source ``S`` (group ``S``, keys prefixed ``S/``):

- ``S/source_snapshot`` (partitioned, one partition per landing file F): the landing as
  the partition sees it: F's size and format, and which pending files the run for F
  will apply (every pending file with a name <= F). Reads no data.
- ``S/upsert_state`` (partitioned): THE ingest step (``upsert_core.ingest.ingest``, the
  code path ``upsertctl ingest`` runs) on the Spark engine through :class:`SparkResource`,
  stopped after F (:mod:`assets.ingest_step`). It drains each file against the bucketed
  upsert state and commits data, errors and state checkpoints in one compare-and-append
  per file. Its checks (:mod:`assets.checks`) run after it; blocking ones gate
  ``output_shard``.
- ``S/output_shard`` (partitioned): the consolidated shard as published after the checks
  passed: upper, seqno, batches, bytes, error rows.
- ``S/rollup_gc`` (not partitioned; on a schedule): rollup, compaction and GC, with what
  it removed.

Invariants:

- Whatever order partitions run in, files are applied in name order (see
  ``ingest_step``); a run for an already-ingested F is a no-op that says so.
- A file-level problem fails the run with the pipeline's one-line message; files before
  it stay committed. Losing a race with another writer more often than the pipeline
  retries re-runs the ingest (it is idempotent), up to :data:`RACE_RETRIES` times.
"""


import time
from dataclasses import dataclass

from dagster import (
    AssetChecksDefinition,
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    Config,
    DynamicPartitionsDefinition,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
)
from pydantic import Field

from assets.checks import build_checks
from assets.ingest_step import ingest_through, pending_through
from assets.metadata import (
    column_schema_metadata,
    gc_metadata,
    ingest_metadata,
    row_count_metadata,
    shard_metadata,
)
from assets.spec import SourceSpec
from resources.spark import SparkResource
from resources.stores import BlobStoreResource, ConsensusResource, open_shard
from upsert_core.errors import ConcurrentModification, ShardNotFound, UpsertPlatformError
from upsert_core.ingest import ProgressEvent
from upsert_core.persist.keys import claim_writer_token
from upsert_core.redact import redact_url
from upsert_core.shard_table import ShardTable

RACE_RETRIES = 3
SNAPSHOT, STATE, OUTPUT, GC = "source_snapshot", "upsert_state", "output_shard", "rollup_gc"
ASSET_NAMES = (SNAPSHOT, STATE, OUTPUT, GC)


class RollupGcConfig(Config):
    """``retain``: keep only the last N times readable (None: the source's ``gc_retain``).

    N must be >= 1 (CONTRACT.md); Dagster's config schema has no numeric bounds, so the
    bound is pydantic's: a run with ``retain: 0`` fails before the asset body runs, with
    a message naming the field, and the shard is never opened.
    """

    retain: int | None = Field(
        default=None,
        ge=1,
        description="keep only the last N timestamps readable (N >= 1); null: the"
        " source's gc_retain (null there keeps all history)",
    )


@dataclass(frozen=True)
class SourceAssets:
    """Everything the factory built for one source."""

    spec: SourceSpec
    partitions: DynamicPartitionsDefinition
    assets: tuple[AssetsDefinition, ...]
    checks: AssetChecksDefinition

    def key(self, name: str) -> AssetKey:
        return AssetKey([self.spec.name, name])

    @property
    def ingest_keys(self) -> tuple[AssetKey, ...]:
        return tuple(self.key(n) for n in (SNAPSHOT, STATE, OUTPUT))


def _failure(exc: UpsertPlatformError) -> Failure:
    return Failure(description=str(exc), metadata={"error": MetadataValue.text(str(exc))})


def build_source_assets(spec: SourceSpec) -> SourceAssets:
    """The four assets and the checks of ``spec`` (see the module docstring)."""
    partitions = DynamicPartitionsDefinition(name=spec.partitions_name)
    prefix = [spec.name]
    snapshot_key, state_key, output_key = (AssetKey([spec.name, n]) for n in (SNAPSHOT, STATE,
                                                                             OUTPUT))

    @asset(name=SNAPSHOT, partitions_def=partitions, key_prefix=prefix, group_name=spec.name,
           description=f"Landing file (partition) of {redact_url(spec.landing)} and what its run"
           " applies.")
    def source_snapshot(
        context: AssetExecutionContext, consensus: ConsensusResource,
        blob_store: BlobStoreResource,
    ) -> MaterializeResult:
        try:
            shard = open_shard(consensus, blob_store, spec.shard, create=False)
            ingested = dict(shard.state().ingested_files)
        except ShardNotFound:
            ingested = {}
        try:
            file, todo = pending_through(spec.landing, ingested, context.partition_key)
        except UpsertPlatformError as exc:
            raise _failure(exc) from exc
        return MaterializeResult(metadata={
            "file": MetadataValue.text(file.name),
            "landing": MetadataValue.text(file.root),
            "format": MetadataValue.text(file.suffix.lstrip(".")),
            "file_bytes": MetadataValue.int(max(file.size, 0)),
            "already_ingested": MetadataValue.bool(file.name in ingested),
            "pending_through": MetadataValue.int(len(todo)),
            "pending_files": MetadataValue.json([f.name for f in todo[:20]]),
        })

    @asset(name=STATE, partitions_def=partitions, deps=[snapshot_key], kinds={"spark"},
           key_prefix=prefix, group_name=spec.name,
           description=f"Ingest (Spark) of the pending files through the partition into"
                       f" shard {spec.shard!r}, with the bucketed upsert state.")
    def upsert_state(
        context: AssetExecutionContext, consensus: ConsensusResource,
        blob_store: BlobStoreResource, spark: SparkResource,
    ) -> MaterializeResult:
        started = time.monotonic()
        # The ingest registers its own writer id in the shard (upsert_core.persist.writers),
        # which is what protects and fences the blobs it writes; the legacy process token
        # only names blobs written outside any registration (rollups).
        claim_writer_token()
        shard = open_shard(consensus, blob_store, spec.shard, create=True)
        engine = spark.ingest_engine()

        def log_progress(event: ProgressEvent) -> None:
            if event.kind == "file_done" and event.report is not None:
                r = event.report
                context.log.info(
                    f"[{event.index}/{event.total}] {r.name}: ts {r.ts}, {r.rows_read} row(s)"
                    f" read, {r.inserts} insert(s), {r.retractions} retraction(s), {r.errors}"
                    f" error row(s), {r.seconds:.2f}s"
                )

        for attempt in range(1, RACE_RETRIES + 1):
            try:
                result = ingest_through(
                    shard, spec.landing, spec.request(), context.partition_key, engine=engine,
                    progress=log_progress,
                )
                break
            except ConcurrentModification as exc:
                context.log.warning(f"attempt {attempt}: {exc}")
                if attempt == RACE_RETRIES:
                    raise _failure(exc) from exc
            except UpsertPlatformError as exc:
                raise _failure(exc) from exc
        for warning in result.warnings:
            context.log.warning(warning)
        meta = ingest_metadata(result, time.monotonic() - started, spark.engine)
        context.log.info(meta["status"].value)
        return MaterializeResult(metadata=meta)

    @asset(name=OUTPUT, partitions_def=partitions, deps=[state_key], key_prefix=prefix,
           group_name=spec.name,
           description=f"The consolidated shard {spec.shard!r}, published after its checks.")
    def output_shard(
        consensus: ConsensusResource, blob_store: BlobStoreResource
    ) -> MaterializeResult:
        shard = open_shard(consensus, blob_store, spec.shard, create=False)
        meta = shard_metadata(shard.inspect())
        meta.update(column_schema_metadata(ShardTable(shard).schema))
        meta.update(row_count_metadata(shard.state().config))
        return MaterializeResult(metadata=meta)

    @asset(name=GC, deps=[output_key], key_prefix=prefix, group_name=spec.name,
           description=f"Rollup, compaction and GC of shard {spec.shard!r}.")
    def rollup_gc(
        config: RollupGcConfig, consensus: ConsensusResource, blob_store: BlobStoreResource
    ) -> MaterializeResult:
        started = time.monotonic()
        retain = config.retain if config.retain is not None else spec.gc_retain
        try:
            shard = open_shard(consensus, blob_store, spec.shard, create=False)
        except ShardNotFound:
            return MaterializeResult(metadata={
                "note": MetadataValue.text(f"shard {spec.shard!r} does not exist yet")
            })
        try:
            report = shard.gc(retain=retain)
        except UpsertPlatformError as exc:
            raise _failure(exc) from exc
        meta = gc_metadata(report, time.monotonic() - started)
        meta.update({f"shard_{k}": v for k, v in shard_metadata(shard.inspect()).items()
                     if k in ("upper", "since", "rollups", "live_diffs", "blob_bytes")})
        return MaterializeResult(metadata=meta)

    return SourceAssets(
        spec=spec,
        partitions=partitions,
        assets=(source_snapshot, upsert_state, output_shard, rollup_gc),
        checks=build_checks(spec, state_key),
    )
