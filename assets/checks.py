"""Asset checks on a source's ``upsert_state`` (the asset whose run commits to the shard).

One subsettable ``multi_asset_check`` declares two sets of checks; jobs pick theirs.

**Blocking, run by the ingest job after every ``upsert_state`` run.** They check only
the batch the run committed, ``start_upper <= ts < upper`` (from the materialization's
metadata), so their cost follows the batch, not the shard's history
(:func:`upsert_core.ingest.verify.check_new_batch`); a run that committed nothing reads
nothing:

- ``shard_consolidated``: the batch's changes consolidate (per key and ts at most one
  retraction and one insertion, diffs +-1) and fit the keys' previous rows, taken from
  the touched buckets' checkpoint chain (each retraction retracts the live row; no
  insertion over a live row);
- ``storage_invariants``: every part and error part the batch references exists and
  decodes with the expected schema, row count, sort order and times;
- ``state_matches_shard``: each touched bucket's committed checkpoint (digest verified)
  equals its state before the run plus the batch's changes, key for key.

Blocking checks that fail stop the downstream assets of the run (``output_shard``), so
a corrupt batch is never reported as published.

**Full history, non-blocking, run by ``<source>_full_check`` on its schedule**
(``orchestration.schedules``) and by ``upsertctl check``; their cost follows the shard:

- ``full_shard_consolidated`` / ``full_storage_invariants``: ``check_shard`` (every
  readable time; every blob any live state references);
- ``full_state_matches_shard``: ``compare_state`` (every bucket's checkpoint against a
  full snapshot).

And ``error_rows_did_not_grow`` (WARN, with the ingest): the last ingest added rows to
the error collection. Error rows are data, so this warns and never blocks.
"""


from collections.abc import Iterator
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    DagsterEventType,
    MetadataValue,
    multi_asset_check,
)

from assets.spec import SourceSpec
from resources.stores import BlobStoreResource, ConsensusResource, open_shard
from upsert_core.errors import ShardNotFound, UpsertPlatformError
from upsert_core.ingest.verify import STATE as STATE_KIND
from upsert_core.ingest.verify import check_new_batch, compare_state
from upsert_core.persist import check
from upsert_core.persist.check import CheckReport, check_shard
from upsert_core.persist.shard import Shard

CONSOLIDATED = "shard_consolidated"
STORAGE = "storage_invariants"
STATE = "state_matches_shard"
ERRORS = "error_rows_did_not_grow"
BLOCKING_CHECKS = (CONSOLIDATED, STORAGE, STATE)
FULL_CONSOLIDATED = "full_shard_consolidated"
FULL_STORAGE = "full_storage_invariants"
FULL_STATE = "full_state_matches_shard"
FULL_CHECKS = (FULL_CONSOLIDATED, FULL_STORAGE, FULL_STATE)
MAX_SHOWN = 10


def full_check_keys(state_key: AssetKey) -> list[AssetCheckKey]:
    """The keys of the full-history checks (the ingest job leaves them out)."""
    return [AssetCheckKey(state_key, name) for name in FULL_CHECKS]


def _problems_md(problems: list[str]) -> MetadataValue:
    shown = problems[:MAX_SHOWN]
    more = [f"... and {len(problems) - MAX_SHOWN} more"] if len(problems) > MAX_SHOWN else []
    return MetadataValue.md("\n".join(f"- {p}" for p in [*shown, *more]) or "none")


def _split(report: CheckReport) -> tuple[list[str], list[str]]:
    return report.of_kind(check.CONSOLIDATION), report.of_kind(check.STORAGE)


def _run_metadata(context: AssetCheckExecutionContext, key: AssetKey) -> dict[str, Any]:
    """The metadata of the ingest's own materialization of ``key`` in this run (the one
    carrying ``start_upper``), else ``key``'s latest materialization.

    SUBTLE: a run also logs runtime materializations of other partitions (files applied
    by an earlier run or another path, with only their ``ts``); those must not be taken
    for the ingest's result, or the checks would cover the wrong range."""
    materialization = None
    records = context.instance.get_records_for_run(
        context.run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION, ascending=False
    ).records
    for record in records:
        found = record.event_log_entry.asset_materialization
        if found is not None and found.asset_key == key and "start_upper" in found.metadata:
            materialization = found
            break
    if materialization is None:
        event = context.instance.get_latest_materialization_event(key)
        materialization = None if event is None else event.asset_materialization
    return {} if materialization is None else dict(materialization.metadata)


def _int(meta: dict[str, Any], name: str) -> int | None:
    value = meta.get(name)
    value = getattr(value, "value", value)
    return value if isinstance(value, int) else None


def _new_error_rows(context: AssetCheckExecutionContext, key: AssetKey, shard: Shard) -> tuple[
    int, int, int
]:
    """(error rows since the last ingest's start upper, total error rows, that upper)."""
    since = _int(_run_metadata(context, key), "start_upper") or 0
    state = shard.state()
    new = sum(e.num_errors for e in state.errors if e.ts >= since)
    return new, state.num_errors(), since


def _batch_range(
    context: AssetCheckExecutionContext, key: AssetKey, shard: Shard
) -> tuple[int, int, str]:
    """``[start_upper, upper)`` the run committed, and where that came from."""
    meta = _run_metadata(context, key)
    start, upper = _int(meta, "start_upper"), _int(meta, "upper")
    if start is not None and upper is not None:
        return start, upper, "the materialization's start_upper and upper"
    shard_upper = shard.state().upper
    return max(0, shard_upper - 1), shard_upper, "no materialization metadata: the last ts"


