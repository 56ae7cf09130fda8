"""The non-blocking asset check ``value_checks_passed`` on a source's ``upsert_state``.

The ingest runs the source's value checks (``sources.yaml`` ``checks:``; pandera, see
:mod:`upsert_core.landing.value_checks`) on every batch and turns failing rows into
error rows. This check reports what the last ingest run did with them: how many error
rows of the run come from value checks, and which checks failed most.

Invariants:

- Severity WARN, never blocking: failing rows are data (CONTRACT.md, "Bad input"); they
  are in the error collection and the good rows are published, so ``output_shard``
  always runs. It passes when the run added no value-check error row.
- It reads only the error parts committed by the run (``ts >= start_upper`` of the
  run's ``upsert_state`` materialization, else the last ts), so its cost follows the
  run's errors, not the shard's history.
- Built only for sources that declare checks: a source without ``checks:`` has nothing
  to report and gets no extra check.
"""

from collections import Counter

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetKey,
    MetadataValue,
    asset_check,
)

from assets.metadata import int_value, run_ingest_metadata
from assets.spec import SourceSpec
from resources.stores import BlobStoreResource, ConsensusResource, open_shard
from upsert_core.errors import ShardNotFound
from upsert_core.landing import failed_checks
from upsert_core.persist.shard import Shard
from upsert_core.persist.write.parts import read_error_part

VALUE_CHECKS = "value_checks_passed"
TOP = 10


def _start_upper(context: AssetCheckExecutionContext, key: AssetKey, shard: Shard) -> int:
    """``start_upper`` of this run's ingest materialization of ``key`` (the one that has
    it; the run also logs bare materializations of other partitions), else the last ts."""
    found = run_ingest_metadata(context.instance, context.run.run_id, key)
    value = None if found is None else int_value(found, "start_upper")
    return max(0, shard.state().upper - 1) if value is None else value


def value_check_counts(shard: Shard, since: int) -> tuple[int, int, Counter[str]]:
    """(value-check error rows, all error rows, failures per check) committed at
    ``ts >= since``."""
    rows = total = 0
    per_check: Counter[str] = Counter()
    for batch in shard.state().errors:
        if batch.ts < since:
            continue
        table = read_error_part(shard.blob, batch.part, shard=shard.shard_id)
        total += table.num_rows
        for reason in table.column("reason").to_pylist():
            names = failed_checks(reason or "")
            if names:
                rows += 1
                per_check.update(names)
    return rows, total, per_check


def build_value_checks(spec: SourceSpec, state_key: AssetKey) -> AssetChecksDefinition | None:
    """The value-check report of ``spec`` (None when it declares no checks)."""
    if not spec.checks:
        return None
    declared = sorted({f"{c.column} {c.describe()}" for c in spec.checks})

    @asset_check(
        asset=state_key, name=VALUE_CHECKS, blocking=False,
        description="warns when the last ingest turned rows into error rows because they"
        f" failed the source's value checks: {', '.join(declared)}",
    )
    def value_checks_passed(
        context: AssetCheckExecutionContext,
        consensus: ConsensusResource,
        blob_store: BlobStoreResource,
    ) -> AssetCheckResult:
        try:
            shard = open_shard(consensus, blob_store, spec.shard, create=False)
        except ShardNotFound:
            return AssetCheckResult(
                passed=True, severity=AssetCheckSeverity.WARN,
                metadata={"note": MetadataValue.text("the shard does not exist yet")},
            )
        since = _start_upper(context, state_key, shard)
        rows, total, per_check = value_check_counts(shard, since)
        top = per_check.most_common(TOP)
        return AssetCheckResult(
            passed=rows == 0,
            severity=AssetCheckSeverity.WARN,
            description=None if rows == 0 else
            f"{rows} row(s) failed value checks since ts {since}; most: {top[0][0]}",
            metadata={
                "value_check_error_rows": MetadataValue.int(rows),
                "error_rows_in_run": MetadataValue.int(total),
                "since_ts": MetadataValue.int(since),
                "top_failing_checks": MetadataValue.md(
                    "\n".join(f"- `{name}`: {n}" for name, n in top) or "none"
                ),
                "declared_checks": MetadataValue.json(declared),
            },
        )

    return value_checks_passed
