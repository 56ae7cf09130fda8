"""Asset checks on a source's ``upsert_state`` (the asset whose run commits to the shard).

One ``multi_asset_check`` reads the shard once and reports four checks:

- ``shard_consolidated`` (blocking): at every readable time each row has multiplicity
  0 or 1 and each key at most one live row (``check_shard``'s consolidation pass, which
  covers the changes the run just committed);
- ``storage_invariants`` (blocking): the state versions are well formed and every blob
  a live state references exists (``check_shard``'s storage pass);
- ``state_matches_shard`` (blocking): the committed upsert state checkpoints equal the
  consolidated shard at its upper (:mod:`upsert_core.ingest.verify`);
- ``error_rows_did_not_grow`` (WARN): the last ingest added rows to the error
  collection. Error rows are data, so this warns and never blocks.

Blocking checks that fail with ERROR severity stop the downstream assets of the run
(``output_shard``), so a corrupt shard is never reported as published.
"""


from collections.abc import Iterator

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    MetadataValue,
    multi_asset_check,
)

from assets.spec import SourceSpec
from resources.stores import BlobStoreResource, ConsensusResource, open_shard
from upsert_core.errors import ShardNotFound
from upsert_core.ingest.verify import compare_state
from upsert_core.persist import check
from upsert_core.persist.check import CheckReport, check_shard
from upsert_core.persist.shard import Shard

CONSOLIDATED = "shard_consolidated"
STORAGE = "storage_invariants"
STATE = "state_matches_shard"
ERRORS = "error_rows_did_not_grow"
BLOCKING_CHECKS = (CONSOLIDATED, STORAGE, STATE)
MAX_SHOWN = 10


def _problems_md(problems: list[str]) -> MetadataValue:
    shown = problems[:MAX_SHOWN]
    more = [f"... and {len(problems) - MAX_SHOWN} more"] if len(problems) > MAX_SHOWN else []
    return MetadataValue.md("\n".join(f"- {p}" for p in [*shown, *more]) or "none")


def _split(report: CheckReport) -> tuple[list[str], list[str]]:
    return report.of_kind(check.CONSOLIDATION), report.of_kind(check.STORAGE)


def _new_error_rows(context: AssetCheckExecutionContext, key: AssetKey, shard: Shard) -> tuple[
    int, int, int
]:
    """(error rows since the last ingest's start upper, total error rows, that upper)."""
    event = context.instance.get_latest_materialization_event(key)
    since = 0
    materialization = None if event is None else event.asset_materialization
    if materialization is not None:
        value = materialization.metadata.get("start_upper")
        since = int(getattr(value, "value", 0) or 0)
    state = shard.state()
    new = sum(e.num_errors for e in state.errors if e.ts >= since)
    return new, state.num_errors(), since


def build_checks(spec: SourceSpec, state_key: AssetKey) -> AssetChecksDefinition:
    """The checks of one source's ``upsert_state`` (see the module docstring)."""

    @multi_asset_check(
        name=f"{spec.name}_shard_checks",
        specs=[
            AssetCheckSpec(CONSOLIDATED, asset=state_key, blocking=True,
                           description="changes consolidated; at most one live row per key"),
            AssetCheckSpec(STORAGE, asset=state_key, blocking=True,
                           description="state versions well formed; referenced blobs exist"),
            AssetCheckSpec(STATE, asset=state_key, blocking=True,
                           description="upsert state checkpoints equal the shard at its upper"),
            AssetCheckSpec(ERRORS, asset=state_key,
                           description="warns when the last ingest added error rows"),
        ],
    )
    def shard_checks(
        context: AssetCheckExecutionContext,
        consensus: ConsensusResource,
        blob_store: BlobStoreResource,
    ) -> Iterator[AssetCheckResult]:
        try:
            shard = open_shard(consensus, blob_store, spec.shard, create=False)
        except ShardNotFound:
            for name in (CONSOLIDATED, STORAGE, STATE, ERRORS):
                yield AssetCheckResult(
                    check_name=name, asset_key=state_key, passed=True,
                    metadata={"note": MetadataValue.text("the shard does not exist yet")},
                )
            return
        report = check_shard(shard)
        consolidation, storage = _split(report)
        counts = {k: MetadataValue.int(v) for k, v in report.counts.items()}
        yield AssetCheckResult(
            check_name=CONSOLIDATED, asset_key=state_key, passed=not consolidation,
            metadata={"problems": _problems_md(consolidation), **counts},
        )
        yield AssetCheckResult(
            check_name=STORAGE, asset_key=state_key, passed=not storage,
            metadata={"problems": _problems_md(storage), **counts},
        )
        compared = compare_state(shard)
        yield AssetCheckResult(
            check_name=STATE, asset_key=state_key, passed=compared.ok,
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
