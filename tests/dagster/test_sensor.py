"""The landing sensor: run requests with run keys, dynamic partitions (in arrival order),
its cursor (the greatest name handled, and what it saw of the files it requested), a
fixed file requested again once per change after its partition failed, and runless
upsert_state (applied) materializations of files the shard already holds; it never
publishes (output_shard) a file no blocking check covered."""

from __future__ import annotations

import json
from typing import Any

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


def _runs(result: SensorResult | SkipReason) -> list[tuple[str, str]]:
    if isinstance(result, SkipReason):
        return []
    return [(r.run_key, r.partition_key) for r in result.run_requests or []]


def _skip(result: SensorResult | SkipReason) -> str | None:
    """The skip message of a tick that requested and reported nothing (it may still
    store a cursor), else None."""
    if isinstance(result, SkipReason):
        return result.skip_message
    if result.run_requests or result.asset_events or result.dynamic_partitions_requests:
        return None
    return None if result.skip_reason is None else result.skip_reason.skip_message


def _cursor(result: SensorResult | SkipReason, before: str | None) -> str | None:
    """The cursor after the tick (the daemon keeps the old one if none is returned)."""
    cursor = result.cursor if isinstance(result, SensorResult) else None
    return before if cursor is None else cursor


def _after(cursor: str | None) -> str:
    return str(json.loads(cursor or "{}")["after"])


def _seen(cursor: str | None) -> dict[str, Any]:
    return dict(json.loads(cursor or "{}")["seen"])


def test_new_files_become_partitions_and_runs_with_a_cursor(plat: Platform) -> None:
    spec = plat.spec()
    plat.write_batches(["b-02.jsonl", "b-03.jsonl"])
    first = _tick(plat, spec, None)
    assert isinstance(first, SensorResult)
    assert _runs(first) == [("b-02.jsonl", "b-02.jsonl"), ("b-03.jsonl", "b-03.jsonl")]
    assert [list(r.partition_keys) for r in first.dynamic_partitions_requests] == [
        ["b-02.jsonl", "b-03.jsonl"]
    ]
    assert _after(first.cursor) == "b-03.jsonl"
    assert set(_seen(first.cursor)) == {"b-02.jsonl", "b-03.jsonl"}
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
    assert _after(third.cursor) == "b-05.jsonl"


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
    assert _after(result.cursor) == "b-03.jsonl"
    assert set(_seen(result.cursor)) == {"b-03.jsonl"}  # only files not in the shard

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
    assert _skip(_tick(plat, spec, result.cursor))

    # A later CLI ingest of b-03 (whose partition exists): reported once, no run.
    ingest(plat.shard(), str(plat.landing), spec.request())
    later = _tick(plat, spec, result.cursor)
    assert isinstance(later, SensorResult) and not later.run_requests
    assert sorted((e.asset_key.path[-1], e.partition, e.metadata["ts"].value)
                  for e in later.asset_events) == [("upsert_state", "b-03.jsonl", 2)]
    assert _seen(later.cursor) == {}  # b-03 is in the shard: its record is dropped
    assert _skip(_tick(plat, spec, later.cursor))

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


#: a file refused whole: it has no key column
BAD = '{"offset": 1}\n'


def _ingest_run(plat: Platform, spec, partition: str):  # type: ignore[no-untyped-def]
    """Run the ingest job for one partition, as the run the sensor requested would."""
    _, defs = plat.build(spec)
    return defs.resolve_job_def("feed_ingest").execute_in_process(
        partition_key=partition, instance=plat.instance, raise_on_error=False)


