"""Does a latest read pay for a long history? Issue 22's target: "a shard after 1,000
batches of 1,000 rows over 100k keys: latest read <= 1.3x its time after 10 such
batches", with the default retention (all history readable) and no manual ``gc``.

The run: :class:`bench._workload.WideWorkload` (``--keys`` loaded, then ``--batches``
change batches of ``--rows`` rows: 70% updates, 20% new keys, 10% deletes, 5% in-batch
duplicates), with every key taken modulo ``--keys`` so the key space stays that size
("over 100k keys": a "new" key revives or rewrites one of them; offsets stay unique, so
the greatest still wins without ties), each batch one Parquet landing file ingested in
this process by ``upsert_core.ingest.ingest`` (the ingest's own maintenance included: automatic
compaction, nothing else), on SQLite consensus and a local blob directory. At each
checkpoint (after batch 10, 100 and the last, by default) it records, in a fresh
``open_shard`` each time: the latest ``snapshot()`` (best of 3 after one untimed read),
an as-of read of the checkpoint's first ts, the number of batches in the shard's state,
the bytes it references, and the seconds the batches since the last checkpoint took.

Usage: ``.venv/bin/python -m bench.history [--keys N] [--rows R] [--batches K]
[--at 10,100]``. Progress on stderr; a table on stdout; the LAST line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from bench._workload import WideWorkload

SHARD = "history"
READS = 3


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _best(read: Any) -> tuple[float, int]:
    read()  # untimed: opens files, warms the page cache
    times, rows = [], 0
    for _ in range(READS):
        started = time.perf_counter()
        rows = read().num_rows
        times.append(time.perf_counter() - started)
    return min(times), rows


def _within(batch: Any, keys: int) -> Any:
    """``batch`` with its keys taken modulo ``keys``."""
    import pyarrow.compute as pc

    at = batch.schema.get_field_index("key")
    return batch.set_column(at, "key", pc.bit_wise_and(batch.column("key"), keys - 1)
                            if keys & (keys - 1) == 0 else pc.subtract(
                                batch.column("key"),
                                pc.multiply(pc.divide(batch.column("key"), keys), keys)))


def measure(consensus: str, blob: str) -> dict[str, Any]:
    from upsert_core import open_shard

    table = open_shard(SHARD, consensus, blob)
    state = table.shard.state()
    latest_s, rows = _best(lambda: open_shard(SHARD, consensus, blob).snapshot())
    as_of_s, as_of_rows = _best(
        lambda: open_shard(SHARD, consensus, blob).snapshot(as_of=state.since)
    )
    return {
        "upper": state.upper,
        "since": state.since,
        "batches_in_state": len(state.batches),
        "referenced_mb": round(state.encoded_size_bytes() / 1e6, 1),
        "latest_s": round(latest_s, 4),
        "latest_rows": rows,
        "as_of_since_s": round(as_of_s, 4),
        "as_of_rows": as_of_rows,
    }


def run(keys: int, rows: int, batches: int, at: list[int]) -> dict[str, Any]:
    from upsert_core.ingest import IngestRequest, ingest
    from upsert_core.persist.location.blob_local import LocalBlob
    from upsert_core.persist.location.urls import open_consensus
    from upsert_core.persist.shard import Shard

    root = Path(tempfile.mkdtemp(prefix="bench-history-"))
    try:
        workload = WideWorkload(keys, rows)
        landing = root / "landing"
        landing.mkdir()
        consensus_url = f"sqlite:///{root / 'consensus.db'}"
        blob_url = f"file://{root / 'blob'}"
        shard = Shard.open(open_consensus(consensus_url), LocalBlob(str(root / "blob")), SHARD)
        request = IngestRequest(key=("key",), order="offset")

        def step(name: str, table: Any) -> float:
            pq.write_table(table, landing / name)
            started = time.perf_counter()
            report = ingest(shard, f"file://{landing}", request, engine=None)
            seconds = time.perf_counter() - started
            if len(report.files) != 1:
                raise RuntimeError(f"expected one file ingested, got {report.files}")
            return seconds

        out: dict[str, Any] = {"keys": keys, "rows": rows, "batches": batches,
                               "initial_s": round(step("b00000.parquet", workload.initial()), 3)}
        log(f"initial load of {keys} keys: {out['initial_s']}s")
        points: list[dict[str, Any]] = []
        since_last: list[float] = []
        for i in range(1, batches + 1):
            since_last.append(step(f"b{i:05d}.parquet", _within(workload.batch(), keys)))
            if i in at or i == batches:
                point = {"after_batches": i, **measure(consensus_url, blob_url),
                         "batch_median_s": round(statistics.median(since_last), 4),
                         "batch_max_s": round(max(since_last), 4)}
                since_last = []
                points.append(point)
                log(f"after {i} batches: {point}")
        out["points"] = points
        first, last = points[0], points[-1]
        out["latest_ratio_last_vs_first"] = round(last["latest_s"] / first["latest_s"], 3)
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--rows", type=int, default=1_000)
    parser.add_argument("--batches", type=int, default=1_000)
    parser.add_argument("--at", default="10,100", help="also measure after these batches")
    args = parser.parse_args()
    at = sorted(int(x) for x in args.at.split(",") if x.strip())
    os.environ.setdefault("UPSERT_HOME", tempfile.mkdtemp(prefix="bench-history-home-"))
    out = run(args.keys, args.rows, args.batches, at)
    print(f"### Latest reads with history: {args.keys:,} keys, {args.batches:,} batches of"
          f" {args.rows:,} rows, all history kept, no manual gc\n")
    print("| after batches | batches in state | referenced MB | latest read s | rows |"
          " as-of `since` s | batch median s | batch max s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for p in out["points"]:
        print(f"| {p['after_batches']:,} | {p['batches_in_state']} | {p['referenced_mb']} |"
              f" {p['latest_s']} | {p['latest_rows']:,} | {p['as_of_since_s']} |"
              f" {p['batch_median_s']} | {p['batch_max_s']} |")
    first = out["points"][0]["after_batches"]
    print(f"\nLatest read after {args.batches:,} batches / after {first}:"
          f" {out['latest_ratio_last_vs_first']}x (target <= 1.3x)")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