def _batch_results(
    context: AssetCheckExecutionContext, state_key: AssetKey, shard: Shard
) -> Iterator[AssetCheckResult]:
    start, upper, source = _batch_range(context, state_key, shard)
    try:
        report = check_new_batch(shard, start, upper)
    except UpsertPlatformError as exc:
        report = CheckReport(shard_id=shard.shard_id)
        report.add(check.STORAGE, f"the batch [{start}, {upper}) cannot be checked: {exc}")
    consolidation, storage = _split(report)
    common = {
        "start_upper": MetadataValue.int(start),
        "upper": MetadataValue.int(upper),
        "range_from": MetadataValue.text(source),
        **{k: MetadataValue.int(v) for k, v in report.counts.items()
           if k not in ("start_upper", "upper")},
    }
    if report.notes:
        common["notes"] = _problems_md(report.notes)
    for name, problems in ((CONSOLIDATED, consolidation), (STORAGE, storage),
                           (STATE, report.of_kind(STATE_KIND))):
        yield AssetCheckResult(
            check_name=name, asset_key=state_key, passed=not problems,
            metadata={"problems": _problems_md(problems), **common},
        )


def _full_results(state_key: AssetKey, shard: Shard) -> Iterator[AssetCheckResult]:
    report = check_shard(shard)
    consolidation, storage = _split(report)
    counts = {k: MetadataValue.int(v) for k, v in report.counts.items()}
    yield AssetCheckResult(
        check_name=FULL_CONSOLIDATED, asset_key=state_key, passed=not consolidation,
        metadata={"problems": _problems_md(consolidation), **counts},
    )
    yield AssetCheckResult(
        check_name=FULL_STORAGE, asset_key=state_key, passed=not storage,
        metadata={"problems": _problems_md(storage), **counts},
    )
    compared = compare_state(shard)
    yield AssetCheckResult(
        check_name=FULL_STATE, asset_key=state_key, passed=compared.ok,
        metadata={
            "problems": _problems_md(compared.problems),
            "upper": MetadataValue.int(compared.upper),
            "state_keys": MetadataValue.int(compared.state_keys),
            "live_keys": MetadataValue.int(compared.live_keys),
            "shard_rows": MetadataValue.int(compared.shard_rows),
            "checkpoint_bytes": MetadataValue.int(compared.checkpoint_bytes),
            "buckets": MetadataValue.int(compared.buckets),
        },
    )


def build_checks(spec: SourceSpec, state_key: AssetKey) -> AssetChecksDefinition:
    """The checks of one source's ``upsert_state`` (see the module docstring)."""

    @multi_asset_check(
        name=f"{spec.name}_shard_checks",
        can_subset=True,
        specs=[
            AssetCheckSpec(CONSOLIDATED, asset=state_key, blocking=True,
                           description="the run's changes consolidate and fit the keys'"
                           " previous rows"),
            AssetCheckSpec(STORAGE, asset=state_key, blocking=True,
                           description="the run's parts and error parts exist and decode"),
            AssetCheckSpec(STATE, asset=state_key, blocking=True,
                           description="the touched buckets' checkpoints equal their state"
                           " before the run plus its changes"),
            AssetCheckSpec(ERRORS, asset=state_key,
                           description="warns when the last ingest added error rows"),
            AssetCheckSpec(FULL_CONSOLIDATED, asset=state_key,
                           description="full history: changes consolidated at every"
                           " readable time; at most one live row per key (scheduled)"),
            AssetCheckSpec(FULL_STORAGE, asset=state_key,
                           description="full history: state versions well formed; every"
                           " referenced blob exists (scheduled)"),
            AssetCheckSpec(FULL_STATE, asset=state_key,
                           description="full history: every upsert state checkpoint equals"
                           " the shard at its upper (scheduled)"),
        ],
    )
    def shard_checks(
        context: AssetCheckExecutionContext,
        consensus: ConsensusResource,
        blob_store: BlobStoreResource,
    ) -> Iterator[AssetCheckResult]:
        selected = {k.name for k in context.selected_asset_check_keys}
        try:
            shard = open_shard(consensus, blob_store, spec.shard, create=False)
        except ShardNotFound:
            for name in sorted(selected):
                yield AssetCheckResult(
                    check_name=name, asset_key=state_key, passed=True,
                    metadata={"note": MetadataValue.text("the shard does not exist yet")},
                )
            return
        if selected & set(BLOCKING_CHECKS):
            for result in _batch_results(context, state_key, shard):
                if result.check_name in selected:
                    yield result
        if selected & set(FULL_CHECKS):
            for result in _full_results(state_key, shard):
                if result.check_name in selected:
                    yield result
        if ERRORS in selected:
            new, total, since = _new_error_rows(context, state_key, shard)
            yield AssetCheckResult(
                check_name=ERRORS, asset_key=state_key, passed=new == 0,
                severity=AssetCheckSeverity.WARN,
                description=None if new == 0 else f"{new} new error row(s) since ts {since}",
                metadata={
                    "new_error_rows": MetadataValue.int(new),
                    "error_rows": MetadataValue.int(total),
                    "since_ts": MetadataValue.int(since),
                },
            )

    return shard_checks
