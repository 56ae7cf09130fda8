"""Each asset materializes in-process on temporary embedded storage, with its metadata."""

from __future__ import annotations

import os

import pytest
from dagster import AssetKey, materialize

from orchestration.backfill import failure_message
from orchestration.definitions import build_definitions
from resources.spark import SparkResource
from tests.dagster.helpers import Platform, shard_contents
from upsert_core.ingest import InProcessEngine, ingest
from upsert_core.persist.keys import host_id, writer_of
from upsert_core.persist.location.urls import open_consensus
from upsert_core.persist.testing import typed_parts
from upsert_core.shard_table import ShardTable
from upsert_core.stores import shard_names


def _meta(result, key: AssetKey, partition: str | None = None) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """The metadata of ``key``'s materialization of ``partition`` (default: the run's)."""
    partition = partition or result.dagster_run.tags.get("dagster/partition")
    events = [e for e in result.get_asset_materialization_events()
              if e.asset_key == key and e.partition == partition]
    assert len(events) == 1, f"{key} {partition} materialized {len(events)} times"
    return {k: v.value for k, v in events[0].materialization.metadata.items()}


def test_partition_run_applies_pending_files_through_it(plat: Platform) -> None:
    names = plat.write_batches()
    spec = plat.spec()
    built, _ = plat.build(spec)
    plat.add_partitions(spec, names)

    result = materialize(
        [*built.assets, built.checks],
        selection=list(built.ingest_keys),
        partition_key=names[2],
        instance=plat.instance,
        resources=plat.resources(),
    )
    assert result.success
    snap = _meta(result, built.key("source_snapshot"))
    assert snap["file"] == names[2]
    assert snap["pending_files"] == names[:3]
    assert snap["already_ingested"] is False

    state = _meta(result, built.key("upsert_state"))
    assert state["status"] == f"applied 3 file(s) through {names[2]}"
    assert state["files"] == names[:3]
    assert (state["start_upper"], state["upper"]) == (0, 3)
    assert state["engine"] == "local"
    # Each partition's event carries its own file's figures, never the run's totals
    # (issue 23: a 3-file backfill plotted as 3x the volume).
    per_file = [_meta(result, built.key("upsert_state"), name) for name in names[:3]]
    assert [m["rows_read"] for m in per_file] == [4, 3, 3]  # the bad row included
    assert sum(int(m["errors"]) for m in per_file) == 1  # type: ignore[call-overload]
    assert sum(int(m["inserts"]) for m in per_file) > 0  # type: ignore[call-overload]
    assert sum(int(m["retractions"]) for m in per_file) > 0  # type: ignore[call-overload]
    assert all(int(m["bytes_written"]) > 0 for m in per_file)  # type: ignore[call-overload]
    # ... and no count of the run, which Dagster would copy onto every partition (issue
    # 23: the UI plotted files_applied 3 on each of 3 partitions).
    for m in [*per_file, snap]:
        assert not {"files_applied", "partitions", "pending_through"} & set(m), m

    assert (state["ts"], state["applied_by"]) == (2, "this run")
    assert state["partition_status"] == "applied at ts 2"
    # The earlier files this run applied are shown materialized too, each with its ts.
    for key in (built.key("upsert_state"), built.key("output_shard")):
        for ts, name in enumerate(names[:2]):
            earlier = _meta(result, key, name)
            assert earlier["ts"] == ts, (key, name)
            assert earlier["applied_by"] == "this run"
            if key == built.key("output_shard"):  # published: its checks covered [0, 3)
                assert earlier["published_upper"] == 3
        assert plat.instance.get_materialized_partitions(key) == set(names[:3])

    out = _meta(result, built.key("output_shard"))
    assert out["upper"] == 3 and out["ingested_files"] == 3 and out["error_rows"] == 1
    assert out["published_upper"] == 3 and out["applied_by"] == "this run"
    assert out["last_file"] == names[2]
    columns = [(c.name, c.type) for c in out["dagster/column_schema"].columns]  # type: ignore[attr-defined]
    shard_schema = ShardTable(plat.shard(spec.shard)).source_schema()
    assert shard_schema is not None  # one vocabulary: upsertctl inspect's type names
    assert columns == [(n, str(t)) for n, t in shard_schema.columns] and len(columns) >= 3
    assert ShardTable(plat.shard(spec.shard)).inspect()["columns"] == dict(columns)
    snapshot_rows = ShardTable(plat.shard(spec.shard)).snapshot().num_rows
    assert out["dagster/row_count"] == snapshot_rows > 0
    assert out["live_rows"] == snapshot_rows  # as upsertctl inspect shows it

    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    # (materialize() of the assets runs all their checks; the full ones pass too.)
    assert {n: c.passed for n, c in checks.items() if not n.startswith("full_")} == {
        "shard_consolidated": True,
        "storage_invariants": True,
        "state_matches_shard": True,
        "error_rows_did_not_grow": False,  # b-03 has a null key: a WARN, not a block
        "landing_files_unchanged": True,
    }

    # The run named its blobs after its process (a killed run's leftovers are then
    # provably abandoned), and logged each file it applied.
    keys = [m.key for m in plat.shard(spec.shard).blob.list_keys(f"{spec.shard}/")]
    assert keys and all(writer_of(k) == (host_id(), os.getpid()) for k in keys), keys
    logged = [e.user_message for e in plat.instance.all_logs(result.run_id)]
    for i, name in enumerate(names[:3], 1):
        assert any(f"[{i}/3] {name}: ts {i - 1}" in m for m in logged), name

    # The same three files ingested by the pipeline directly give the same shard.
    ref = plat.shard("ref", stores="ref")
    for name in names[3:]:
        (plat.landing / name).rename(plat.root / name)
    ingest(ref, str(plat.landing), spec.request(), engine=InProcessEngine())
    got = shard_contents(plat.shard(spec.shard))
    assert got == shard_contents(ref)


