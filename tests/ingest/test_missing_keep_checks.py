"""``--missing keep`` with value checks (``landing.value_checks``): a value a row leaves
out (absent field, placeholder, a file without the column) is not a value the file
brings, so a ``not_null`` check does not refuse the row; the key keeps its earlier value.
An explicit null still fails it, and without ``keep`` a left-out value is null and
fails it as before."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from upsert_core.ingest import IngestRequest, ingest
from upsert_core.landing import parse_value_checks

from .helpers import memory_shard, snapshot_rows, write_jsonl, write_parquet

PH = "__debezium_unavailable_value"
CHECKS = parse_value_checks({"v": {"not_null": True}, "n": {"min": 0}})


def _landing(root: Path) -> None:
    write_jsonl(root, "a.jsonl", [{"key": k, "offset": 1, "v": f"x{k}", "n": 1} for k in (1, 2, 3)])
    write_jsonl(root, "b.jsonl", [
        {"key": 1, "offset": 2, "n": 2},  # v left out: keeps x1
        {"key": 2, "offset": 2, "v": PH, "n": 2},  # the placeholder: keeps x2
        {"key": 3, "offset": 2, "v": None, "n": 2},  # explicit null: fails not_null
    ])
    write_parquet(root, "c.parquet", pa.table({  # no column v: every row keeps its v
        "key": pa.array([1, 2], pa.int64()), "offset": pa.array([3, 3], pa.int64()),
        "n": pa.array([3, 3], pa.int64()),
    }))


def test_not_null_does_not_refuse_a_value_left_out(tmp_path: Path) -> None:
    _landing(tmp_path)
    shard = memory_shard()
    ingest(shard, str(tmp_path), IngestRequest(missing="keep", value_checks=CHECKS))
    state = shard.state()
    assert state.upper == 3
    errors = [(r["file"], r["row"]) for r in shard.errors()]
    assert errors == [("b.jsonl", 3)]
    assert snapshot_rows(shard, 2) == {
        (("key", 1), ("n", 3), ("offset", 3), ("v", "x1")): 1,
        (("key", 2), ("n", 3), ("offset", 3), ("v", "x2")): 1,
        (("key", 3), ("n", 1), ("offset", 1), ("v", "x3")): 1,
    }


def test_without_keep_a_left_out_value_is_null_and_fails(tmp_path: Path) -> None:
    _landing(tmp_path)
    shard = memory_shard()
    ingest(shard, str(tmp_path), IngestRequest(value_checks=CHECKS))
    errors = sorted((r["file"], r["row"]) for r in shard.errors())
    # b.jsonl row 2 holds the placeholder as a real string then: it passes
    assert errors == [("b.jsonl", 1), ("b.jsonl", 3), ("c.parquet", 1), ("c.parquet", 2)]
