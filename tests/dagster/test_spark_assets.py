"""upsert_state through Spark: the same shard as the in-process engine."""

from __future__ import annotations

import pytest
from dagster import materialize

from tests.dagster.helpers import Platform, shard_contents
from upsert_core.ingest import InProcessEngine, ingest


@pytest.mark.spark
def test_partition_materializes_through_spark(plat: Platform, spark_session: object) -> None:
    names = plat.write_batches()
    spec = plat.spec()
    built, _ = plat.build(spec, engine="spark")
    plat.add_partitions(spec, names)

    result = materialize(
        [*built.assets, built.checks],
        selection=list(built.ingest_keys),
        partition_key=names[1],
        instance=plat.instance,
        resources=plat.resources(engine="spark"),
    )
    assert result.success
    [state] = [
        e.materialization.metadata for e in result.get_asset_materialization_events()
        if e.asset_key == built.key("upsert_state") and e.partition == names[1]
    ]
    assert state["engine"].value == "spark"
    assert state["files"].value == names[:2] and state["upper"].value == 2
    assert (state["ts"].value, state["applied_by"].value) == (1, "this run")
    # What reading the partition's own file cost: Spark slices read it whole, and their
    # read gives the ledger its digest (nothing read again).
    size = (plat.landing / names[1]).stat().st_size
    assert state["file_bytes"].value == size
    assert state["read_tasks"].value >= 1 and state["drain_tasks"].value >= 1
    assert state["digest_bytes_read"].value == 0
    assert state["landing_bytes_read"].value >= state["read_tasks"].value * size
    # What its tasks held: a Python worker's peak (well above 30 MiB with pyarrow loaded)
    # and the largest bucket state after the file (the first file's keys are in it too).
    assert state["task_peak_memory"].value > 30 << 20
    for grew in ("read_memory_added", "drain_memory_added"):
        assert 0 <= state[grew].value < state["task_peak_memory"].value
    assert state["largest_bucket_keys"].value > 0
    assert all(c.passed for c in result.get_asset_check_evaluations()
               if c.check_name != "error_rows_did_not_grow")

    for name in names[2:]:
        (plat.landing / name).rename(plat.root / name)
    reference = plat.shard("ref", stores="ref")
    ingest(reference, str(plat.landing), spec.request(), engine=InProcessEngine())
    assert shard_contents(plat.shard()) == shard_contents(reference)
