"""Dagster metadata from ingest, shard and GC reports.

Numbers are ``MetadataValue.int``/``float`` so the UI plots them across
materializations (rows read, inserts, retractions, errors, late rows, bytes written,
upper, seqno, state size, durations); text and lists are ``text``/``json``. Keys are stable: the UI
plots a key's history, so renaming one breaks its plot.

Every materialization of a partition (one landing file) carries ``ts`` (the timestamp the
file went in at) and ``applied_by`` (:func:`partition_metadata`), whether a run applied
it, a run found it already applied, or the landing sensor found it in the shard.

Every materialization of ``output_shard`` also carries ``published_upper``: the upper the
blocking checks of its run verified (every ts below it has been covered by a blocking
check that passed). The latest one is the source's *published watermark*
(:func:`published_upper`): the next run's blocking checks start there, and a partition
is published only once its ts is below it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dagster import (
    AssetKey,
    AssetMaterialization,
    DagsterEventType,
    DagsterInstance,
    MetadataValue,
    TableColumn,
    TableSchema,
)

from assets.ingest_step import PartitionIngest
from upsert_core.ingest.report import FileReport
from upsert_core.landing import SourceSchema
from upsert_core.persist.maintenance.gc import GcReport
from upsert_core.shard_summary import LIVE_ROWS

MAX_NAMES = 20


def _names(names: list[str]) -> MetadataValue:
    shown = names[:MAX_NAMES]
    if len(names) > MAX_NAMES:
        shown.append(f"... and {len(names) - MAX_NAMES} more")
    return MetadataValue.json(shown)


APPLIED_BY_RUN = "this run"
APPLIED_BEFORE = "already in the shard"
#: metadata key of every ``output_shard`` materialization (see the module docstring)
PUBLISHED_UPPER = "published_upper"


def partition_status(name: str, ts: int, applied_by: str) -> str:
    """One partition's one-line status (the backfill CLI prints it)."""
    if applied_by == APPLIED_BY_RUN:
        return f"applied at ts {ts}"
    return f"{name} was already ingested at ts {ts}"


def partition_metadata(name: str, ts: int, applied_by: str) -> dict[str, Any]:
    """The metadata of one partition's materialization: where its file went in, and how
    (``applied_by``: this run, already in the shard, or found by the sensor)."""
    return {
        "partition_status": MetadataValue.text(partition_status(name, ts, applied_by)),
        "ts": MetadataValue.int(ts),
        "applied_by": MetadataValue.text(applied_by),
    }


def file_metadata(report: FileReport) -> dict[str, Any]:
    """What ingesting one file did: the figures of its own partition's event (never the
    run's totals, which would repeat on every partition and plot as N times the volume)."""
    return {
        "rows_read": MetadataValue.int(report.rows_read),
        "inserts": MetadataValue.int(report.inserts),
        "retractions": MetadataValue.int(report.retractions),
        "errors": MetadataValue.int(report.errors),
        "late_rows": MetadataValue.int(report.late_rows),
        "bytes_written": MetadataValue.int(report.bytes_written),
        "file_bytes": MetadataValue.int(report.size),
        "landing_bytes_read": MetadataValue.int(report.landing_bytes_read),
        "digest_bytes_read": MetadataValue.int(report.digest_bytes_read),
        "read_tasks": MetadataValue.int(report.read_tasks),
        "drain_tasks": MetadataValue.int(report.drain_tasks),
        "task_peak_memory": MetadataValue.int(report.task_peak_memory),
        "read_memory_added": MetadataValue.int(report.read_memory_added),
        "drain_memory_added": MetadataValue.int(report.drain_memory_added),
        "largest_bucket_keys": MetadataValue.int(report.largest_bucket_keys),
        "rehydrated_buckets": MetadataValue.int(len(report.rehydrated_buckets)),
        "ingest_seconds": MetadataValue.float(float(report.seconds)),
    }


