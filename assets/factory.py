"""The asset factory: one group of four assets (and their checks) per source.

For a source ``S`` (group ``S``, keys prefixed ``S/``):

- ``S/source_snapshot`` (partitioned, one partition per landing file F): the landing as
  the run sees it: each partition's file, size and format, and which pending files the
  run will apply (every pending file with a name <= the run's greatest partition). Reads
  no data.
- ``S/upsert_state`` (partitioned): THE ingest step (``upsert_core.ingest.ingest``, the
  code path ``upsertctl ingest`` runs) on the Spark engine through :class:`SparkResource`,
  stopped after the run's greatest partition (:mod:`assets.ingest_step`). It drains each
  file against the bucketed upsert state and commits data, errors and state checkpoints
  in one compare-and-append per file. Its checks (:mod:`assets.checks`) run after it;
  blocking ones gate ``output_shard``.
- ``S/output_shard`` (partitioned): the consolidated shard as published after the
  blocking checks passed: upper, seqno, batches, bytes, error rows, and
  ``published_upper``, the upper those checks verified (the published watermark, see
  :mod:`assets.checks`).
- ``S/rollup_gc`` (not partitioned; on a schedule): rollup, compaction and GC, with what
  it removed.

Invariants:

- Whatever partitions a run covers and whatever order runs come in, files are applied in
  name order (see ``ingest_step``); a run whose partitions are all ingested is a no-op
  that says so and makes no engine (no Spark session).
- Backfills are single runs (``BackfillPolicy.single_run()``): a backfill of N files is
  one run and one ingest; each partition of the run is reported materialized with the
  ts its file went in at (``ts``, ``applied_by`` per partition).
- Partition status tells the truth about the shard. ``upsert_state`` (applied) reports,
  besides the run's own partitions (as ``AssetMaterialization`` events of the run, with
  ``partition=``), every file the shard holds whose partition exists but is not
  materialized yet: files applied by this run outside its range (earlier pending files)
  and files applied by any other path (``upsertctl ingest``). The landing sensor does
  the same for shards no run touches (:mod:`orchestration.sensors`). A failed
  ``upsert_state`` (a file-level error, or a lost race before its retry) still reports
  the files it committed before the failure, as this run's.
- **A partition is published only after a blocking check covered its ts.** Every
  ``output_shard`` materialization carries ``published_upper``, the upper its run's
  blocking checks verified; those checks cover ``[watermark, upper)`` from the previous
  ``published_upper`` (:mod:`assets.checks`). ``output_shard`` runs only when they
  passed, and reports every applied partition with ts < ``published_upper`` not yet
  materialized for it (files of earlier runs whose checks failed, of a first attempt
  before a retry, of ``upsertctl ingest``); nothing else publishes (the sensor reports
  ``upsert_state`` only). Selected without its checks, it fails for partitions no check
  covered.
- The assets that write the shard (``upsert_state``, ``rollup_gc``) share the
  concurrency pool :func:`shard_pool` (``upsert-shard-<shard>``, limit 1 in
  ``deploy/dagster.yaml`` and ``deploy/dagster-dev.yaml``), so runs of one shard do not
  race. Should another writer win a race anyway, ``upsert_state`` fails with
  ``ConcurrentModification`` and requests a retry (:data:`RACE_RETRY_POLICY`'s count and
  delays, shown as a retry in the UI); the ingest is idempotent, so the retry applies
  only what is still pending. File-level problems are not retried, and neither is an
  interrupt (Ctrl-C, SIGTERM, a terminated run): the policy is not attached to the
  asset, since Dagster retries an interrupted step under a retry policy, and so a run
  stopped while it ingested restarted the ingest, with a new Spark driver that the
  signal had not reached.
- A file-level problem fails the run with the pipeline's one-line message; files before
  it stay committed.
"""


import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetChecksDefinition,
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    BackfillPolicy,
    Backoff,
    Config,
    DagsterEventType,
    DynamicPartitionsDefinition,
    Failure,
    Jitter,
    MaterializeResult,
    MetadataValue,
    RetryPolicy,
    RetryRequested,
    asset,
)
from pydantic import Field