class _NoEngine(SparkResource):
    def ingest_engine(self):  # type: ignore[no-untyped-def]
        raise AssertionError("an engine was made for a run with nothing pending")


def test_already_ingested_partition_is_a_no_op(plat: Platform) -> None:
    names = plat.write_batches(["b-01.jsonl", "b-02.jsonl"])
    spec = plat.spec()
    built, defs = plat.build(spec)
    plat.add_partitions(spec, names)
    job = defs.resolve_job_def("feed_ingest")
    assert job.execute_in_process(partition_key=names[1], instance=plat.instance).success
    before = plat.shard().state()

    # No engine is made (no Spark session starts) for a run with nothing pending.
    no_engine = build_definitions([spec], {**plat.resources(), "spark": _NoEngine(
        engine="spark", master="local[*]")})
    again = no_engine.resolve_job_def("feed_ingest").execute_in_process(
        partition_key=names[0], instance=plat.instance)
    assert again.success
    meta = _meta(again, built.key("upsert_state"))
    assert "files" not in meta and "rows_read" not in meta
    assert meta["status"] == f"{names[0]} was already ingested at ts 0"
    assert (meta["ts"], meta["applied_by"]) == (0, "already in the shard")
    after = plat.shard().state()
    assert (after.upper, after.seqno) == (before.upper, before.seqno)


def test_missing_and_broken_files_fail_with_one_line(plat: Platform) -> None:
    names = plat.write_batches(["b-01.jsonl"])
    (plat.landing / "b-02.jsonl").write_text('{"offset": 1}\n')  # no key column
    spec = plat.spec()
    _, defs = plat.build(spec)
    plat.add_partitions(spec, [*names, "b-02.jsonl", "gone.jsonl"])
    job = defs.resolve_job_def("feed_ingest")

    gone = job.execute_in_process(
        partition_key="gone.jsonl", instance=plat.instance, raise_on_error=False
    )
    assert not gone.success
    assert "gone.jsonl: no such file in the landing location" in failure_message(gone)

    broken = job.execute_in_process(
        partition_key="b-02.jsonl", instance=plat.instance, raise_on_error=False
    )
    assert not broken.success
    message = failure_message(broken)
    assert message.startswith("b-02.jsonl: ") and "key" in message
    # The file before the broken one is committed; the broken one is not.
    assert dict(plat.shard().state().ingested_files) == {"b-01.jsonl": 0}


