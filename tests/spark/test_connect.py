"""Spark Connect end to end: ``upsertctl ingest`` with ``SPARK_REMOTE`` runs its Spark
stages on a long-lived Connect server (here on ``local[2]``, started once for the test
session) and produces exactly the shard the in-process engine produces.

The CLI processes get no Java (``JAVA_HOME`` points nowhere), so a success proves the
work went to the server and no local JVM started. Two ingests in a row go through the
same server: the second runs on Python workers reused from the first (their state
caches, their shipped environment), as every Dagster run and CLI call would."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest

from tests.e2e.helpers import Cli, write_jsonl, write_parquet
from tests.ingest.helpers import contents, memory_shard
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard
from upsert_core.persist.testing import unreferenced_blobs

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _batch(rng: random.Random) -> list[object]:
    rows: list[object] = []
    for _ in range(40):
        row: dict[str, object] = {"key": rng.randrange(25), "offset": rng.randrange(10)}
        if rng.random() < 0.2:
            row["__deleted"] = True
        else:
            row["v"] = rng.choice(["a", "b", "c"])
        rows.append(row)
    rows.append({"key": None, "offset": 1})  # an error row
    return rows


def test_upsertctl_ingests_through_a_spark_connect_server(
    connect_url: str, tmp_path: Path
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    rng = random.Random(7)
    for i in range(3):
        write_jsonl(landing, f"{i:02d}.jsonl", _batch(rng))
    write_parquet(landing, "03.parquet", pa.table({"key": [1, 2, 99], "offset": [50, 50, 1],
                                                   "v": ["p", "q", "r"]}))
    home = tmp_path / "remote"
    remote = Cli(home, engine="spark", env={"SPARK_REMOTE": connect_url, "UPSERT_BUCKETS": "4",
                                            "JAVA_HOME": str(tmp_path / "no-java")})
    local = memory_shard("local")
    request = IngestRequest(order_scope="global", buckets=4)
    for round_ in range(2):
        if round_:
            write_jsonl(landing, "04.jsonl", _batch(rng))
            write_jsonl(landing, "05.jsonl", [{"key": k, "offset": 100, "v": "late"}
                                              for k in range(10)])
        # JAVA_HOME names no Java: a JVM started on this side would fail the ingest.
        result = remote.ingest(landing, "--order-scope", "global")
        assert "error row" in result.err, result.err
        ingest(local, str(landing), request)
        shard = Shard.open(open_consensus(f"sqlite:///{home}/consensus.db"),
                           open_blob(f"file://{home}/blob"), "s")
        assert shard.state().upper == local.state().upper == 4 + 2 * round_
        assert contents(shard) == contents(local)
        assert list(shard.errors()) == list(local.errors())
        assert unreferenced_blobs(shard) == set()