def ingest_metadata(result: PartitionIngest, seconds: float, engine: str) -> dict[str, Any]:
    """What one run's ingest did, for the run's own partitions: what the run applied and
    where the shard stands; the per-file figures are each partition's own
    (:func:`file_metadata`), the run's totals go to its log."""
    if result.already_ingested_at is not None and result.no_op:
        status = f"{result.partition} was already ingested at ts {result.already_ingested_at}"
        if len(result.partitions) > 1:
            status = f"all {len(result.partitions)} partition(s) were already ingested"
    else:
        status = f"applied {len(result.files)} file(s) through {result.partition}"
    # SUBTLE: Dagster copies this metadata onto every partition of the run, so it holds
    # no count of the run (files applied, partitions): plotted per partition, a count of
    # N would read as N times the volume. The status text and the run's log say them.
    meta: dict[str, Any] = {
        "status": MetadataValue.text(status),
        "engine": MetadataValue.text(engine),
        "start_upper": MetadataValue.int(result.start_upper),
        "upper": MetadataValue.int(result.upper),
        "seqno": MetadataValue.int(result.seqno),
    }
    if result.files:
        meta["files"] = _names([f.name for f in result.files])
    return meta


def run_totals(result: PartitionIngest, seconds: float) -> str:
    """The run's totals, one line for its log."""
    return (
        f"run totals: {len(result.files)} file(s), {int(result.total('rows_read'))} row(s)"
        f" read, {int(result.total('inserts'))} insert(s), {int(result.total('retractions'))}"
        f" retraction(s), {int(result.total('errors'))} error row(s),"
        f" {int(result.total('bytes_written'))} bytes written, {seconds:.2f}s"
    )


_SHARD_INTS = (
    "seqno", "since", "upper", "batches", "parts", "updates", "rollups", "live_diffs",
    "blob_bytes", "blob_count", "error_rows", "writers", "leased_readers",
)


def shard_metadata(inspected: Mapping[str, object]) -> dict[str, Any]:
    """The shard's state and storage, from ``upsert_core.shard_summary.shard_summary``
    (what ``upsertctl inspect`` prints). ``live_rows`` is the live rows at ``upper``,
    null when the shard does not record them for that upper."""
    meta: dict[str, Any] = {
        name: MetadataValue.int(int(inspected[name]))  # type: ignore[call-overload]
        for name in _SHARD_INTS
        if isinstance(inspected.get(name), int)
    }
    if LIVE_ROWS in inspected:
        rows = inspected[LIVE_ROWS]
        meta[LIVE_ROWS] = (MetadataValue.int(rows) if isinstance(rows, int)
                           else MetadataValue.null())
    files = inspected.get("ingested_files")
    if isinstance(files, Mapping):
        meta["ingested_files"] = MetadataValue.int(len(files))
        if files:
            meta["last_file"] = MetadataValue.text(max(files))
    rewritten = inspected.get("rewritten_files")
    if isinstance(rewritten, list):  # what the last ingest found (upsert_core.ingest.ledger)
        meta["rewritten_files"] = MetadataValue.int(len(rewritten))
    meta["shard"] = MetadataValue.text(str(inspected.get("shard")))
    return meta


def column_schema_metadata(schema: SourceSchema | None) -> dict[str, Any]:
    """The shard's columns as Dagster's ``dagster/column_schema`` (shown in the catalog),
    in the type names ``upsertctl inspect`` and ``open_shard().inspect()`` use; ``schema``
    is the shard's visible one (``RowView.visible``: a Debezium shard's stored order
    columns are not columns of the shard)."""
    columns = [] if schema is None else [
        TableColumn(name=name, type=str(typ)) for name, typ in schema.columns
    ]
    return {"dagster/column_schema": TableSchema(columns=columns)}


def gc_metadata(report: GcReport, seconds: float) -> dict[str, Any]:
    """What one rollup/compaction/GC pass removed and rewrote."""
    meta: dict[str, Any] = {
        name: MetadataValue.int(int(value))
        for name, value in report.as_dict().items()
        if isinstance(value, int) and not isinstance(value, bool)
    }
    meta["gc_seconds"] = MetadataValue.float(report.seconds)
    meta["duration_seconds"] = MetadataValue.float(seconds)
    meta["deleted_blobs"] = _names(list(report.deleted_keys))
    return meta