def test_a_first_file_refused_whole_creates_no_shard(plat: Platform) -> None:
    # Issue 23: a run whose first file lacks its key column left an empty shard behind.
    plat.landing.mkdir(parents=True, exist_ok=True)
    (plat.landing / "b-01.jsonl").write_text('{"offset": 1, "v": "x"}\n')
    spec = plat.spec()
    _, defs = plat.build(spec)
    plat.add_partitions(spec, ["b-01.jsonl"])
    job = defs.resolve_job_def("feed_ingest")
    failed = job.execute_in_process(
        partition_key="b-01.jsonl", instance=plat.instance, raise_on_error=False
    )
    assert not failed.success
    assert failure_message(failed) == "b-01.jsonl: missing key column 'key'"
    consensus = open_consensus(f"sqlite:///{plat.root / 'stores' / 'consensus.db'}")
    assert shard_names(consensus) == []
    # Fixed under the same name, the run creates the shard and applies it at ts 0.
    plat.write_batches(["b-01.jsonl"])
    assert job.execute_in_process(partition_key="b-01.jsonl", instance=plat.instance).success
    assert dict(plat.shard().state().ingested_files) == {"b-01.jsonl": 0}


def test_rollup_gc_materializes_and_reports_what_it_removed(plat: Platform) -> None:
    names = plat.write_batches()
    spec = plat.spec(gc_retain=1)
    built, defs = plat.build(spec)
    plat.add_partitions(spec, names)
    assert defs.resolve_job_def("feed_ingest").execute_in_process(
        partition_key=names[-1], instance=plat.instance
    ).success
    before = plat.shard().inspect()

    result = materialize(
        [*built.assets], selection=[built.key("rollup_gc")], instance=plat.instance,
        resources=plat.resources(),
    )
    assert result.success
    meta = _meta(result, built.key("rollup_gc"))
    assert meta["since_before"] == 0 and meta["since_after"] == 4  # retain 1 of upper 5
    assert meta["shard_since"] == 4 and meta["shard_upper"] == 5
    assert meta["bytes_freed"] > 0 and meta["parts_deleted"] + meta["rollups_deleted"] > 0
    assert len(meta["deleted_blobs"]) > 0
    assert plat.shard().check().ok
    # What the shard holds now, as reported. (Not necessarily less than before: the
    # compaction writes one typed part per bucket, and for a few rows the per-file
    # overhead of four parts outweighs what the folded history saved.)
    assert before["blob_bytes"] != meta["shard_blob_bytes"]
    assert meta["shard_blob_bytes"] == plat.shard().inspect()["blob_bytes"]


def test_rollup_gc_types_a_plain_shard_once_its_ingests_write_typed_parts(
    plat: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rollup_gc`` gives compaction the ingest's part typer: plain parts (written with
    ``UPSERT_TYPED_PARTS=0``) become typed once the newest ingest wrote typed ones."""
    names = plat.write_batches()
    spec = plat.spec(gc_retain=1)
    built, defs = plat.build(spec)
    plat.add_partitions(spec, names)
    job = defs.resolve_job_def("feed_ingest")
    monkeypatch.setenv("UPSERT_TYPED_PARTS", "0")
    assert job.execute_in_process(partition_key=names[-2], instance=plat.instance).success
    monkeypatch.delenv("UPSERT_TYPED_PARTS")
    assert job.execute_in_process(partition_key=names[-1], instance=plat.instance).success
    want = sorted(map(str, ShardTable(plat.shard()).snapshot().to_pylist()))
    assert not all(typed_parts(plat.shard()))
    assert materialize(
        [*built.assets], selection=[built.key("rollup_gc")], instance=plat.instance,
        resources=plat.resources(),
    ).success
    assert all(typed_parts(plat.shard()))
    assert sorted(map(str, ShardTable(plat.shard()).snapshot().to_pylist())) == want


def _error_chain(result) -> str:  # type: ignore[no-untyped-def]
    """The failed step's error and its causes, as the run log shows them."""
    [data] = [e.step_failure_data for e in result.all_events if e.is_step_failure]
    error, messages = data.error, []
    while error is not None:
        messages.append(error.message.strip())
        error = error.cause
    return "\n".join(messages)


