"""The landing sensor: run requests with run keys, dynamic partitions, its cursor, and
runless upsert_state (applied) materializations of files the shard already holds; it
never publishes (output_shard) a file no blocking check covered."""

from __future__ import annotations

import boto3
import pytest
from dagster import AssetKey, SensorResult, SkipReason, build_sensor_context

from orchestration.jobs import ingest_job
from orchestration.sensors import landing_sensor
from tests.dagster.helpers import BATCHES, Platform, write_jsonl
from tests.dagster.test_checks import blocked_b02
from tests.services import AWS_TEST_CREDENTIALS
from upsert_core.errors import IngestError
from upsert_core.ingest import ingest


def _tick(plat: Platform, spec, cursor: str | None):  # type: ignore[no-untyped-def]
    built, _ = plat.build(spec)
    sensor = landing_sensor(built, ingest_job(built))
    resources = plat.resources()
    context = build_sensor_context(
        instance=plat.instance, cursor=cursor,
        resources={"consensus": resources["consensus"], "blob_store": resources["blob_store"]},
    )
    result = sensor(context)
    if isinstance(result, SensorResult):
        # The daemon stores the asset events, then applies partition requests; do the same.
        for event in result.asset_events or []:
            plat.instance.report_runless_asset_event(event)
        for request in result.dynamic_partitions_requests or []:
            plat.instance.add_dynamic_partitions(request.partitions_def_name,
                                                 list(request.partition_keys))
    return result


def _runs(result: SensorResult) -> list[tuple[str, str]]:
    return [(r.run_key, r.partition_key) for r in result.run_requests or []]


def test_new_files_become_partitions_and_runs_with_a_cursor(plat: Platform) -> None:
    spec = plat.spec()
    plat.write_batches(["b-02.jsonl", "b-03.jsonl"])
    first = _tick(plat, spec, None)
    assert isinstance(first, SensorResult)
    assert _runs(first) == [("b-02.jsonl", "b-02.jsonl"), ("b-03.jsonl", "b-03.jsonl")]
    assert [list(r.partition_keys) for r in first.dynamic_partitions_requests] == [
        ["b-02.jsonl", "b-03.jsonl"]
    ]
    assert first.cursor == "b-03.jsonl"
    assert set(plat.instance.get_dynamic_partitions(spec.partitions_name)) == {
        "b-02.jsonl", "b-03.jsonl"
    }

    again = _tick(plat, spec, first.cursor)
    assert isinstance(again, SkipReason)

    # A new file after the cursor and a late one sorting before it: both are handled.
    plat.write_batches(["b-05.jsonl", "b-01.jsonl"])
    third = _tick(plat, spec, first.cursor)
    assert isinstance(third, SensorResult)
    assert _runs(third) == [("b-01.jsonl", "b-01.jsonl"), ("b-05.jsonl", "b-05.jsonl")]
    assert third.cursor == "b-05.jsonl"


