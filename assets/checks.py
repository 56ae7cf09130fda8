"""Asset checks on a source's ``upsert_state`` (the asset whose run commits to the shard).

One subsettable ``multi_asset_check`` declares two sets of checks; jobs pick theirs.

**Blocking, run by the ingest job after every ``upsert_state`` run.** They check the
range ``[watermark, upper)``: ``upper`` is the shard's upper after the run's ingest (from
the run's ``upsert_state`` materialization) and ``watermark`` is the source's *published
watermark*, ``published_upper`` of the latest ``output_shard`` materialization
(:func:`assets.metadata.published_upper`; 0 when there is none: the first checked run
covers the whole history once, e.g. a shard ``upsertctl`` filled before Dagster was
used). Not the run's own ``start_upper``: a batch whose checks failed, files a first
attempt committed before a lost race, files ``upsertctl ingest`` applied, all stay in
the range until a run's checks pass over them. Normally the range is the run's batch,
so the cost follows the batch, not the shard's history
(:func:`upsert_core.ingest.verify.check_new_batch`, ``method: batch``):

- ``shard_consolidated``: the range's changes consolidate (per key and ts at most one
  retraction and one insertion, diffs +-1) and fit the keys' previous rows, taken from
  the touched buckets' checkpoint chain (each retraction retracts the live row; no
  insertion over a live row);
- ``storage_invariants``: every part and error part the range references exists and
  decodes with the expected schema, row count, sort order and times;
- ``state_matches_shard``: each touched bucket's committed checkpoint (digest verified)
  equals its state at the watermark plus the range's changes, key for key.

When the batch method cannot verify the range (history truncated or compacted by a GC
that ran before the check, the watermark below the shard's ``since``, a bucket whose
state at the watermark cannot be caught up: whatever it reports in ``notes``), the
blocking result of that run is the full checks' (``check_shard`` + ``compare_state``,
as the scheduled full check), with ``method: full (<why>)``: such a range never passes
unverified, and only those rare runs pay the full cost (:func:`verify_range`).

Blocking checks that fail stop the downstream assets of the run (``output_shard``), and
the watermark stays where it was: every later run checks that range again, so a corrupt
batch is never reported as published. Invariant: **a partition is published
(``output_shard`` materialized) only after a blocking check covered its ts.**

**Full history, non-blocking, run by ``<source>_full_check`` on its schedule**
(``orchestration.schedules``) and by ``upsertctl check``; their cost follows the shard:

- ``full_shard_consolidated`` / ``full_storage_invariants``: ``check_shard`` (every
  readable time; every blob any live state references);
- ``full_state_matches_shard``: ``compare_state`` (every bucket's checkpoint against a
  full snapshot).

And ``error_rows_did_not_grow`` (WARN, with the ingest): the last ingest added rows to
the error collection. Error rows are data, so this warns and never blocks.

And ``landing_files_unchanged`` (non-blocking, with the ingest): fails naming every
landing file the last ingest found rewritten under a name the shard already ingested
(``upsert_core.ingest.ledger``: its size or content digest differs from the one recorded
with its name). Such a file is never ingested again, so the shard does not hold its new
content; the batches it did hold stay correct, so nothing is blocked.

A failing check lists what it found in its ``problems`` metadata (the first
:data:`MAX_SHOWN`); a passing one has no ``problems`` entry.
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
    MetadataValue,
    multi_asset_check,
)

from assets.metadata import PUBLISHED_UPPER, int_value, published_upper, run_ingest_metadata
from assets.spec import SourceSpec
from resources.stores import BlobStoreResource, ConsensusResource, open_shard
from upsert_core.errors import ShardNotFound, UpsertPlatformError
from upsert_core.ingest.ledger import rewritten_files
from upsert_core.ingest.verify import STATE as STATE_KIND
from upsert_core.ingest.verify import check_new_batch, compare_state
from upsert_core.persist.maintenance import check
from upsert_core.persist.maintenance.check import CheckReport, check_shard
from upsert_core.persist.shard import Shard

CONSOLIDATED = "shard_consolidated"
STORAGE = "storage_invariants"
STATE = "state_matches_shard"
ERRORS = "error_rows_did_not_grow"
REWRITTEN = "landing_files_unchanged"
BLOCKING_CHECKS = (CONSOLIDATED, STORAGE, STATE)
FULL_CONSOLIDATED = "full_shard_consolidated"
FULL_STORAGE = "full_storage_invariants"
FULL_STATE = "full_state_matches_shard"
FULL_CHECKS = (FULL_CONSOLIDATED, FULL_STORAGE, FULL_STATE)
MAX_SHOWN = 10
BATCH = "batch"


def full_check_keys(state_key: AssetKey) -> list[AssetCheckKey]:
    """The keys of the full-history checks (the ingest job leaves them out)."""
    return [AssetCheckKey(state_key, name) for name in FULL_CHECKS]


def _problems_md(problems: list[str]) -> MetadataValue:
    shown = problems[:MAX_SHOWN]
    more = [f"... and {len(problems) - MAX_SHOWN} more"] if len(problems) > MAX_SHOWN else []
    return MetadataValue.md("\n".join(f"- {p}" for p in [*shown, *more]))


def _problems(problems: list[str]) -> dict[str, MetadataValue]:
    """The ``problems`` entry of a check's metadata: only when there are some (on a
    passing check the UI would show an empty ``problems [Show Markdown]``)."""
    return {"problems": _problems_md(problems)} if problems else {}


def _split(report: CheckReport) -> tuple[list[str], list[str]]:
    return report.of_kind(check.CONSOLIDATION), report.of_kind(check.STORAGE)


def _run_metadata(context: AssetCheckExecutionContext, key: AssetKey) -> dict[str, Any]:
    """The metadata of the ingest's own materialization of ``key`` in this run, else of
    ``key``'s latest materialization."""
    found = run_ingest_metadata(context.instance, context.run.run_id, key)
    if found is None:
        event = context.instance.get_latest_materialization_event(key)
        materialization = None if event is None else event.asset_materialization
        found = None if materialization is None else materialization.metadata
    return {} if found is None else dict(found)



