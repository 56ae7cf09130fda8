"""``gc --retain N`` between ingests changes nothing a reader or a later ingest can see.

CONTRACT.md: after ``gc --retain``, everything behaves exactly as if no history had been
dropped. The tests interleave ingests (updates, deletes, re-inserts of deleted keys),
and GC with every retain N against the dict model, in both order scopes, with and
without the per-process state cache (a cached bucket state at an upper equal to the new
since is caught up from the shard's changes, the path that once applied the history
folded at ``since`` a second time).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.model import UpsertModel
from upsert_core.ingest import IngestRequest, ingest, live_rows
from upsert_core.ingest.engine import InProcessEngine
from upsert_core.persist.testing import unreferenced_blobs

from .helpers import change_rows, memory_shard, snapshot_rows, write_jsonl


def _check_against_model(shard: Any, model: UpsertModel) -> None:
    state = shard.state()
    assert state.upper == model.upper
    for ts in range(state.since, state.upper):
        assert snapshot_rows(shard, ts) == model.rows(ts), f"snapshot at {ts}"
        if ts > state.since:
            assert change_rows(shard, ts) == model.row_changes(ts), f"changes at {ts}"
    report = shard.check()
    assert report.ok, report.problems
    if state.upper:
        # The catalog's row count, kept by the commits, is the live rows at the upper.
        assert live_rows(state.config) == sum(model.rows(state.upper - 1).values())


@pytest.mark.parametrize("scope", ["batch", "global"])
@pytest.mark.parametrize("cached", [True, False], ids=["cache", "no-cache"])
def test_delete_then_gc_then_reinsert(tmp_path: Path, scope: str, cached: bool) -> None:
    """The review's reproduction: insert, delete, ``gc --retain 1``, insert again."""
    shard = memory_shard()
    model = UpsertModel(scope)
    engine = InProcessEngine(cache="new" if cached else None)
    request = IngestRequest(order_scope=scope, buckets=2)
    files = [
        [{"key": 1, "offset": 1, "v": "V"}],
        [{"key": 1, "offset": 2, "__deleted": True}],
        [{"key": 1, "offset": 3, "v": "V"}],
    ]
    for i, rows in enumerate(files):
        write_jsonl(tmp_path, f"f{i}.jsonl", rows)
        model.apply(rows)
        ingest(shard, str(tmp_path), request, engine=engine)
        if i == 1:
            shard.gc(retain=1, leak_grace_ms=0)
    _check_against_model(shard, model)
    assert snapshot_rows(shard, 2) == model.rows(2) != {}


@st.composite
def source_row(draw: st.DrawFn) -> dict[str, Any]:
    row: dict[str, Any] = {"key": draw(st.integers(0, 2)), "offset": draw(st.integers(0, 9))}
    if draw(st.integers(0, 2)) == 0:
        row["__deleted"] = True
    else:
        row["v"] = draw(st.sampled_from(["a", "b"]))
    return row


@st.composite
def steps(draw: st.DrawFn) -> list[tuple[str, Any]]:
    """A run of ("ingest", (process, rows)) and ("gc", retain) steps; ``process`` picks
    which of two ingesting processes (each with its own state cache) runs the file."""
    out: list[tuple[str, Any]] = []
    for _ in range(draw(st.integers(2, 10))):
        if out and draw(st.integers(0, 2)) == 0:
            out.append(("gc", draw(st.integers(1, 4))))
        else:
            rows = draw(st.lists(source_row(), min_size=0, max_size=3))
            out.append(("ingest", (draw(st.integers(0, 1)), rows)))
    return out


REVIEW_CASE = [
    ("ingest", (0, [{"key": 1, "offset": 1, "v": "a"}])),
    ("ingest", (0, [{"key": 1, "offset": 2, "__deleted": True}])),
    ("gc", 1),
    ("ingest", (0, [{"key": 1, "offset": 1, "v": "a"}])),
]
CACHE_CASE = [  # process 1's cached state at upper 1 is caught up after since moved to 1
    ("ingest", (1, [{"key": 1, "offset": 1, "v": "a"}])),
    ("ingest", (0, [{"key": 1, "offset": 2, "__deleted": True}])),
    ("gc", 1),
    ("ingest", (1, [{"key": 1, "offset": 1, "v": "a"}])),
]


@settings(max_examples=80, deadline=None)
@example(plan=REVIEW_CASE, scope="batch", cached=False, buckets=1)
@example(plan=CACHE_CASE, scope="batch", cached=True, buckets=1)
@given(
    plan=steps(),
    scope=st.sampled_from(["batch", "global"]),
    cached=st.booleans(),
    buckets=st.sampled_from([1, 3]),
)
def test_gc_retain_interleaved_matches_model(
    plan: list[tuple[str, Any]], scope: str, cached: bool, buckets: int
) -> None:
    shard = memory_shard()
    model = UpsertModel(scope)
    engines = [InProcessEngine(cache="new" if cached else None) for _ in range(2)]
    request = IngestRequest(order_scope=scope, buckets=buckets)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        files = 0
        for kind, arg in plan:
            if kind == "gc":
                shard.gc(retain=arg, leak_grace_ms=0)
                continue
            process, rows = arg
            write_jsonl(root, f"{files:04d}.jsonl", rows)
            files += 1
            model.apply(rows)
            ingest(shard, str(root), request, engine=engines[process])
            _check_against_model(shard, model)
    _check_against_model(shard, model)
    shard.gc(leak_grace_ms=0)
    assert unreferenced_blobs(shard) == set()
