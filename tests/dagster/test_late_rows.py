"""Late rows through Dagster (global order scope): each partition's ``upsert_state``
materialization carries its own file's ``late_rows``, and the shard's late collection
holds them (``open_shard().late()``)."""

from __future__ import annotations

from tests.dagster.helpers import Platform, write_jsonl
from upsert_core.shard_table import ShardTable


def test_each_partition_reports_its_own_late_rows(plat: Platform) -> None:
    write_jsonl(plat.landing / "b-01.jsonl", [
        {"key": 1, "offset": 5, "v": "a"}, {"key": 2, "offset": 5, "v": "b"}])
    write_jsonl(plat.landing / "b-02.jsonl", [
        {"key": 1, "offset": 4, "v": "late"}, {"key": 2, "offset": 9, "v": "new"},
        {"key": 2, "offset": 5, "v": "late too"}, {"key": 3, "offset": 0, "v": "new key"}])
    write_jsonl(plat.landing / "b-03.jsonl", [{"key": 1, "offset": 5, "__deleted": True}])
    names = ["b-01.jsonl", "b-02.jsonl", "b-03.jsonl"]
    spec = plat.spec(order_scope="global")
    built, result = plat.ingest_partition(spec, names, names[-1])
    assert result.success
    late = {}
    for event in result.get_asset_materialization_events():
        meta = event.materialization.metadata
        if event.asset_key == built.key("upsert_state") and "late_rows" in meta:
            late[event.partition] = meta["late_rows"].value
    assert late == {"b-01.jsonl": 0, "b-02.jsonl": 2, "b-03.jsonl": 1}
    table = ShardTable(plat.shard(spec.shard)).late()
    assert table.select(["file", "row"]).to_pylist() == [
        {"file": "b-02.jsonl", "row": 1}, {"file": "b-02.jsonl", "row": 3},
        {"file": "b-03.jsonl", "row": 1}]
    assert table.column("stored_order").to_pylist() == [5, 5, 5]
    assert table.column("key").to_pylist() == [{"key": 1}, {"key": 2}, {"key": 1}]