from assets.checks import BLOCKING_CHECKS, build_checks
from assets.core_logs import forward_core_logs
from assets.ingest_step import find_file, ingest_through, run_partitions
from assets.metadata import (
    APPLIED_BEFORE,
    APPLIED_BY_RUN,
    PUBLISHED_UPPER,
    applied_by_run,
    column_schema_metadata,
    file_metadata,
    gc_metadata,
    ingest_metadata,
    partition_materializations,
    partition_metadata,
    published_upper,
    row_count_metadata,
    run_totals,
    shard_metadata,
    unreported_partitions,
)
from assets.partition_order import landing_partitions, report_in_ts_order
from assets.spec import SourceSpec
from resources.spark import SparkResource
from resources.stores import (
    BlobStoreResource,
    ConsensusResource,
    open_shard,
    open_shard_to_ingest,
)
from upsert_core.errors import (
    ConcurrentModification,
    LandingFileChanged,
    ShardNotFound,
    UpsertPlatformError,
)
from upsert_core.ingest import ProgressEvent
from upsert_core.ingest.maintenance import gc_with_retention
from upsert_core.landing import list_landing, pending
from upsert_core.persist.keys import claim_writer_token
from upsert_core.redact import redact_url
from upsert_core.shard_summary import shard_summary
from upsert_core.shard_table import ShardTable

#: Retries of ``upsert_state`` after a lost race (``ConcurrentModification``) or a landing
#: file that changed while read (``LandingFileChanged``): 1 s, 2 s,
#: 4 s apart (+-jitter), requested by the step (``RetryRequested``). Not the asset's
#: ``retry_policy``: Dagster applies one to interrupts too (module docstring).
RACE_RETRY_POLICY = RetryPolicy(max_retries=3, delay=1.0, backoff=Backoff.EXPONENTIAL,
                                jitter=Jitter.PLUS_MINUS)
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
        " source's gc_retain (null there: the shard's stored retention, else all history)",
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


def shard_pool(shard: str) -> str:
    """The concurrency pool of the assets that write ``shard`` (limit 1 per instance)."""
    return f"upsert-shard-{shard}"


def _failure(exc: UpsertPlatformError) -> Failure:
    return Failure(description=str(exc), metadata={"error": MetadataValue.text(str(exc))},
                   allow_retries=False)


def _race_retry(retries_so_far: int) -> RetryRequested:
    """Another attempt of the step, as :data:`RACE_RETRY_POLICY` spaces them."""
    return RetryRequested(max_retries=RACE_RETRY_POLICY.max_retries,
                          seconds_to_wait=RACE_RETRY_POLICY.calculate_delay(retries_so_far + 1))


def _ingested(consensus: ConsensusResource, blob_store: BlobStoreResource,
              shard_name: str) -> dict[str, int]:
    try:
        shard = open_shard(consensus, blob_store, shard_name, create=False)
    except ShardNotFound:
        return {}
    return dict(shard.state().ingested_files)


def _report_unreported(
    context: AssetExecutionContext, key: AssetKey, partitions_name: str,
    ingested: Mapping[str, int], exclude: list[str], applied_here: Mapping[str, int],
    extra: Mapping[str, MetadataValue] | None = None,
    per_file: Mapping[str, Mapping[str, MetadataValue]] | None = None,
) -> None:
    """Log a materialization of every partition of ``ingested`` that Dagster does not
    show as materialized (outside ``exclude``, the partitions the run itself reports);
    ``applied_here``: the files this run committed (labelled so)."""
    instance = context.instance
    missing = unreported_partitions(
        instance, key, ingested, instance.get_dynamic_partitions(partitions_name), exclude
    )
    ours = {n: ts for n, ts in missing.items() if n in applied_here}
    others = {n: ts for n, ts in missing.items() if n not in applied_here}
    for event in [*partition_materializations(key, ours, APPLIED_BY_RUN, extra, per_file),
                  *partition_materializations(key, others, APPLIED_BEFORE, extra)]:
        context.log_event(event)
    if missing:
        context.log.info(f"{key.to_user_string()}: reported {len(missing)} partition(s) the"
                         f" shard already holds: {sorted(missing)[:10]}")