def test_files_already_in_the_shard_get_partitions_but_no_runs(plat: Platform) -> None:
    spec = plat.spec()
    plat.write_batches(["b-01.jsonl", "b-02.jsonl"])
    ingest(plat.shard(), str(plat.landing), spec.request())  # e.g. by `upsertctl ingest`
    plat.write_batches(["b-03.jsonl"])

    result = _tick(plat, spec, None)
    assert isinstance(result, SensorResult)
    assert _runs(result) == [("b-03.jsonl", "b-03.jsonl")]
    assert list(result.dynamic_partitions_requests[0].partition_keys) == [
        "b-01.jsonl", "b-02.jsonl", "b-03.jsonl"
    ]
    assert result.cursor == "b-03.jsonl"

    # ... and they show as applied (upsert_state materialized), with the ts they went in
    # at; not as published (output_shard): no blocking check has covered them yet.
    events = {(e.asset_key.path[-1], e.partition): e.metadata for e in result.asset_events}
    assert set(events) == {("upsert_state", n) for n in ("b-01.jsonl", "b-02.jsonl")}
    for (_, name), meta in events.items():
        assert meta["ts"].value == int(name[3]) - 1
        assert "sensor" in str(meta["applied_by"].value)
    state, output = AssetKey(["feed", "upsert_state"]), AssetKey(["feed", "output_shard"])
    assert plat.instance.get_materialized_partitions(state) == {"b-01.jsonl", "b-02.jsonl"}
    assert not plat.instance.get_materialized_partitions(output)

    # Nothing new and nothing unreported: a skip, no events again.
    assert isinstance(_tick(plat, spec, result.cursor), SkipReason)

    # A later CLI ingest of b-03 (whose partition exists): reported once, no run.
    ingest(plat.shard(), str(plat.landing), spec.request())
    later = _tick(plat, spec, result.cursor)
    assert isinstance(later, SensorResult) and not later.run_requests
    assert sorted((e.asset_key.path[-1], e.partition, e.metadata["ts"].value)
                  for e in later.asset_events) == [("upsert_state", "b-03.jsonl", 2)]
    assert isinstance(_tick(plat, spec, result.cursor), SkipReason)

    # The first ingest run's blocking checks cover the whole history (no published
    # watermark yet) and publish every file they covered.
    _, defs = plat.build(spec)
    run = defs.resolve_job_def("feed_ingest").execute_in_process(
        partition_key="b-03.jsonl", instance=plat.instance)
    checks = {e.check_name: e for e in run.get_asset_check_evaluations()}
    assert run.success and checks["shard_consolidated"].metadata["start_upper"].value == 0
    assert plat.instance.get_materialized_partitions(output) == {
        "b-01.jsonl", "b-02.jsonl", "b-03.jsonl"}


def test_the_sensor_never_publishes_a_blocked_batch(
    plat: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    built, out = blocked_b02(plat, monkeypatch)
    ingest(plat.shard(), str(plat.landing), plat.spec().request())  # b-03, by the CLI
    result = _tick(plat, plat.spec(), "b-03.jsonl")
    assert isinstance(result, SensorResult)
    assert {(e.asset_key.path[-1], e.partition) for e in result.asset_events} == {
        ("upsert_state", "b-03.jsonl")}
    assert plat.instance.get_materialized_partitions(out) == {"b-01.jsonl"}


def test_unlistable_landing_fails_the_tick(plat: Platform) -> None:
    spec = plat.spec()  # the landing directory does not exist yet
    with pytest.raises(IngestError, match="cannot list .*landing directory does not exist"):
        _tick(plat, spec, "b-01.jsonl")


@pytest.mark.s3
def test_s3_landing(plat: Platform, s3_env: str, s3_bucket: str) -> None:
    client = boto3.client("s3", endpoint_url=s3_env, **AWS_TEST_CREDENTIALS)
    local = plat.root / "upload"
    for name in ("b-01.jsonl", "b-02.jsonl"):
        write_jsonl(local / name, BATCHES[name])
        client.upload_file(str(local / name), s3_bucket, f"feeds/orders/{name}")
    spec = plat.spec()
    spec = type(spec)(name="feed", landing=f"s3://{s3_bucket}/feeds/orders", shard="feed")

    first = _tick(plat, spec, None)
    assert isinstance(first, SensorResult)
    assert _runs(first) == [("b-01.jsonl", "b-01.jsonl"), ("b-02.jsonl", "b-02.jsonl")]
    assert first.cursor == "b-02.jsonl"
    assert isinstance(_tick(plat, spec, first.cursor), SkipReason)

    # The run the sensor requested ingests straight from S3.
    _, defs = plat.build(spec)
    run = defs.resolve_job_def("feed_ingest").execute_in_process(
        partition_key="b-02.jsonl", instance=plat.instance
    )
    assert run.success
    assert dict(plat.shard().state().ingested_files) == {"b-01.jsonl": 0, "b-02.jsonl": 1}
