"""A new shard's bucket count follows its first file's size (about 256 MiB of upsert
state per bucket, a power of two from the default 4 up to 256), unless given."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from upsert_core.ingest import IngestRequest, ingest, options
from upsert_core.ingest.options import buckets_for_first_file
from upsert_core.ingest.shard_config import DEFAULT_BUCKETS, ShardIngestConfig
from upsert_core.persist.shard import Shard

from .helpers import memory_shard, write_jsonl

MB = 1 << 20


def test_the_count_follows_the_size() -> None:
    assert buckets_for_first_file(-1, ".parquet") == DEFAULT_BUCKETS  # size unknown
    assert buckets_for_first_file(10 * MB, ".parquet") == DEFAULT_BUCKETS
    assert buckets_for_first_file(682 * MB, ".parquet") == 4  # 1023 MiB of state
    assert buckets_for_first_file(700 * MB, ".parquet") == 8
    assert buckets_for_first_file(2700 * MB, ".parquet") == 16  # the 30M-row file
    assert buckets_for_first_file(2700 * MB, ".jsonl") == 16  # 2700 MiB: 11 -> 16
    assert buckets_for_first_file(1 << 50, ".csv") == 256


def _buckets(shard: Shard) -> int:
    stored = ShardIngestConfig.read(shard.state().config).options
    assert stored is not None
    return stored.buckets


def test_a_new_shard_takes_its_count_from_its_first_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(options, "TARGET_BUCKET_BYTES", 256)
    # Only maintenance grows a count, from the state the buckets hold (its own test:
    # test_rebucket_growth); at 256 bytes a bucket Parquet footers alone outgrow it.
    monkeypatch.setenv("UPSERT_AUTO_REBUCKET", "0")
    rows = pa.table({"key": list(range(500)), "offset": list(range(500)),
                     "v": [f"value {i}" for i in range(500)]})
    pq.write_table(rows, tmp_path / "a.parquet")
    size = (tmp_path / "a.parquet").stat().st_size
    expected = buckets_for_first_file(size, ".parquet")
    assert expected > DEFAULT_BUCKETS
    shard = memory_shard()
    ingest(shard, str(tmp_path), IngestRequest())
    assert _buckets(shard) == expected
    # Later files never size it again, whatever their size.
    write_jsonl(tmp_path, "b.jsonl", [{"key": 1, "offset": 900, "v": "x" * 5000}])
    ingest(shard, str(tmp_path), IngestRequest())
    assert _buckets(shard) == expected and shard.check().ok
    # A count the user gives wins.
    given = memory_shard("given")
    ingest(given, str(tmp_path), IngestRequest(buckets=3))
    assert _buckets(given) == 3