def _verified_upper(context: AssetExecutionContext, state_key: AssetKey) -> int | None:
    """The upper this run's blocking checks verified: every one of them evaluated in
    this run and passed (else None)."""
    found: dict[str, AssetCheckEvaluation] = {}
    records = context.instance.get_records_for_run(
        context.run.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION).records
    for record in records:
        event = record.event_log_entry.dagster_event
        data = None if event is None else event.event_specific_data
        if isinstance(data, AssetCheckEvaluation) and data.asset_key == state_key:
            found[data.check_name] = data
    uppers = []
    for name in BLOCKING_CHECKS:
        evaluation = found.get(name)
        if evaluation is None or not evaluation.passed:
            return None
        value = getattr(evaluation.metadata.get("upper"), "value", None)
        if not isinstance(value, int):
            return None
        uppers.append(value)
    return min(uppers)


def landing_kind(landing: str) -> str:
    """The Dagster kind of a landing location: ``s3`` or ``file``."""
    return "s3" if landing.startswith("s3://") else "file"


def build_source_assets(
    spec: SourceSpec, store_kinds: tuple[str, str] = ("sqlite", "file")
) -> SourceAssets:
    """The four assets and the checks of ``spec`` (see the module docstring).

    ``store_kinds``: the Dagster kinds of the consensus and blob stores (e.g.
    ``("postgres", "s3")``), shown on the assets that read or write the shard; the
    source's ``description``, ``owners`` and ``tags`` go on every asset."""
    partitions = landing_partitions(spec.partitions_name)  # events in name (ts) order
    catalog: dict[str, Any] = {"owners": list(spec.owners), "tags": dict(spec.tags)}
    about = f"{spec.description.rstrip('.')}. " if spec.description else ""
    shard_kinds = set(store_kinds)
    prefix = [spec.name]
    snapshot_key, state_key, output_key = (AssetKey([spec.name, n]) for n in (SNAPSHOT, STATE,
                                                                             OUTPUT))

    pool = shard_pool(spec.shard)
    backfill = BackfillPolicy.single_run()

    @asset(name=SNAPSHOT, partitions_def=partitions, key_prefix=prefix, group_name=spec.name,
           backfill_policy=backfill, kinds={landing_kind(spec.landing)}, **catalog,
           description=f"{about}Landing file (partition) of {redact_url(spec.landing)} and what"
           " its run applies.")
    def source_snapshot(
        context: AssetExecutionContext, consensus: ConsensusResource,
        blob_store: BlobStoreResource,
    ) -> MaterializeResult:
        ingested = _ingested(consensus, blob_store, spec.shard)
        keys = run_partitions(context.partition_keys)
        try:
            files = list_landing(spec.landing)
            listed = {f.name for f in files}
            # A partition whose file is gone fails upsert_state (naming it) after the
            # files that are there went in; here it is reported as not in the landing.
            chosen = {k: find_file(files, k, spec.landing) for k in keys
                      if k not in ingested and k in listed}
        except UpsertPlatformError as exc:
            raise _failure(exc) from exc
        by_name = {f.name: f for f in files}
        # Each partition's own file; the result's metadata (copied by Dagster onto every
        # partition of the run) holds only what the run shares, and no count.
        for k in keys:
            f = chosen.get(k) or by_name.get(k)
            context.add_asset_metadata({
                "file": MetadataValue.text(k),
                "format": MetadataValue.text(f.suffix.lstrip(".") if f else ""),
                "file_bytes": MetadataValue.int(max(f.size, 0) if f else 0),
                "already_ingested": MetadataValue.bool(k in ingested),
                "in_landing": MetadataValue.bool(f is not None),
            }, partition_key=k)
        target = keys[-1]
        todo = [f for f in pending(files, ingested) if f.name <= target]
        file = chosen.get(target) or by_name.get(target)
        return MaterializeResult(metadata={
            "landing": MetadataValue.text(file.root if file else redact_url(spec.landing)),
            "pending_files": MetadataValue.json([f.name for f in todo[:20]]),
        })

    @asset(name=STATE, partitions_def=partitions, deps=[snapshot_key],
           kinds={"spark", *shard_kinds}, **catalog,
           key_prefix=prefix, group_name=spec.name, pool=pool, backfill_policy=backfill,
           description=f"{about}Ingest (Spark) of the pending files through the partition into"
                       f" shard {spec.shard!r}, with the bucketed upsert state.")
    def upsert_state(
        context: AssetExecutionContext, consensus: ConsensusResource,
        blob_store: BlobStoreResource, spark: SparkResource,
    ) -> MaterializeResult:
        started = time.monotonic()
        keys = run_partitions(context.partition_keys)
        # The ingest registers its own writer id in the shard (upsert_core.persist.write.writers),
        # which is what protects and fences the blobs it writes; the legacy process token
        # only names blobs written outside any registration (rollups).
        claim_writer_token()
        try:  # a first file refused as a whole leaves no empty shard behind
            shard = open_shard_to_ingest(consensus, blob_store, spec.shard, spec.landing,
                                         spec.request(), max(keys))
        except UpsertPlatformError as exc:
            raise _failure(exc) from exc
        if shard.state().upper:  # stored first, so this run's maintenance applies it
            spec.store_retention(shard)
        # Files earlier attempts of this step committed before losing a race (they
        # reported them): this run's too.
        earlier = (applied_by_run(context.instance, context.run.run_id, state_key)
                   if context.retry_number else {})
        start_upper = min([shard.state().upper, *earlier.values()])
        committed: dict[str, int] = dict(earlier)

        def log_progress(event: ProgressEvent) -> None:
            if event.kind == "file_done" and event.report is not None:
                r = event.report
                committed[r.name] = r.ts
                context.log.info(
                    f"[{event.index}/{event.total}] {r.name}: ts {r.ts}, {r.rows_read} row(s)"
                    f" read, {r.inserts} insert(s), {r.retractions} retraction(s), {r.errors}"
                    f" error row(s), "
                    + (f"{r.late_rows} late row(s), " if r.late_rows else "")
                    + f"{r.seconds:.2f}s"
                )

        try:
            # The engine (a Spark session) is made only if a file is actually pending.
            with forward_core_logs(context.log, context.instance):
                result = ingest_through(
                    shard, spec.landing, spec.request(), keys,
                    engine_factory=spark.ingest_engine, progress=log_progress,
                )
        except UpsertPlatformError as exc:
            # Files committed before the failure are in the shard: show them, as this
            # run's (a retry after a lost race finds them so).
            _report_unreported(context, state_key, spec.partitions_name,
                               dict(shard.state().ingested_files), [], committed)
            if isinstance(exc, ConcurrentModification):
                context.log.warning(f"lost a race on shard {spec.shard!r}; retrying: {exc}")
                raise _race_retry(context.retry_number) from exc
            if isinstance(exc, LandingFileChanged):  # probably still being written
                context.log.warning(f"a landing file changed while read; retrying: {exc}")
                raise _race_retry(context.retry_number) from exc
            raise _failure(exc) from exc
        for warning in result.warnings:
            context.log.warning(warning)
        if shard.state().upper:  # a new shard's, once the ingest created it
            spec.store_retention(shard)
        here = {**committed, **result.applied_here}
        result.start_upper = start_upper
        # Each partition's event carries its own file's figures; the run's totals go to
        # its log (on every partition they would plot as N times the volume).
        per_file = {f.name: file_metadata(f) for f in result.files}
        for k in keys:
            context.add_asset_metadata(
                {**partition_metadata(k, result.applied_at[k],
                                      APPLIED_BY_RUN if k in here else APPLIED_BEFORE),
                 **per_file.get(k, {})},
                partition_key=k,
            )
        _report_unreported(context, state_key, spec.partitions_name,
                           dict(shard.state().ingested_files), keys, here, per_file=per_file)
        seconds = time.monotonic() - started
        meta = ingest_metadata(result, seconds, spark.engine)
        context.log.info(meta["status"].value)
        if result.files:
            context.log.info(run_totals(result, seconds))
        report_in_ts_order(spec.partitions_name, {k: result.applied_at[k] for k in keys})
        return MaterializeResult(metadata=meta)

    @asset(name=OUTPUT, partitions_def=partitions, deps=[state_key], key_prefix=prefix,
           group_name=spec.name, backfill_policy=backfill, kinds=shard_kinds, **catalog,
           description=f"{about}The consolidated shard {spec.shard!r}, published after its"
           " checks.")
    def output_shard(
        context: AssetExecutionContext, consensus: ConsensusResource,
        blob_store: BlobStoreResource,
    ) -> MaterializeResult:
        shard = open_shard(consensus, blob_store, spec.shard, create=False)
        keys = run_partitions(context.partition_keys)
        ingested = dict(shard.state().ingested_files)
        watermark = published_upper(context.instance, output_key)
        verified = _verified_upper(context, state_key)
        published = max(watermark, verified or 0)
        unverified = [k for k in keys if ingested.get(k, published) >= published]
        if unverified:
            raise Failure(
                description=f"{len(unverified)} partition(s) not covered by a passed"
                f" blocking check (published through ts {published}):"
                f" {unverified[:10]}; materialize upsert_state with its checks (the"
                f" {spec.name}_ingest job) to publish them",
                allow_retries=False,
            )
        extra = {PUBLISHED_UPPER: MetadataValue.int(published)}
        ours = applied_by_run(context.instance, context.run.run_id, state_key)
        for k in keys:
            context.add_asset_metadata(
                {**partition_metadata(k, ingested[k],
                                      APPLIED_BY_RUN if k in ours else APPLIED_BEFORE),
                 **extra},
                partition_key=k,
            )
        # Publish every applied file the checks have now covered (ts < published).
        covered = {n: ts for n, ts in ingested.items() if ts < published}
        _report_unreported(context, output_key, spec.partitions_name, covered, keys, ours,
                           extra)
        summary = shard_summary(shard)
        meta = shard_metadata(summary)
        meta.update(column_schema_metadata(ShardTable(shard).row_view().visible))
        # SUBTLE: the recorded live-row count is the shard's at ITS upper. A batch
        # committed after the checks ran (``upsertctl ingest`` meanwhile) is not
        # published: its rows must not be in the published row count, so the count is
        # reported only when it is the published shard's (else the previous one stands).
        upper = int(summary["upper"])  # type: ignore[call-overload]
        if upper == published:
            meta.update(row_count_metadata(summary))
        else:
            context.log.info(f"shard {spec.shard!r} is at upper {upper}, published"
                             f" through {published}: dagster/row_count not updated")
            meta["unpublished_batches"] = MetadataValue.int(max(upper - published, 0))
        meta.update(extra)
        report_in_ts_order(spec.partitions_name, {k: ingested[k] for k in keys})
        return MaterializeResult(metadata=meta)

    @asset(name=GC, deps=[output_key], key_prefix=prefix, group_name=spec.name, pool=pool,
           kinds=shard_kinds, **catalog,
           description=f"{about}Rollup, compaction and GC of shard {spec.shard!r}.")
    def rollup_gc(
        context: AssetExecutionContext, config: RollupGcConfig, consensus: ConsensusResource,
        blob_store: BlobStoreResource,
    ) -> MaterializeResult:
        with forward_core_logs(context.log, context.instance):
            return _rollup_gc(config, consensus, blob_store)

    def _rollup_gc(
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
            # Without a retain, the shard's stored retention (upsertctl retention),
            # applied as ingest maintenance applies it: never forcing a rebuild of
            # upsert state, a duration resolved against the state it changes.
            report = gc_with_retention(shard, retain)
        except UpsertPlatformError as exc:
            raise _failure(exc) from exc
        meta = gc_metadata(report, time.monotonic() - started)
        meta.update({f"shard_{k}": v for k, v in shard_metadata(shard_summary(shard)).items()
                     if k in ("upper", "since", "rollups", "live_diffs", "live_rows",
                              "blob_bytes")})
        return MaterializeResult(metadata=meta)

    return SourceAssets(
        spec=spec,
        partitions=partitions,
        assets=(source_snapshot, upsert_state, output_shard, rollup_gc),
        checks=build_checks(spec, state_key, output_key),
    )