def _new_error_rows(context: AssetCheckExecutionContext, key: AssetKey, shard: Shard) -> tuple[
    int, int, int
]:
    """(error rows since the last ingest's start upper, total error rows, that upper)."""
    since = int_value(_run_metadata(context, key), "start_upper") or 0
    state = shard.state()
    new = sum(e.num_errors for e in state.errors if e.ts >= since)
    return new, state.num_errors(), since


def _run_range(
    context: AssetCheckExecutionContext, key: AssetKey, shard: Shard
) -> tuple[int | None, int, str]:
    """(the run's start_upper, the upper after its ingest, where they came from)."""
    meta = _run_metadata(context, key)
    start, upper = int_value(meta, "start_upper"), int_value(meta, "upper")
    if upper is not None:
        return start, upper, "the run's upsert_state materialization"
    shard_upper = shard.state().upper
    return None, shard_upper, "no materialization metadata: the shard's upper"


def next_step(shard_name: str) -> str:
    """What a user does about a failed blocking check."""
    return (f"run `upsertctl check --shard {shard_name}` for details; the files are"
            " applied (upsert_state) but not published (output_shard) until a run's"
            " blocking checks pass over them")


def verify_range(shard: Shard, start: int, upper: int) -> tuple[CheckReport, str]:
    """The blocking checks of ``[start, upper)`` and the method that decided them:
    ``batch`` (:func:`check_new_batch`), or ``full (<why>)`` when the batch method
    cannot verify the range (module docstring); problems of kind ``state`` then come
    from :func:`compare_state`."""
    since = shard.state().since
    why = None
    if start < since:
        why = (f"the range starts at ts {start}, before the shard's since {since}: GC"
               " compacted that history")
    else:
        try:
            report = check_new_batch(shard, start, upper)
        except UpsertPlatformError as exc:
            why = f"the batch check could not read [{start}, {upper}): {exc}"
        else:
            if not report.notes:
                return report, BATCH
            why = "; ".join(report.notes[:3]) + (
                f" (and {len(report.notes) - 3} more)" if len(report.notes) > 3 else "")
    try:
        full = check_shard(shard)
    except UpsertPlatformError as exc:
        full = CheckReport(shard_id=shard.shard_id)
        full.add(check.STORAGE, f"the full check cannot read the shard: {exc}")
        return full, f"full ({why})"
    compared = compare_state(shard)
    for problem in compared.problems:
        full.add(STATE_KIND, problem)
    if compared.rebuilt_buckets:
        full.notes.append(
            f"{len(compared.rebuilt_buckets)} bucket(s) whose checkpoint base lies before"
            " the shard's since were not compared (the next ingest rebuilds them from the"
            " shard, which check_shard verified)")
    full.counts.update(start_upper=start, upper=upper, state_keys=compared.state_keys,
                       live_keys=compared.live_keys, buckets=compared.buckets)
    return full, f"full ({why})"


