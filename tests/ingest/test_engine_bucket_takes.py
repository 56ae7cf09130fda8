"""The in-process engine's bucket split (each bucket takes its own rows in its worker;
a file of one bucket is not copied). Files read as several chunks (Parquet row groups,
large JSON Lines), of one bucket and of many, with ties decided by file order, on 1 and
several threads, against the model."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.model import UpsertModel, canonical
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.buckets import bucket_indices, split_rows, take_rows
from upsert_core.ingest.engine import InProcessEngine

from .helpers import memory_shard, snapshot_rows


def _parquet(path: Path, rows: list[dict], row_group: int) -> None:
    table = pa.Table.from_pylist(rows, schema=pa.schema(
        [("key", pa.int64()), ("offset", pa.int64()), ("v", pa.string()),
         ("__deleted", pa.bool_())]))
    pq.write_table(table, path, row_group_size=row_group)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("keys", [1, 3, 200])
def test_chunked_files_of_one_or_many_buckets_match_the_model(
    tmp_path: Path, threads: int, keys: int
) -> None:
    rng = random.Random(keys * 10 + threads)
    shard = memory_shard()
    model = UpsertModel("batch")
    landing = tmp_path / "landing"
    landing.mkdir()
    request = IngestRequest(order_scope="batch", buckets=4, inline_threshold=0)
    for b in range(5):
        rows = []
        for i in range(3000):
            k = rng.randrange(keys)
            # few distinct orders: many ties, decided by file order across row groups
            rows.append({"key": k, "offset": rng.randrange(3), "v": f"{b}.{i}",
                         "__deleted": rng.random() < 0.1})
        _parquet(landing / f"{b:03d}.parquet", rows, row_group=rng.choice([7, 100, 1000]))
        model.apply(rows)
        ingest(shard, str(landing), request, engine=InProcessEngine(threads=threads))
        got = snapshot_rows(shard, shard.state().upper - 1)
        want = Counter(canonical(dict(v)) for v in model.snapshot().values())
        assert +got == want, b


def test_bucket_indices_and_take_rows_keep_file_order() -> None:
    rng = np.random.default_rng(3)
    buckets = rng.integers(0, 5, size=1000)
    table = pa.table({"i": np.arange(1000), "bucket": buckets}).combine_chunks()
    table = pa.concat_tables([table.slice(0, 333), table.slice(333)])  # two chunks
    split = split_rows(table, buckets)
    for b, idx in bucket_indices(buckets).items():
        taken = take_rows(table, idx)
        assert taken.column("i").to_pylist() == np.flatnonzero(buckets == b).tolist()
        assert taken.column("i").to_pylist() == split[b].column("i").to_pylist()
