"""Asset checks: a run whose own batch is corrupt fails the blocking (batch-scoped)
checks and stops output_shard; damage outside the run's batch is the full-history
checks' business, which run in their own job and never block; new error rows only
warn."""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa
import pytest
from dagster import AssetCheckSeverity, DefaultScheduleStatus

from assets.checks import BLOCKING_CHECKS, FULL_CHECKS
from tests.dagster.helpers import Platform
from upsert_core.ingest import tasks
from upsert_core.persist.consolidate import UPDATE_SCHEMA


def _run(plat: Platform, partition: str | None, job: str = "feed_ingest"):  # type: ignore[no-untyped-def]
    spec = plat.spec()
    built, defs = plat.build(spec)
    result = defs.resolve_job_def(job).execute_in_process(
        partition_key=partition, instance=plat.instance, raise_on_error=False
    )
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    materialized = {e.asset_key for e in result.get_asset_materialization_events()}
    return built, result, checks, materialized


def _ingest_first_two(plat: Platform) -> list[str]:
    names = plat.write_batches(["b-01.jsonl", "b-02.jsonl", "b-03.jsonl"])
    plat.add_partitions(plat.spec(), names)
    built, result, checks, _ = _run(plat, names[1])
    assert result.success and all(c.passed for c in checks.values())
    assert set(checks) == {*BLOCKING_CHECKS, "error_rows_did_not_grow"}
    assert checks["state_matches_shard"].metadata["touched_buckets"].value > 0
    return names


def _problems(check: Any) -> str:
    return str(check.metadata["problems"].value)


def test_a_run_whose_changes_do_not_consolidate_is_blocked(
    plat: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = _ingest_first_two(plat)
    drain = tasks.drain_to_upper

    def doubled(*args: Any, **kwargs: Any) -> Any:
        out = drain(*args, **kwargs)
        updates = out.updates
        index = updates.schema.get_field_index("diff")
        diffs = pa.compute.multiply(updates.column("diff"), 2)
        return dataclasses.replace(out, updates=updates.set_column(index, "diff", diffs))

    monkeypatch.setattr(tasks, "drain_to_upper", doubled)
    built, result, checks, materialized = _run(plat, names[2])
    assert not result.success
    assert checks["shard_consolidated"].passed is False
    assert "must be +1 or -1" in _problems(checks["shard_consolidated"])
    assert checks["storage_invariants"].passed is True
    assert checks["shard_consolidated"].metadata["start_upper"].value == 2
    assert built.key("upsert_state") in materialized
    assert built.key("output_shard") not in materialized


def test_a_run_whose_checkpoint_is_lost_is_blocked(
    plat: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = _ingest_first_two(plat)
    write = tasks.write_checkpoint
    lost: list[str] = []

    def write_then_lose(blob: Any, *args: Any) -> tuple[str, int]:
        key, size = write(blob, *args)
        blob.delete(key)
        lost.append(key)
        return key, size

    monkeypatch.setattr(tasks, "write_checkpoint", write_then_lose)
    built, result, checks, materialized = _run(plat, names[2])
    assert lost and not result.success
    assert checks["state_matches_shard"].passed is False
    assert lost[0] in _problems(checks["state_matches_shard"])
    assert checks["shard_consolidated"].passed is True
    assert built.key("output_shard") not in materialized


def test_full_checks_run_in_their_own_job_and_never_block(plat: Platform) -> None:
    names = _ingest_first_two(plat)
    shard = plat.shard()
    live = shard.snapshot_table().to_pylist()[0]
    # A second live row for an existing key, appended behind the ingest's back.
    upper = shard.state().upper
    bad = pa.Table.from_pylist(
        [{"key": live["key"], "row": live["row"] + b"x", "ts": upper, "diff": 1}],
        schema=UPDATE_SCHEMA,
    )
    assert shard.append(bad, upper).committed

    # A no-op ingest commits nothing, but its blocking checks cover everything after
    # the published watermark (2), the foreign batch included: blocked, not published.
    built, result, checks, materialized = _run(plat, names[0])
    assert not result.success and not set(checks) & set(FULL_CHECKS)
    meta = checks["state_matches_shard"].metadata
    assert (meta["start_upper"].value, meta["upper"].value) == (2, 3)
    assert checks["state_matches_shard"].passed is False
    assert "something other than the ingest" in _problems(checks["state_matches_shard"])
    assert "upsertctl check --shard feed" in str(checks["state_matches_shard"].description)
    assert built.key("output_shard") not in materialized

    built, result, checks, materialized = _run(plat, None, job="feed_full_check")
    assert set(checks) == set(FULL_CHECKS)
    assert result.success and not materialized  # non-blocking; no asset runs
    assert checks["full_shard_consolidated"].passed is False
    assert "live rows at ts" in _problems(checks["full_shard_consolidated"])
    assert checks["full_state_matches_shard"].passed is False
    assert checks["full_storage_invariants"].passed is True

    _, defs = plat.build(plat.spec())
    specs = {s.name: s for d in defs.asset_checks or [] for s in d.check_specs}
    assert {n: specs[n].blocking for n in (*BLOCKING_CHECKS, *FULL_CHECKS)} == {
        **dict.fromkeys(BLOCKING_CHECKS, True), **dict.fromkeys(FULL_CHECKS, False)
    }
    schedule = defs.resolve_schedule_def("feed_full_check_schedule")
    assert schedule.job_name == "feed_full_check"
    assert schedule.default_status == DefaultScheduleStatus.STOPPED


def test_new_error_rows_warn_without_blocking(plat: Platform) -> None:
    names = plat.write_batches(["b-01.jsonl", "b-02.jsonl", "b-03.jsonl"])
    plat.add_partitions(plat.spec(), names)
    built, result, checks, materialized = _run(plat, names[1])
    assert checks["error_rows_did_not_grow"].passed is True

    built, result, checks, materialized = _run(plat, names[2])  # b-03 has a null key
    assert result.success
    warn = checks["error_rows_did_not_grow"]
    assert warn.passed is False and warn.severity == AssetCheckSeverity.WARN
    assert warn.metadata["new_error_rows"].value == 1
    assert warn.metadata["since_ts"].value == 2
    assert checks["storage_invariants"].metadata["new_error_parts"].value == 1
    assert built.key("output_shard") in materialized
