"""Retention of the late collection follows the shard's (CONTRACT.md: late rows are
readable from ``since`` on, like the shard's history): ``gc --retain`` and the stored
retention drop the late parts of batches before ``since`` (config entries, then blobs),
and keep every late row at or after it readable, equal to the dict model's. And a
Parquet file read in chunks records the late rows of the whole-file read."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.model import UpsertModel
from upsert_core.errors import NotReadable
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.late import late_refs
from upsert_core.ingest.shard_config import parse_late_ref_name
from upsert_core.landing.chunks import CHUNK_ROWS_ENV, STREAM_BYTES_ENV
from upsert_core.persist.shard import Shard
from upsert_core.persist.testing import unreferenced_blobs
from upsert_core.shard_table import ShardTable

from .helpers import memory_shard, write_jsonl


def _landing(root: Path, files: int) -> list[list[dict[str, object]]]:
    data = []
    for i in range(files):  # every file after the first has late rows for keys 1 and 2
        rows = [{"key": 1, "offset": 10 + i, "v": f"v{i}"}, {"key": 2, "offset": 0},
                {"key": 1, "offset": 5, "v": "late"}, {"key": 3, "offset": i, "v": "new"}]
        rows[1]["__deleted"] = True  # a delete at 0: late against its own tombstone
        write_jsonl(root, f"{i:03d}.jsonl", rows)
        data.append(rows)
    return data


def test_gc_drops_the_late_rows_before_since_and_keeps_the_rest(tmp_path: Path) -> None:
    data = _landing(tmp_path, 6)
    shard = memory_shard()
    ingest(shard, str(tmp_path), IngestRequest(order_scope="global", buckets=2))
    model = UpsertModel("global")
    for rows in data:
        model.apply(rows)
    before = shard.state()
    refs = late_refs(before)
    assert {ts for ts, _, _ in refs} == {1, 2, 3, 4, 5}
    names = [f"{i:03d}.jsonl" for i in range(6)]

    def expected(since: int) -> list[tuple[str, int, int, int]]:
        return [(names[ts], row, order, stored) for ts, row, _k, order, stored in model.late
                if ts >= since]

    def got() -> list[tuple[str, int, int, int]]:
        return [(r["file"], r["row"], r["order"], r["stored_order"])
                for r in ShardTable(shard).late_records()]

    assert got() == expected(0)
    shard.gc(retain=3, leak_grace_ms=0)
    state = shard.state()
    assert state.since == 3
    assert got() == expected(3)
    assert {ts for ts, _, _ in late_refs(state)} == {3, 4, 5}
    dropped = [key for ts, _, key in refs if ts < 3]
    entries = [parse_late_ref_name(name) for name in state.config]
    assert sorted(e[0] for e in entries if e is not None) == sorted(ts for ts, _, _ in refs
                                                                      if ts >= 3)
    shard.gc(leak_grace_ms=0)  # truncation lets the dropped parts go
    assert all(shard.blob.get(key) is None for key in dropped)
    assert all(shard.blob.get(key) is not None for ts, _, key in refs if ts >= 3)
    assert unreferenced_blobs(shard) == set()
    assert shard.check().ok
    # Later ingests keep recording from the retained state.
    write_jsonl(tmp_path, "006.jsonl", [{"key": 1, "offset": 1, "v": "late again"}])
    ingest(shard, str(tmp_path), IngestRequest())
    model.apply([{"key": 1, "offset": 1, "v": "late again"}])
    names.append("006.jsonl")
    assert got() == expected(3)


def test_a_stored_retention_drops_the_late_rows_before_since(tmp_path: Path) -> None:
    (tmp_path / "all").mkdir()
    data = _landing(tmp_path / "all", 8)
    shard = memory_shard()
    model = UpsertModel("global")
    request = IngestRequest(order_scope="global", buckets=2)
    landing = tmp_path / "landing"
    landing.mkdir()
    for i, rows in enumerate(data):
        write_jsonl(landing, f"{i:03d}.jsonl", rows)
        model.apply(rows)
        ingest(shard, str(landing), request)
        if i == 1:
            shard.set_retention(2)
    state = shard.state()
    assert state.since == state.upper - 2 == 6  # the global scope holds nothing back
    assert {ts for ts, _, _ in late_refs(state)} == {6, 7}
    assert all(e is None or e[0] >= 6 for e in map(parse_late_ref_name, state.config))
    assert [(r["file"], r["row"]) for r in ShardTable(shard).late_records()] == [
        (f"{ts:03d}.jsonl", row) for ts, row, *_ in model.late if ts >= 6]


@pytest.mark.parametrize("memory_mb", ["", "0"], ids=["held", "spilled"])
def test_streamed_parquet_records_the_whole_file_late_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, memory_mb: str
) -> None:
    """A Parquet file read in chunks (and spilled by bucket) numbers its late rows over
    the whole file, as the whole-file read does."""
    for i in range(3):
        n = 40
        pq.write_table(pa.table({
            "key": pa.array([(j * 7) % 9 for j in range(n)], pa.int64()),
            "offset": pa.array([(j * 13 + i * 5) % 17 for j in range(n)], pa.int64()),
            "v": pa.array([f"{i}-{j}" for j in range(n)]),
        }), tmp_path / f"{i}.parquet", row_group_size=6)
    late = []
    for streamed in (False, True):
        with monkeypatch.context() as env:
            env.setenv(STREAM_BYTES_ENV, "0" if streamed else str(1 << 40))
            env.setenv(CHUNK_ROWS_ENV, "5")
            env.setenv("UPSERT_INGEST_MEMORY_MB", memory_mb)
            shard = memory_shard()
            ingest(shard, str(tmp_path), IngestRequest(order_scope="global", buckets=3))
        late.append(list(ShardTable(shard).late_records()))
    assert late[0] == late[1]
    assert len(late[0]) > 10 and max(r["row"] for r in late[0]) > 30


def _gc_deleting(shard: Shard, retain: int) -> None:
    """GC moving since to ``upper - retain`` and deleting the late parts before it."""
    refs = late_refs(shard.state())
    shard.gc(retain=retain, leak_grace_ms=0)
    shard.gc(leak_grace_ms=0)
    since = shard.state().since
    assert all(shard.blob.get(key) is None for ts, _, key in refs if ts < since)


def test_a_late_read_survives_a_concurrent_gc_or_refuses(tmp_path: Path) -> None:
    """Like the shard's own reads, a late read started before a GC that moves since
    (and deletes the late parts before it) is not "corrupt": it goes on with the fresh
    state when every row it has not yielded is still readable (started, nothing read
    yet: the collection from the new since; or the batches it lost were all yielded),
    and refuses with NotReadable when rows it has not yielded are gone."""
    data = _landing(tmp_path, 6)
    model = UpsertModel("global")
    for rows in data:
        model.apply(rows)
    names = [f"{i:03d}.jsonl" for i in range(6)]

    def expected(since: int) -> list[tuple[str, int]]:
        return [(names[ts], row) for ts, row, *_ in model.late if ts >= since]

    def fresh_shard() -> Shard:
        shard = memory_shard()
        ingest(shard, str(tmp_path), IngestRequest(order_scope="global", buckets=2))
        return shard

    shard = fresh_shard()  # nothing read yet: the read is the one from the new since
    records = ShardTable(shard).late_records()
    _gc_deleting(shard, 3)
    assert [(r["file"], r["row"]) for r in records] == expected(3)

    shard = fresh_shard()  # read through ts 3, then since moves to 4: nothing lost
    records = ShardTable(shard).late_records()
    got = []
    for r in records:
        got.append((r["file"], r["row"]))
        if r["file"] == names[3]:
            break
    _gc_deleting(shard, 2)
    got.extend((r["file"], r["row"]) for r in records)
    assert got == expected(0)

    shard = fresh_shard()  # read ts 1 only, then since moves to 3: ts 2 is gone
    records = ShardTable(shard).late_records()
    assert next(records)["file"] == names[1]
    _gc_deleting(shard, 3)
    with pytest.raises(NotReadable, match="since moved from 0 to 3"):
        list(records)