def row_count_metadata(inspected: Mapping[str, object]) -> dict[str, Any]:
    """``dagster/row_count``: the summary's ``live_rows`` (the live rows at its upper, as
    the ingest recorded them); nothing when they are unknown (module
    ``upsert_core.shard_summary``)."""
    rows = inspected.get(LIVE_ROWS)
    return {"dagster/row_count": MetadataValue.int(rows)} if isinstance(rows, int) else {}


def unreported_partitions(
    instance: DagsterInstance,
    key: AssetKey,
    ingested: Mapping[str, int],
    partitions: Iterable[str],
    exclude: Iterable[str] = (),
) -> dict[str, int]:
    """The files of ``ingested`` (name -> ts) that have a partition (in ``partitions``),
    are not in ``exclude`` and are not materialized for ``key`` yet: what still shows as
    Missing in Dagster although the shard holds it. One event-storage query."""
    candidates = set(ingested).intersection(partitions).difference(exclude)
    if not candidates:
        return {}
    candidates -= instance.get_materialized_partitions(key)
    return {name: ingested[name] for name in sorted(candidates)}


def partition_materializations(
    key: AssetKey, files: Mapping[str, int], applied_by: str,
    extra: Mapping[str, Any] | None = None,
    per_file: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[AssetMaterialization]:
    """One ``AssetMaterialization`` per file (partition) with its ts, ``extra`` and its
    own ``per_file`` figures, in ts order (so the latest event is the latest file)."""
    return [
        AssetMaterialization(asset_key=key, partition=name,
                             metadata={**partition_metadata(name, ts, applied_by),
                                       **(extra or {}), **(per_file or {}).get(name, {})})
        for name, ts in sorted(files.items(), key=lambda item: (item[1], item[0]))
    ]


def int_value(metadata: Mapping[str, Any], name: str) -> int | None:
    """The integer value of a metadata entry (None if absent or not an integer)."""
    value = metadata.get(name)
    value = getattr(value, "value", value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def published_upper(instance: DagsterInstance, output_key: AssetKey) -> int:
    """The published watermark: ``published_upper`` of ``output_key``'s latest
    materialization, 0 if there is none or it has none (materialized before the
    watermark existed): the next checks then cover the whole history once."""
    entry = instance.get_latest_materialization_event(output_key)
    event = None if entry is None else entry.asset_materialization
    if event is None:
        return 0
    return int_value(event.metadata, PUBLISHED_UPPER) or 0


def run_ingest_metadata(
    instance: DagsterInstance, run_id: str, state_key: AssetKey
) -> Mapping[str, Any] | None:
    """The metadata of the ingest's own materialization of ``state_key`` in the run (the
    newest one carrying ``start_upper``), or None.

    SUBTLE: a run also logs runtime materializations of other partitions (files applied
    by an earlier run or another path, with only their ``ts``); those must never be taken
    for the ingest's result, or checks would cover the wrong range."""
    records = instance.get_records_for_run(
        run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION, ascending=False
    ).records
    for record in records:
        found = record.event_log_entry.asset_materialization
        if found is not None and found.asset_key == state_key and "start_upper" in found.metadata:
            return found.metadata
    return None


def applied_by_run(instance: DagsterInstance, run_id: str, state_key: AssetKey) -> dict[str, int]:
    """The files (name -> ts) the run committed, as its ``upsert_state`` materializations
    say (``applied_by`` = this run), whichever attempt of the step committed them."""
    found: dict[str, int] = {}
    records = instance.get_records_for_run(
        run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION).records
    for record in records:
        event = record.event_log_entry.asset_materialization
        if event is None or event.asset_key != state_key or event.partition is None:
            continue
        applied = event.metadata.get("applied_by")
        ts = int_value(event.metadata, "ts")
        if ts is not None and getattr(applied, "value", None) == APPLIED_BY_RUN:
            found[event.partition] = ts
    return found
