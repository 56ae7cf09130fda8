"""A Debezium source through Dagster: a partition run ingests the change events, and the
output shard's ``dagster/column_schema`` lists the columns of ``after`` (CONTRACT.md: the
envelope's fields, the order ``source.lsn`` among them, are not columns of the shard),
as ``inspect`` does; the checks that verify the state against the stored orders pass."""

from __future__ import annotations

from dagster import AssetKey

from tests.dagster.helpers import Platform, write_jsonl
from tests.debezium_events import event
from upsert_core.shard_table import ShardTable


def test_a_debezium_partition_run_shows_the_columns_of_after(plat: Platform) -> None:
    write_jsonl(plat.landing / "b-01.jsonl", [
        event("r", 10, after={"id": 1, "name": "ann"}),
        event("r", 11, after={"id": 2, "name": "bob"}),
        event("u", 12, after={"id": 1, "name": "ann"})])  # the same after, a new LSN
    spec = plat.spec(envelope="debezium", key=("id",), order_scope="global")
    _, result = plat.ingest_partition(spec, ["b-01.jsonl"], "b-01.jsonl")
    assert result.success
    output = AssetKey([spec.name, "output_shard"])
    [meta] = [e.materialization.metadata for e in result.get_asset_materialization_events()
              if e.asset_key == output and e.partition == "b-01.jsonl"]
    columns = [(c.name, c.type) for c in meta["dagster/column_schema"].value.columns]
    assert columns == [("id", "int64"), ("name", "string")]
    table = ShardTable(plat.shard(spec.shard))
    assert table.inspect()["columns"] == dict(columns)
    assert table.snapshot().column_names == ["id", "name"]
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks["state_matches_shard"] and checks["shard_consolidated"]


def test_partition_metadata_counts_the_changes_a_read_shows(plat: Platform) -> None:
    """An event that repeats a key's ``after`` with a new LSN changes only the hidden
    order: the partition's inserts and retractions leave it out, as ``changes`` does."""
    write_jsonl(plat.landing / "b-01.jsonl", [
        event("r", 10, after={"id": 1, "name": "ann"}),
        event("r", 11, after={"id": 2, "name": "bob"})])
    write_jsonl(plat.landing / "b-02.jsonl", [
        event("u", 12, after={"id": 1, "name": "ann"}),  # the same after, a new LSN
        event("u", 13, after={"id": 2, "name": "bobby"})])
    spec = plat.spec(envelope="debezium", key=("id",), order_scope="global")
    built, result = plat.ingest_partition(spec, ["b-01.jsonl", "b-02.jsonl"], "b-02.jsonl")
    assert result.success
    state = built.key("upsert_state")
    [meta] = [{k: v.value for k, v in e.materialization.metadata.items()}
              for e in result.get_asset_materialization_events()
              if e.asset_key == state and e.partition == "b-02.jsonl"]
    assert (meta["inserts"], meta["retractions"]) == (1, 1)
    changes = ShardTable(plat.shard(spec.shard)).changes(1, 2)
    assert changes.column("__diff").to_pylist().count(1) == 1
    assert changes.num_rows == 2
