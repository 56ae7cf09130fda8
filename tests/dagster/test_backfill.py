"""Partitions run in any order leave the shard identical to one sequential ingest."""

from __future__ import annotations

import random

from orchestration.backfill import find_source, run_backfill, select_partitions
from tests.dagster.helpers import Platform, shard_contents
from upsert_core.ingest import InProcessEngine, ingest


def test_shuffled_backfill_equals_sequential_ingest(plat: Platform) -> None:
    names = plat.write_batches()
    spec = plat.spec()
    reference = plat.shard(stores="reference")
    ingest(reference, str(plat.landing), spec.request(), engine=InProcessEngine())
    expected = shard_contents(reference)
    assert expected["upper"] == len(names)

    order = list(names)
    random.Random(7).shuffle(order)
    assert order != sorted(order) and order[0] != names[0]
    _, defs = plat.build(spec)
    res = plat.resources()
    assert select_partitions(spec, res["consensus"], res["blob_store"]) == names

    runs = run_backfill(defs, spec, order, instance=plat.instance)
    assert [r.partition for r in runs] == order and all(r.success for r in runs)
    # The first run applied everything up to its file; runs of earlier files were no-ops.
    assert runs[0].status == f"applied {names.index(order[0]) + 1} file(s) through {order[0]}"
    assert any("was already ingested" in r.status for r in runs)
    assert shard_contents(plat.shard()) == expected
    assert select_partitions(spec, res["consensus"], res["blob_store"]) == []
    assert plat.shard().check().ok


def test_backfill_stops_at_a_broken_file(plat: Platform) -> None:
    names = plat.write_batches(["b-01.jsonl", "b-03.jsonl"])
    (plat.landing / "b-02.jsonl").write_text('{"key": "x", "offset": "not a number"}\n{')
    spec = plat.spec()
    _, defs = plat.build(spec)
    runs = run_backfill(defs, spec, ["b-03.jsonl", names[0]], instance=plat.instance)
    assert len(runs) == 1 and not runs[0].success
    assert runs[0].status.startswith("failed: b-02.jsonl: ")
    assert dict(plat.shard().state().ingested_files) == {"b-01.jsonl": 0}
    assert find_source([spec], "feed") is spec
