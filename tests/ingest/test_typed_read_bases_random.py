"""Typed reads with bases (``persist.read.typed_read``: a bucket's base replaces the history
before it, and a batch compaction merged across its upper is read from a ``floor``),
against the merged read (no base), on random histories.

Differential stress: after every ingested file (one ingest per file, so maintenance and
automatic compaction run as in production), every readable ts is read through the typed
read (with the shard's bases) and through the merged read (no base), and both must
agree. Varied: stored retention (``upsertctl retention --keep N``), explicit
``gc --retain N``, a leased reader holding the since back, schema evolution (a column
added later), buckets emptied and refilled (a part base written again later), big
rewrites (typed bases), and few/many buckets.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path

import pytest

from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.part_typer import part_typer
from upsert_core.landing import decode_row
from upsert_core.persist.read.typed_read import open_typed_snapshot
from upsert_core.persist.shard import Shard
from upsert_core.shard_table import ShardTable, typed_bases

from .helpers import memory_shard, schema_of, write_jsonl


def _canon(row: dict) -> tuple:
    out = []
    for k, v in sorted(row.items()):
        if isinstance(v, float):
            v = "nan" if v != v else repr(v + 0.0)
        out.append((k, repr(v)))
    return tuple(out)


def _typed(table: ShardTable, ts: int) -> Counter:
    return Counter(_canon(r) for r in table.snapshot(ts).to_pylist())


def _merged(shard: Shard, ts: int) -> Counter:
    schema = schema_of(shard)
    columns = [name for name, _ in schema.columns]
    out: Counter = Counter()
    for batch in shard.snapshot(ts):
        for row, diff in zip(batch.column("row").to_pylist(),
                             batch.column("diff").to_pylist(), strict=True):
            decoded = decode_row(schema, row)
            full = {c: decoded.get(c) for c in columns}
            out[_canon(full)] += diff
    return +out


def _file(rng: random.Random, b: int, keys: int, with_w: bool) -> list[dict]:
    kind = rng.random()
    rows: list[dict] = []
    if kind < 0.06:  # delete a whole key range (may empty buckets)
        lo = rng.randrange(keys)
        rows = [{"key": k, "offset": b * 1000, "__deleted": True}
                for k in range(lo, min(keys, lo + keys // 2))]
    elif kind < 0.12:  # rewrite most keys: new (typed) bases
        rows = [{"key": k, "offset": b * 1000, "v": f"r{b}.{k}"}
                for k in range(keys) if rng.random() < 0.8]
    else:
        for i in range(rng.randrange(1, 6)):
            k = rng.randrange(keys)
            if rng.random() < 0.2:
                rows.append({"key": k, "offset": b * 1000 + i, "__deleted": True})
            else:
                row = {"key": k, "offset": b * 1000 + i,
                       "v": rng.choice([f"v{k}", f"w{b}", None]),
                       "f": rng.choice([0.5, 0.0, -0.0, float("nan"), None])}
                if with_w:
                    row["w"] = rng.choice([1, 2, None])
                rows.append(row)
    return rows


@pytest.mark.parametrize("seed", range(int(os.environ.get("BASES_RANDOM_SEEDS", "3"))))
def test_typed_reads_with_bases_equal_merged_reads(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    buckets = rng.choice([1, 2, 2, 3])
    keys = rng.choice([40, 120])
    shard = memory_shard()
    landing = tmp_path / "landing"
    landing.mkdir()
    request = IngestRequest(order_scope="batch", buckets=buckets, inline_threshold=0)
    reader = None
    files = 36
    add_w_at = rng.randrange(5, 20)
    spanned = 0
    for b in range(files):
        if b == 0:
            rows = [{"key": k, "offset": 0, "v": f"v{k}", "f": 0.5} for k in range(keys)]
        else:
            rows = _file(rng, b, keys, with_w=b >= add_w_at)
        write_jsonl(landing, f"{b:03d}.jsonl", rows)
        ingest(shard, str(landing), request)
        if b == 4 and seed % 2 == 0:
            shard.set_retention(rng.choice([1, 2, 3, 5]))
        if b % 7 == 6 and seed % 3 == 0:
            shard.gc(retain=rng.choice([1, 2, 4]), typer=part_typer(shard))
        if b == 10 and seed % 3 == 1:
            reader = shard.register_reader()
            reader.__enter__()  # a leased reader holds the since (and compaction) back
        state = shard.state()
        typed = open_typed_snapshot(shard.blob, state, state.upper - 1,
                                    list(ShardTable(shard).schema), typed_bases(state))
        if typed is not None:
            try:
                if any(m.floor > m.batch.lower for g in typed._groups.values() for m in g):
                    spanned += 1
            finally:
                typed.close()
        table = ShardTable(shard)
        for ts in range(state.since, state.upper):
            assert _typed(table, ts) == _merged(shard, ts), (seed, b, ts, state.since)
    del reader
    print(f"seed {seed}: buckets {buckets}, spanned reads {spanned}")
