"""Asset checks: a corrupted shard fails the blocking checks and stops output_shard;
new error rows only warn."""

from __future__ import annotations

import pyarrow as pa
from dagster import AssetCheckSeverity

from tests.dagster.helpers import Platform
from upsert_core.persist.consolidate import UPDATE_SCHEMA


def _run(plat: Platform, partition: str):  # type: ignore[no-untyped-def]
    spec = plat.spec()
    built, defs = plat.build(spec)
    result = defs.resolve_job_def("feed_ingest").execute_in_process(
        partition_key=partition, instance=plat.instance, raise_on_error=False
    )
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    materialized = {e.asset_key for e in result.get_asset_materialization_events()}
    return built, result, checks, materialized


def _ingest_two(plat: Platform) -> list[str]:
    names = plat.write_batches(["b-01.jsonl", "b-02.jsonl"])
    plat.add_partitions(plat.spec(), names)
    built, result, checks, _ = _run(plat, names[1])
    assert result.success and all(c.passed for c in checks.values())
    return names


def test_duplicate_live_row_fails_blocking_checks_and_stops_output(plat: Platform) -> None:
    names = _ingest_two(plat)
    shard = plat.shard()
    live = shard.snapshot_table().to_pylist()[0]
    # A second live row for an existing key, appended behind the ingest's back.
    upper = shard.state().upper
    bad = pa.Table.from_pylist(
        [{"key": live["key"], "row": live["row"] + b"x", "ts": upper, "diff": 1}],
        schema=UPDATE_SCHEMA,
    )
    assert shard.append(bad, upper).committed

    built, result, checks, materialized = _run(plat, names[0])  # a no-op ingest
    assert not result.success
    assert checks["shard_consolidated"].passed is False
    assert "live rows at ts" in str(checks["shard_consolidated"].metadata["problems"].value)
    assert checks["state_matches_shard"].passed is False
    assert checks["storage_invariants"].passed is True
    assert built.key("upsert_state") in materialized
    assert built.key("output_shard") not in materialized


def test_missing_blob_fails_storage_invariants(plat: Platform) -> None:
    names = _ingest_two(plat)
    shard = plat.shard()
    # Small batches are inline; the upsert state checkpoints are referenced blobs.
    refs = sorted(shard.state().referenced_blob_keys())
    lost = next(k for k in refs if "/checkpoint/" in k)
    shard.blob.delete(lost)

    built, result, checks, materialized = _run(plat, names[0])
    assert not result.success
    assert checks["storage_invariants"].passed is False
    assert lost in str(checks["storage_invariants"].metadata["problems"].value)
    assert checks["state_matches_shard"].passed is False
    assert built.key("output_shard") not in materialized


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
    assert built.key("output_shard") in materialized