@pytest.mark.parametrize("retain", [0, -1])
def test_rollup_gc_refuses_retain_below_one_and_leaves_the_shard_alone(
    plat: Platform, retain: int
) -> None:
    """``retain: 0`` would leave nothing readable (since == upper): the run config is
    refused before the asset body runs, and a spec that bypassed the loader's check is
    refused by the core before anything changes."""
    names = plat.write_batches()
    built, defs = plat.build(plat.spec())
    plat.add_partitions(plat.spec(), names)
    assert defs.resolve_job_def("feed_ingest").execute_in_process(
        partition_key=names[-1], instance=plat.instance
    ).success
    before = plat.shard().state()

    config = {"ops": {"feed__rollup_gc": {"config": {"retain": retain}}}}
    result = materialize(
        [*built.assets], selection=[built.key("rollup_gc")], instance=plat.instance,
        resources=plat.resources(), run_config=config, raise_on_error=False,
    )
    assert not result.success
    message = _error_chain(result)
    assert "RollupGcConfig" in message and "retain" in message, message
    assert "greater than or equal to 1" in message, message

    unchecked, _ = plat.build(plat.spec(gc_retain=retain))
    result = materialize(
        [*unchecked.assets], selection=[unchecked.key("rollup_gc")], instance=plat.instance,
        resources=plat.resources(), raise_on_error=False,
    )
    assert not result.success
    assert "retain must be an integer >= 1" in failure_message(result)
    after = plat.shard().state()
    assert (after.seqno, after.since, after.upper) == (before.seqno, before.since, before.upper)


def test_rollup_gc_before_the_shard_exists_says_so(plat: Platform) -> None:
    built, _ = plat.build(plat.spec())
    result = materialize(
        [*built.assets], selection=[built.key("rollup_gc")], instance=plat.instance,
        resources=plat.resources(),
    )
    assert result.success
    assert "does not exist yet" in str(_meta(result, built.key("rollup_gc"))["note"])


def test_a_file_that_changes_while_read_fails_the_attempt_and_the_retry_applies_it(
    plat: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Review: the driver leaves a file that changed while it was read pending and
    # returns normally; the step then crashed on a KeyError (its partition not applied),
    # without reporting the file it had committed before, so the retry labelled that
    # file "already ingested" instead of this run's.
    from upsert_core.errors import LandingFileChanged
    from upsert_core.ingest import pipeline

    names = plat.write_batches(["b-01.jsonl", "b-02.jsonl"])
    spec = plat.spec()
    built, _ = plat.build(spec)
    plat.add_partitions(spec, names)
    ingest_one, changed = pipeline._ingest_one, []

    def changing(shard, state, file, *args, **kwargs):  # type: ignore[no-untyped-def]
        if file.name == names[1] and not changed:
            changed.append(file.name)
            raise LandingFileChanged(f"{file.name}: changed while it was read")
        return ingest_one(shard, state, file, *args, **kwargs)

    monkeypatch.setattr(pipeline, "_ingest_one", changing)
    result = materialize(
        [*built.assets, built.checks], selection=list(built.ingest_keys),
        partition_key=names[1], instance=plat.instance, resources=plat.resources(),
    )
    assert changed and result.success  # the retry applied it
    assert dict(plat.shard().state().ingested_files) == {names[0]: 0, names[1]: 1}
    state = built.key("upsert_state")
    assert (_meta(result, state)["ts"], _meta(result, state)["applied_by"]) == (1, "this run")
    # The failed attempt reported the file it committed (its events are in the
    # instance, not in the in-process result), as this run's.
    records = plat.instance.fetch_materializations(state, limit=100).records
    first = [r.asset_materialization for r in records
             if r.asset_materialization is not None
             and r.asset_materialization.partition == names[0]]
    assert [m.metadata["applied_by"].value for m in first] == ["this run"]


def test_an_ingest_run_stores_the_source_retention(plat: Platform) -> None:
    """``sources.yaml``'s ``retention:`` reaches the shard with the first run (never
    before: a shard is created only by an ingest that commits)."""
    names = plat.write_batches()
    spec = plat.spec(retention=("keep", 1))
    built, defs = plat.build(spec)
    plat.add_partitions(spec, names)
    job = defs.resolve_job_def("feed_ingest")
    assert job.execute_in_process(partition_key=names[0], instance=plat.instance).success
    assert plat.shard().retention() == 1
    assert job.execute_in_process(partition_key=names[1], instance=plat.instance).success
    assert plat.shard().state().upper == 2
    assert plat.shard().inspect()["retention"] == 1
