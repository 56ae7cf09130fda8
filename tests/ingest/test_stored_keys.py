"""The upsert keys an ingest stores are the per-key ``xxhash`` digests of the encoded key
columns, whichever path validation takes (the first file's unencoded rows, a later
file's encoded rows, keys over 240 bytes, several chunks per length group): a shard
ingested with the numpy digests (``codec.key_digest_array``) holds exactly the keys the
per-key digests (``codec.key_digest``) stored before it."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from upsert_core import key_hash
from upsert_core.codec import Datum, encode_datums, key_digest
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.shard import Shard

from .helpers import write_jsonl

_UTC = dt.UTC


def _rows(first: int, count: int, file: str) -> list[dict[str, object]]:
    """Keys (name, n, at) whose encodings span XXH3's length classes: names of 0 to 300
    characters (keys of 29 to 329 bytes) and two fixed-width columns."""
    return [
        {
            "name": "k" * ((i * 37) % 301),
            "n": i,
            "at": dt.datetime(2024, 1, 1, tzinfo=_UTC) + dt.timedelta(seconds=i),
            "offset": i,
            "v": f"value {i} of {file}",
        }
        for i in range(first, first + count)
    ]


def _expected_key(row: dict[str, object]) -> bytes:
    values: list[Datum] = [row["name"], row["n"], row["at"]]  # type: ignore[list-item]
    return key_digest(encode_datums(values))


def _stored_keys(shard: Shard, ts: int) -> set[bytes]:
    return {bytes(k) for k in shard.changes(ts, ts + 1)
            for k in k.column("key").to_pylist()}


@pytest.mark.parametrize("chunk_keys", [None, 7])
def test_stored_keys_are_the_per_key_digests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk_keys: int | None
) -> None:
    if chunk_keys is not None:  # many chunks per length group, on the real path
        monkeypatch.setattr(key_hash, "CHUNK_KEYS", chunk_keys)
    landing = tmp_path / "landing"
    landing.mkdir()
    first = _rows(0, 400, "a")
    table = pa.table({
        "name": pa.array([r["name"] for r in first], pa.string()),
        "n": pa.array([r["n"] for r in first], pa.int64()),
        "at": pa.array([r["at"] for r in first], pa.timestamp("us", tz="UTC")),
        "offset": pa.array([r["offset"] for r in first], pa.int64()),
        "v": pa.array([r["v"] for r in first], pa.string()),
    })
    pq.write_table(table, landing / "a.parquet")
    second = _rows(300, 200, "b")  # 100 keys updated (another value), 100 new
    write_jsonl(landing, "b.jsonl", [
        {**r, "at": r["at"].isoformat()} for r in second  # type: ignore[attr-defined]
    ])
    shard = Shard.open(MemoryConsensus(), MemoryBlob(), "s", create=True)
    ingest(shard, str(landing), IngestRequest(key=["name", "n", "at"], order="offset"))
    assert shard.state().upper == 2
    assert _stored_keys(shard, 0) == {_expected_key(r) for r in first}
    assert _stored_keys(shard, 1) == {_expected_key(r) for r in second}
    snapshot = {bytes(k) for k in shard.snapshot_table().column("key").to_pylist()}
    assert snapshot == {_expected_key(r) for r in first + second}
    assert any(len(str(r["name"])) > key_hash.MIDSIZE_MAX for r in first)  # the fallback ran
