"""``--missing keep`` through Dagster: ``sources.yaml`` takes ``missing`` and
``unavailable``, a partition run ingests with them (a row without a field and a row
with the placeholder keep the key's values), and the shard's summary shows them."""

from __future__ import annotations

from pathlib import Path

from orchestration.sources import load_sources
from tests.dagster.helpers import Platform, write_jsonl
from upsert_core.shard_table import ShardTable


def test_sources_yaml_takes_missing_and_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "sources.yaml"
    path.write_text("sources:\n  - name: cdc\n    landing: /x\n    missing: keep\n"
                    "    unavailable: N/A\n")
    [spec] = load_sources(env={"UPSERT_SOURCES": str(path)})
    assert (spec.missing, spec.unavailable) == ("keep", "N/A")
    assert (spec.request().missing, spec.request().unavailable) == ("keep", "N/A")


def test_a_partition_run_keeps_the_values_a_row_leaves_out(plat: Platform) -> None:
    write_jsonl(plat.landing / "b-01.jsonl", [
        {"key": 1, "offset": 1, "name": "ann", "amount": 1.5},
        {"key": 1, "offset": 2, "amount": 2.5},  # name left out: kept
        {"key": 2, "offset": 1, "name": "N/A", "amount": 3.0}])  # placeholder, no row before
    spec = plat.spec(missing="keep", unavailable="N/A")
    _, result = plat.ingest_partition(spec, ["b-01.jsonl"], "b-01.jsonl")
    assert result.success
    table = ShardTable(plat.shard(spec.shard))
    info = table.inspect()
    assert (info["missing"], info["unavailable"]) == ("keep", "N/A")
    rows = sorted(table.snapshot().to_pylist(), key=lambda r: r["key"])
    assert rows == [{"key": 1, "offset": 2, "name": "ann", "amount": 2.5},
                    {"key": 2, "offset": 1, "name": None, "amount": 3.0}]
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks["state_matches_shard"] and checks["shard_consolidated"]