def _blocking_results(
    context: AssetCheckExecutionContext, state_key: AssetKey, output_key: AssetKey,
    shard: Shard, shard_name: str,
) -> Iterator[AssetCheckResult]:
    run_start, upper, source = _run_range(context, state_key, shard)
    watermark = published_upper(context.instance, output_key)
    # Another run may have published past this run's upper meanwhile: nothing to add.
    start = min(watermark, upper)
    report, method = verify_range(shard, start, upper)
    consolidation, storage = _split(report)
    common = {
        "start_upper": MetadataValue.int(start),
        "upper": MetadataValue.int(upper),
        PUBLISHED_UPPER: MetadataValue.int(watermark),
        "method": MetadataValue.text(method),
        "range_from": MetadataValue.text(
            f"[{PUBLISHED_UPPER} of the latest output_shard materialization, upper of"
            f" {source})"),
        **{k: MetadataValue.int(v) for k, v in report.counts.items()
           if k not in ("start_upper", "upper")},
    }
    if run_start is not None:
        common["run_start_upper"] = MetadataValue.int(run_start)
    if report.notes:
        common["notes"] = _problems_md(report.notes)
    if method != BATCH:
        context.log.warning(f"blocking checks of [{start}, {upper}): {method}")
    for name, problems in ((CONSOLIDATED, consolidation), (STORAGE, storage),
                           (STATE, report.of_kind(STATE_KIND))):
        yield AssetCheckResult(
            check_name=name, asset_key=state_key, passed=not problems,
            description=None if not problems else
            f"{len(problems)} problem(s) in ts [{start}, {upper}): {next_step(shard_name)}",
            metadata={**_problems(problems), **common},
        )


def _full_description(problems: list[str], shard_name: str) -> str | None:
    if not problems:
        return None
    return (f"{len(problems)} problem(s) in the shard's history: run `upsertctl check"
            f" --shard {shard_name}` for details")


def _full_results(state_key: AssetKey, shard: Shard,
                  shard_name: str) -> Iterator[AssetCheckResult]:
    report = check_shard(shard)
    consolidation, storage = _split(report)
    counts = {k: MetadataValue.int(v) for k, v in report.counts.items()}
    yield AssetCheckResult(
        check_name=FULL_CONSOLIDATED, asset_key=state_key, passed=not consolidation,
        description=_full_description(consolidation, shard_name),
        metadata={**_problems(consolidation), **counts},
    )
    yield AssetCheckResult(
        check_name=FULL_STORAGE, asset_key=state_key, passed=not storage,
        description=_full_description(storage, shard_name),
        metadata={**_problems(storage), **counts},
    )
    compared = compare_state(shard)
    yield AssetCheckResult(
        check_name=FULL_STATE, asset_key=state_key, passed=compared.ok,
        description=_full_description(compared.problems, shard_name),
        metadata={
            **_problems(compared.problems),
            "upper": MetadataValue.int(compared.upper),
            "state_keys": MetadataValue.int(compared.state_keys),
            "live_keys": MetadataValue.int(compared.live_keys),
            "shard_rows": MetadataValue.int(compared.shard_rows),
            "checkpoint_bytes": MetadataValue.int(compared.checkpoint_bytes),
            "buckets": MetadataValue.int(compared.buckets),
        },
    )


def _rewritten_result(state_key: AssetKey, shard: Shard) -> AssetCheckResult:
    """``landing_files_unchanged``: what the last ingest found (module docstring)."""
    names = rewritten_files(shard.state().config)
    problems = [f"{name}: rewritten since it was ingested (size or content differs);"
                " not ingested again" for name in names]
    shown = ", ".join(names[:MAX_SHOWN]) + (" ..." if len(names) > MAX_SHOWN else "")
    return AssetCheckResult(
        check_name=REWRITTEN, asset_key=state_key, passed=not names,
        description=None if not names else
        f"{len(names)} landing file(s) rewritten under an ingested name: {shown}; the"
        " shard keeps what was ingested: land new content under new names",
        metadata={**_problems(problems), "rewritten_files": MetadataValue.json(names)},
    )


def build_checks(spec: SourceSpec, state_key: AssetKey,
                 output_key: AssetKey | None = None) -> AssetChecksDefinition:
    """The checks of one source's ``upsert_state`` (see the module docstring);
    ``output_key``: the source's ``output_shard``, whose materializations carry the
    published watermark."""
    output_key = output_key or AssetKey([*state_key.path[:-1], "output_shard"])

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
            AssetCheckSpec(REWRITTEN, asset=state_key, blocking=False,
                           description="no landing file was rewritten under a name the"
                           " shard already ingested (such a file is not ingested again)"),
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
            for result in _blocking_results(context, state_key, output_key, shard,
                                            spec.shard):
                if result.check_name in selected:
                    yield result
        if selected & set(FULL_CHECKS):
            for result in _full_results(state_key, shard, spec.shard):
                if result.check_name in selected:
                    yield result
        if REWRITTEN in selected:
            yield _rewritten_result(state_key, shard)
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
