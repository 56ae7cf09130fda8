"""The in-process engine against a dict model: generated batches with updates, deletes,
in-batch duplicates, order ties, late data and a column added later, in both order
scopes and several bucket counts, ingested over one or several runs. The shard's
snapshot as of every ts and its changes at every ts must equal the model's."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tests.model import UpsertModel
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.persist.testing import unreferenced_blobs

from .helpers import change_rows, memory_shard, snapshot_rows, write_jsonl


@st.composite
def source_rows(draw: st.DrawFn, with_w: bool) -> dict[str, Any]:
    row: dict[str, Any] = {
        "key": draw(st.integers(0, 5)),
        "offset": draw(st.integers(0, 6)),
    }
    if draw(st.integers(0, 4)) == 0:
        row["__deleted"] = draw(st.sampled_from([True, True, False, None]))
    else:
        row["v"] = draw(st.sampled_from(["a", "b", "c"]))
        if with_w and draw(st.booleans()):
            row["w"] = draw(st.integers(0, 2))
    return row


@st.composite
def batches(draw: st.DrawFn) -> list[list[dict[str, Any]]]:
    n = draw(st.integers(1, 7))
    added = draw(st.integers(0, n))  # from this batch on, column w may appear
    return [draw(st.lists(source_rows(i >= added), max_size=8)) for i in range(n)]


@given(
    data=batches(),
    scope=st.sampled_from(["batch", "global"]),
    buckets=st.sampled_from([1, 2, 4]),
    runs=st.integers(1, 3),
)
def test_ingest_matches_model(
    data: list[list[dict[str, Any]]], scope: str, buckets: int, runs: int
) -> None:
    shard = memory_shard()
    model = UpsertModel(scope)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        request = IngestRequest(order_scope=scope, buckets=buckets)
        cut = max(1, len(data) // runs)
        for i, rows in enumerate(data):
            write_jsonl(root, f"{i:04d}.jsonl", rows)
            model.apply(rows)
            if (i + 1) % cut == 0:
                ingest(shard, str(root), request)
        report = ingest(shard, str(root), IngestRequest())  # later runs may omit options
    state = shard.state()
    assert state.upper == len(data)
    assert report.upper == state.upper
    assert sorted(state.ingested_files.items()) == [(f"{i:04d}.jsonl", i) for i in range(len(data))]
    assert state.num_errors() == 0
    for ts in range(len(data)):
        assert snapshot_rows(shard, ts) == model.rows(ts), f"snapshot at {ts}"
        assert change_rows(shard, ts) == model.row_changes(ts), f"changes at {ts}"
    assert unreferenced_blobs(shard) == set()
