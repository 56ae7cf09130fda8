"""Debezium events in Parquet files ingested (``--envelope debezium``, in-process engine):
the shard equals ``tests.model``'s and the shard the same events make as JSON Lines, at
every ts, in both order scopes (a fixed scenario, then generated event streams); a file
with a wrong layout stops the ingest at that file, naming it and the column, with
nothing of it committed; a large file read in chunks gives the shard a whole read gives."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.debezium_events import event, write_events_jsonl, write_events_parquet
from tests.model import UpsertModel
from upsert_core.errors import IngestError
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.landing.chunks import CHUNK_ROWS_ENV, STREAM_BYTES_ENV
from upsert_core.landing.debezium import DELETE_MARKER

from .helpers import contents, memory_shard
from .test_debezium_model import ORDER, SCENARIO, assert_matches, events, plain_rows

IMAGE = pa.struct([("id", pa.int64()), ("v", pa.string()), ("__deleted", pa.bool_())])
SOURCE = pa.struct([("lsn", pa.int64())])


def _as_events(lines: list[Any]) -> list[dict[str, Any]]:
    """The lines of a JSON Lines file as the sink's Parquet rows: wrappers unwrapped,
    Kafka tombstones (``null``) gone (the sink drops them)."""
    out = []
    for line in lines:
        if isinstance(line, dict) and "payload" in line:
            line = line["payload"]
        if isinstance(line, dict):
            out.append({**line, "source": {"lsn": line["source"]["lsn"]}})
    return out


def _ingest(root: Path, scope: str, buckets: int) -> tuple[Any, int]:
    shard = memory_shard()
    report = ingest(shard, str(root), IngestRequest(
        key=("id",), envelope="debezium", order_scope=scope, buckets=buckets))
    return shard, report.skipped


def run_both(
    batches: list[list[Any]], scope: str, buckets: int = 2
) -> tuple[Any, Any, UpsertModel, int]:
    """The Parquet shard, the JSON Lines shard and the model of the same events."""
    model = UpsertModel(scope, key="id", order=ORDER, deleted=DELETE_MARKER)
    with tempfile.TemporaryDirectory() as parquet_dir, tempfile.TemporaryDirectory() as json_dir:
        for i, lines in enumerate(batches):
            write_events_parquet(Path(parquet_dir), f"{i:04d}.parquet", _as_events(lines),
                                 image=IMAGE, source=SOURCE)
            write_events_jsonl(Path(json_dir), f"{i:04d}.jsonl", lines)
            model.apply(plain_rows(lines))
        parquet, skipped = _ingest(Path(parquet_dir), scope, buckets)
        json_lines, json_skipped = _ingest(Path(json_dir), scope, buckets)
    assert skipped == json_skipped
    return parquet, json_lines, model, skipped


@pytest.mark.parametrize("scope", ["batch", "global"])
def test_scenario_matches_model_and_json_lines(scope: str) -> None:
    parquet, json_lines, model, skipped = run_both(SCENARIO, scope)
    assert skipped == 2
    assert parquet.state().num_errors() == 0
    assert_matches(parquet, model, len(SCENARIO))
    assert contents(parquet) == contents(json_lines)


def test_error_rows_are_the_json_lines_ones() -> None:
    lines = [event("c", 1, after={"id": 1}), event("x", 2, after={"id": 2}), event("c", 3),
             event("d", 4, after={"id": 1}), event(None, 5, after={"id": 5}),
             event("t", 6)]
    parquet, json_lines, model, skipped = run_both([lines], "batch")
    assert skipped == 1
    assert [{**e, "file": "f"} for e in parquet.errors()] == [
        {**e, "file": "f"} for e in json_lines.errors()]
    assert [e["row"] for e in parquet.errors()] == [2, 3, 4, 5]
    assert_matches(parquet, model, 1)


@settings(max_examples=30, deadline=None)
@given(
    batches=st.lists(st.lists(events(), max_size=8), min_size=1, max_size=4),
    scope=st.sampled_from(["batch", "global"]),
    buckets=st.sampled_from([1, 4]),
)
def test_generated_event_streams_give_the_json_lines_shard(
    batches: list[list[Any]], scope: str, buckets: int
) -> None:
    parquet, json_lines, model, _ = run_both(batches, scope, buckets)
    assert parquet.state().num_errors() == 0
    assert_matches(parquet, model, len(batches))
    assert contents(parquet) == contents(json_lines)


def test_a_wrong_layout_stops_at_the_file_with_nothing_of_it_committed(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    write_events_parquet(tmp_path, "0001.parquet", [event("c", 1, after={"id": 1})])
    pq.write_table(pa.table({"op": [1], "after": pa.array([{"id": 2}]),
                             "source": pa.array([{"lsn": 2}])}), tmp_path / "0002.parquet")
    write_events_parquet(tmp_path, "0003.parquet", [event("c", 3, after={"id": 3})])
    shard = memory_shard()
    request = IngestRequest(key=("id",), envelope="debezium")
    with pytest.raises(IngestError) as caught:
        ingest(shard, str(tmp_path), request)
    assert str(caught.value) == (
        "0002.parquet: column 'op' has type int64: a Debezium event's op is a string")
    state = shard.state()
    assert state.upper == 1 and set(state.ingested_files) == {"0001.parquet"}
    assert state.num_errors() == 0
    (tmp_path / "0002.parquet").unlink()  # removed: the run continues
    ingest(shard, str(tmp_path), request)
    assert set(shard.state().ingested_files) == {"0001.parquet", "0003.parquet"}


def _large_events(n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        op = "crudtm"[i % 6] if i % 17 else "x"
        key = (i * 7) % 23
        if op == "d":
            out.append(event(op, i, before={"id": key, "v": "gone", "__deleted": None}))
        else:
            out.append(event(op, i, after={"id": key, "v": f"v{i}", "__deleted": i % 5 == 0}))
    return out


def test_a_large_file_read_in_chunks_gives_the_whole_read_shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events_ = _large_events(400)
    write_events_parquet(tmp_path, "0001.parquet", events_, image=IMAGE, source=SOURCE)
    shards = []
    for stream_bytes in (str(1 << 40), "0"):
        monkeypatch.setenv(STREAM_BYTES_ENV, stream_bytes)
        monkeypatch.setenv(CHUNK_ROWS_ENV, "37")
        shard = memory_shard()
        report = ingest(shard, str(tmp_path), IngestRequest(
            key=("id",), envelope="debezium", buckets=4))
        assert report.skipped == sum(1 for e in events_ if e["op"] in ("t", "m"))
        shards.append(shard)
    whole, streamed = shards
    assert contents(streamed) == contents(whole)
    assert list(streamed.errors()) == list(whole.errors())
    assert len(list(whole.errors())) == sum(1 for e in events_ if e["op"] == "x")
