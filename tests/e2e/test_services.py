"""``upsertctl`` on PostgreSQL consensus + S3 blobs (a moto server process), landing on S3.

The same contract as on the embedded defaults; here the stores come from the
environment (UPSERT_CONSENSUS_URL, UPSERT_BLOB_URL, AWS_ENDPOINT_URL) and the landing is
an ``s3://`` prefix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.e2e.helpers import Cli, by_key, jsonl_bytes, parquet_bytes


def _put(s3: Any, bucket: str, name: str, data: bytes) -> None:
    s3.put_object(Bucket=bucket, Key=f"landing/{name}", Body=data)


@pytest.fixture
def pg_s3_cli(tmp_path: Path, fresh_postgres_url: str, s3_bucket: str, s3_env: str) -> Cli:
    return Cli(
        tmp_path / "home",
        env={
            "UPSERT_CONSENSUS_URL": fresh_postgres_url,
            "UPSERT_BLOB_URL": f"s3://{s3_bucket}/shards",
        },
    )


@pytest.mark.postgres
@pytest.mark.s3
def test_postgres_and_s3_end_to_end(pg_s3_cli: Cli, s3_bucket: str, s3_client: Any) -> None:
    cli = pg_s3_cli
    landing = f"s3://{s3_bucket}/landing"
    _put(s3_client, s3_bucket, "b.jsonl", jsonl_bytes([{"key": 1, "offset": 5, "v": "b"},
                                                       {"key": 2, "offset": 1, "v": "two"}]))
    _put(s3_client, s3_bucket, "a.jsonl", jsonl_bytes([{"key": 1, "offset": 9, "v": "a"},
                                                       {"key": None, "offset": 1}]))
    good = parquet_bytes(pa.table({"key": [2], "offset": [2], "v": [None],
                                   "__deleted": [True]}))
    _put(s3_client, s3_bucket, "c.parquet", good[:40])  # truncated
    r = cli.ingest(landing, rc=1)
    assert "c.parquet" in r.error_line() and "1 error row" not in r.error_line()
    info = cli.inspect()
    assert info["upper"] == 2 and info["ingested_files"] == {"a.jsonl": 0, "b.jsonl": 1}
    # Fix the file; a late arrival sorting first is simply pending.
    _put(s3_client, s3_bucket, "c.parquet", good)
    _put(s3_client, s3_bucket, "0-late.jsonl", jsonl_bytes([{"key": 3, "offset": 1, "v": "l"}]))
    cli.ingest(landing)
    cli.ingest(landing)  # nothing new
    info = cli.inspect()
    assert info["upper"] == 4
    # Pending files go in name order: the late "0-late" before the fixed "c".
    assert info["ingested_files"] == {"a.jsonl": 0, "b.jsonl": 1, "0-late.jsonl": 2,
                                      "c.parquet": 3}
    assert by_key(cli.snapshot()) == {1: {"key": 1, "offset": 5, "v": "b"},
                                      3: {"key": 3, "offset": 1, "v": "l"}}
    assert [(e["file"], e["row"]) for e in cli.errors()] == [("a.jsonl", 2)]
    assert sorted((c["row"]["key"], c["ts"], c["diff"]) for c in cli.changes(since=2)) == [
        (2, 3, -1), (3, 2, 1)]

    # Two ingests at once: every file exactly once.
    for i in range(5):
        _put(s3_client, s3_bucket, f"d{i}.jsonl",
             jsonl_bytes([{"key": 10 + i, "offset": i, "v": "d"}, {"key": 1, "offset": i,
                                                                    "v": f"d{i}"}]))
    args = ["ingest", landing, "--shard", "s", "--engine", "local", "--no-progress"]
    procs = [cli.popen(*args) for _ in range(2)]
    for p in procs:
        _out, err = p.communicate(timeout=300)
        assert p.returncode == 0 or "concurrently modified" in err, err
    cli.ingest(landing)
    info = cli.inspect()
    assert info["upper"] == 9
    assert sorted(info["ingested_files"].values()) == list(range(9))
    assert by_key(cli.snapshot())[1]["v"] == "d4"

    # GC with retain, then reads, check and the blob store stay consistent.
    before = cli.snapshot()
    report = cli.run("gc", "--shard", "s", "--retain", "1", "--leak-grace", "0").json()
    assert report["since_after"] == 8
    assert sorted(map(str, cli.snapshot())) == sorted(map(str, before))
    check = cli.check().json()
    assert check["ok"] is True and check["error_rows"] == 1
    assert check["blobs"] >= check["referenced_blobs"]