def test_a_fixed_file_is_requested_again_once_per_change(plat: Platform) -> None:
    spec = plat.spec()
    names = ["b-01.jsonl", "b-02.jsonl", "b-03.jsonl"]
    plat.write_batches([names[0], names[2]])
    (plat.landing / names[1]).write_text(BAD)
    first = _tick(plat, spec, None)
    assert _runs(first) == [(n, n) for n in names]
    for name in names:  # b-01 goes in; b-02 fails on itself, b-03 on b-02 (before it)
        assert _ingest_run(plat, spec, name).success == (name == names[0])
    assert dict(plat.shard().state().ingested_files) == {names[0]: 0}

    # Nothing changed: the skip reason names the failed partitions.
    waiting = _tick(plat, spec, first.cursor)
    assert _skip(waiting) == (
        f"no new files in {plat.landing} (3 listed); 2 failed partition(s) waiting for a"
        " fixed file: b-02.jsonl, b-03.jsonl")
    cursor = _cursor(waiting, first.cursor)

    # The user replaces b-02 with a fixed file of the same name: b-02 is requested
    # again under a new run key, and so is b-03, which failed on it.
    write_jsonl(plat.landing / names[1], BATCHES[names[1]])
    fixed = _tick(plat, spec, cursor)
    assert isinstance(fixed, SensorResult)
    runs = _runs(fixed)
    assert [p for _, p in runs] == names[1:]
    assert all(key.startswith(f"{p}@") for key, p in runs)
    assert not {key for key, _ in runs} & {key for key, _ in _runs(first)}
    assert _after(fixed.cursor) == "b-03.jsonl"
    assert _seen(fixed.cursor)[names[1]]["size"] == (plat.landing / names[1]).stat().st_size

    # Exactly once per change: the next tick requests nothing.
    assert not _runs(_tick(plat, spec, fixed.cursor))

    for name in names[1:]:
        assert _ingest_run(plat, spec, name).success
    done = _tick(plat, spec, fixed.cursor)
    assert _skip(done) == f"no new files in {plat.landing} (3 listed)"
    assert _seen(_cursor(done, fixed.cursor)) == {}  # only files not in the shard are kept

    # A file the shard holds is never requested again, whatever happens to it.
    (plat.landing / names[1]).write_text(BAD)
    assert _skip(_tick(plat, spec, _cursor(done, fixed.cursor)))


def test_an_old_cursor_is_accepted_and_upgraded(plat: Platform) -> None:
    spec = plat.spec()
    plat.write_batches(["b-01.jsonl"])
    (plat.landing / "b-02.jsonl").write_text(BAD)
    plat.add_partitions(spec, ["b-01.jsonl", "b-02.jsonl"])  # by the sensor before
    assert not _ingest_run(plat, spec, "b-02.jsonl").success
    plat.write_batches(["b-03.jsonl"])

    # Today's cursor is the greatest name handled, a plain string.
    result = _tick(plat, spec, "b-02.jsonl")
    assert isinstance(result, SensorResult)
    assert _runs(result) == [("b-03.jsonl", "b-03.jsonl")]
    assert _after(result.cursor) == "b-03.jsonl"
    # b-02 failed before the sensor kept records: what it is now is the baseline.
    assert set(_seen(result.cursor)) == {"b-02.jsonl", "b-03.jsonl"}
    assert not _runs(_tick(plat, spec, result.cursor))

    write_jsonl(plat.landing / "b-02.jsonl", BATCHES["b-02.jsonl"])
    again = _tick(plat, spec, result.cursor)
    assert isinstance(again, SensorResult)
    assert [p for _, p in _runs(again)] == ["b-02.jsonl"]  # b-03 has not failed


def test_a_late_file_is_listed_after_the_later_names(plat: Platform) -> None:
    """Dynamic partitions keep the order they were added in, which is what the instance
    (and so the UI) lists: a late file appears after the names already there."""
    spec = plat.spec()
    plat.write_batches(["b-03.jsonl", "b-02.jsonl"])
    first = _tick(plat, spec, None)
    plat.write_batches(["b-04.jsonl", "b-01.jsonl"])
    second = _tick(plat, spec, first.cursor)  # type: ignore[union-attr]
    assert isinstance(second, SensorResult)
    arrival = ["b-02.jsonl", "b-03.jsonl", "b-01.jsonl", "b-04.jsonl"]
    assert plat.instance.get_dynamic_partitions(spec.partitions_name) == arrival
    built, _ = plat.build(spec)
    assert built.partitions.get_partition_keys(dynamic_partitions_store=plat.instance) == arrival


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
    assert _after(first.cursor) == "b-02.jsonl"
    assert all(record["version"] for record in _seen(first.cursor).values())  # ETags
    assert isinstance(_tick(plat, spec, first.cursor), SkipReason)

    # The run the sensor requested ingests straight from S3.
    _, defs = plat.build(spec)
    run = defs.resolve_job_def("feed_ingest").execute_in_process(
        partition_key="b-02.jsonl", instance=plat.instance
    )
    assert run.success
    assert dict(plat.shard().state().ingested_files) == {"b-01.jsonl": 0, "b-02.jsonl": 1}
