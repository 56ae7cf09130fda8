"""An order of several columns through Dagster: ``sources.yaml`` takes ``order`` as a
list or as ``"c1,c2"``, a partition run ingests with it, and the shard's metadata and
``upsertctl inspect``'s summary show it."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestration.sources import load_sources
from tests.dagster.helpers import Platform, write_jsonl
from upsert_core.errors import ConfigError
from upsert_core.shard_table import ShardTable


def _sources(tmp_path: Path, order: str) -> Path:
    path = tmp_path / "sources.yaml"
    path.write_text(f"sources:\n  - name: binlog\n    landing: /x\n    order: {order}\n")
    return path


@pytest.mark.parametrize("written", ["[file, pos]", "'file,pos'", "file,pos"])
def test_sources_yaml_takes_several_order_columns(tmp_path: Path, written: str) -> None:
    [spec] = load_sources(env={"UPSERT_SOURCES": str(_sources(tmp_path, written))})
    assert spec.order == "file,pos"
    assert spec.request().order == "file,pos"


@pytest.mark.parametrize("written", ["[file, '']", "[]", "['a,b', c]"])
def test_sources_yaml_refuses_a_bad_order_list(tmp_path: Path, written: str) -> None:
    with pytest.raises(ConfigError, match="order must be a column name"):
        load_sources(env={"UPSERT_SOURCES": str(_sources(tmp_path, written))})


def test_a_partition_run_ingests_with_an_order_of_several_columns(plat: Platform) -> None:
    write_jsonl(plat.landing / "b-01.jsonl", [
        {"key": 1, "file": "bin.2", "pos": 1, "v": "newer file"},
        {"key": 1, "file": "bin.1", "pos": 99, "v": "older file"},
        {"key": 2, "file": None, "pos": 1, "v": "null order"}])
    write_jsonl(plat.landing / "b-02.jsonl", [
        {"key": 1, "file": "bin.1", "pos": 100, "v": "late"}])
    spec = plat.spec(order="file,pos", order_scope="global")
    _, result = plat.ingest_partition(spec, ["b-01.jsonl", "b-02.jsonl"], "b-02.jsonl")
    assert result.success
    table = ShardTable(plat.shard(spec.shard))
    assert table.inspect()["order"] == ["file", "pos"]
    assert table.snapshot().column("v").to_pylist() == ["newer file"]
    assert table.errors().num_rows == 1
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks["state_matches_shard"] and checks["shard_consolidated"]
