"""Debezium events ingested (``--envelope debezium``, in-process engine) against
``tests.model.UpsertModel``: the test converts the events into plain rows itself (after
+ order, or the key from ``before`` with the delete marker; ``t``/``m`` and ``null`` lines
dropped) and feeds them to the model; the shard's stored snapshot and changes at every ts
must equal the model's (the order column included: the rows store it, under its reserved
name), and what the Python
read API shows must equal the model's rows without it (the shard's columns are
``after``'s, so an update that changes only the LSN is no change), in both order scopes.
A fixed scenario, then generated event streams."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.model import UpsertModel
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.landing.debezium import DELETE_MARKER
from upsert_core.landing.schema import ENVELOPE_ORDER_PREFIX
from upsert_core.shard_table import ShardTable

from .helpers import (
    change_rows,
    memory_shard,
    read_change_rows,
    read_snapshot_rows,
    snapshot_rows,
    write_jsonl,
)

ORDER = ENVELOPE_ORDER_PREFIX + "source.lsn"
"""The order's stored column (a new Debezium shard's reserved name for ``source.lsn``)."""


def plain_rows(events: list[Any]) -> list[dict[str, Any]]:
    """The test's own translation of well-formed events into the model's plain rows."""
    rows = []
    for line in events:
        event = line
        if isinstance(line, dict) and "payload" in line:
            event = line["payload"]
        if not isinstance(event, dict) or event.get("op") not in ("c", "r", "u", "d"):
            continue  # a tombstone, a skipped t/m event, or an error row
        if not isinstance(event.get("before" if event["op"] == "d" else "after"), dict):
            continue  # an error row
        lsn = event["source"]["lsn"]
        if event["op"] == "d":
            rows.append({"id": event["before"]["id"], ORDER: lsn, DELETE_MARKER: True})
        else:
            rows.append({**event["after"], ORDER: lsn, DELETE_MARKER: False})
    return rows


def run(batches: list[list[Any]], scope: str, buckets: int = 2) -> tuple[Any, UpsertModel, int]:
    shard = memory_shard()
    model = UpsertModel(scope, key="id", order=ORDER, deleted=DELETE_MARKER)
    skipped = 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i, events in enumerate(batches):
            write_jsonl(root, f"{i:04d}.jsonl", events)
            model.apply(plain_rows(events))
        report = ingest(shard, str(root), IngestRequest(
            key=("id",), envelope="debezium", order_scope=scope, buckets=buckets))
        skipped = report.skipped
        assert report.to_dict()["skipped"] == skipped
    for file in report.files:  # the counts are those of the changes reads show
        diffs = ShardTable(shard).changes(file.ts, file.ts + 1).column("__diff").to_pylist()
        assert (file.inserts, file.retractions) == (diffs.count(1), diffs.count(-1)), file.name
    return shard, model, skipped


def assert_matches(shard: Any, model: UpsertModel, n: int) -> None:
    assert shard.state().upper == n
    for ts in range(n):
        assert snapshot_rows(shard, ts) == model.rows(ts), f"snapshot at {ts}"
        assert change_rows(shard, ts) == model.row_changes(ts), f"changes at {ts}"
        assert read_snapshot_rows(shard, ts) == model.rows(ts, hidden=[ORDER]), (
            f"read snapshot at {ts}")
        assert read_change_rows(shard, ts) == model.row_changes(ts, hidden=[ORDER]), (
            f"read changes at {ts}")


def _e(op: str, lsn: int, **images: Any) -> dict[str, Any]:
    return {"op": op, "source": {"lsn": lsn}, **images}


SCENARIO: list[list[Any]] = [
    [_e("r", 1, after={"id": 1, "v": "a"}), _e("r", 2, after={"id": 2, "v": "b"}), None],
    [{"schema": None, "payload": _e("u", 5, before={"id": 1}, after={"id": 1, "v": "c"})},
     _e("t", 6), _e("d", 4, before={"id": 2, "v": "b"}),  # a late delete (lsn 4 < 5)
     _e("m", 7)],
    [_e("u", 3, after={"id": 1, "v": "old"}),  # late in the global scope
     _e("c", 8, after={"id": 3, "v": "x", "__deleted": True}),
     _e("d", 9, before={"id": 3})],
    [_e("u", 10, after={"id": 1, "v": "c"})],  # global: the same after, a new LSN
]


@pytest.mark.parametrize("scope", ["batch", "global"])
def test_scenario_matches_model(scope: str) -> None:
    shard, model, skipped = run(SCENARIO, scope)
    assert skipped == 2
    assert shard.state().num_errors() == 0
    assert_matches(shard, model, len(SCENARIO))
    final = {dict(row)["id"]: dict(row)["v"] for row in model.rows()}
    assert final == {1: "c"}
    # global: the stored row changed (its LSN) at ts 3, the visible one did not
    assert (len(change_rows(shard, 3)), len(read_change_rows(shard, 3))) == (
        (2, 0) if scope == "global" else (2, 2))


def test_error_rows_are_kept_and_the_rest_applies() -> None:
    shard, model, _ = run([[_e("c", 1, after={"id": 1}), [1], _e("x", 2, after={"id": 2}),
                            _e("c", 3), _e("d", 4, after={"id": 1}), "null"]], "batch")
    assert shard.state().num_errors() == 4
    assert_matches(shard, model, 1)


@st.composite
def events(draw: st.DrawFn) -> Any:
    op = draw(st.sampled_from("ccruudddtm"))
    key = draw(st.integers(0, 4))
    lsn = draw(st.integers(0, 12))
    if op in "tm":
        event: dict[str, Any] = _e(op, lsn)
    elif op == "d":
        event = _e(op, lsn, before={"id": key, "v": "ignored"}, after=None)
    else:
        after: dict[str, Any] = {"id": key, "v": draw(st.sampled_from(["a", "b"]))}
        if draw(st.booleans()):
            after["__deleted"] = draw(st.booleans())
        event = _e(op, lsn, after=after)
    shape = draw(st.integers(0, 9))
    if shape == 0:
        return None  # a Kafka tombstone
    if shape <= 3:
        return {"schema": {"type": "struct", "fields": []}, "payload": event}
    return event


@settings(max_examples=40, deadline=None)
@given(
    batches=st.lists(st.lists(events(), max_size=8), min_size=1, max_size=5),
    scope=st.sampled_from(["batch", "global"]),
    buckets=st.sampled_from([1, 4]),
)
def test_generated_event_streams_match_model(
    batches: list[list[Any]], scope: str, buckets: int
) -> None:
    shard, model, skipped = run(batches, scope, buckets)
    expected_skipped = sum(
        1 for b in batches for line in b
        if line is not None and (line.get("payload") or line)["op"] in "tm"
    )
    assert skipped == expected_skipped
    assert shard.state().num_errors() == 0
    assert_matches(shard, model, len(batches))


def test_a_csv_file_is_refused_with_debezium(tmp_path: Path) -> None:
    from upsert_core.errors import UpsertPlatformError

    shard = memory_shard()
    (tmp_path / "0001.csv").write_text("id,source.lsn\n1,1\n")
    with pytest.raises(UpsertPlatformError,
                       match=r"0001.csv: --envelope debezium reads JSON Lines \(.jsonl\) and"
                             r" Parquet"):
        ingest(shard, str(tmp_path), IngestRequest(key=("id",), envelope="debezium"))
    assert shard.state().upper == 0
