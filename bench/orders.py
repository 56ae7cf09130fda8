"""Benchmark: an order of several columns (order keys) beside one int64 order column.

The workload is ``bench.ingest``'s (:mod:`bench._workload`: N keys loaded, then change
batches of updates, new keys, deletes and in-batch duplicates), ingested twice per order
scope with the in-process engine on the embedded defaults (SQLite consensus, a local
blob directory):

- the workload's files with two more columns, ``file`` (a string, ``bin.NNNNNN``: the
  offset's thousands, zero-padded) and ``pos`` (the offset's remainder), so both runs
  read and store exactly the same rows;
- ``one column``: ``--order offset`` (int64 orders, the path every shard had before);
- ``two columns``: ``--order file,pos``, the same order as ``offset``, so both shards
  must end with the same rows (checked on key, value and amount); the difference is
  the cost of order keys alone.

Reported per scope: the initial load's time, the mean per-batch time of the change
batches, and the ratio two columns / one column. Numbers are wall-clock on a shared
machine: run it when nothing else runs, and read ratios rather than absolute times.

Usage: ``.venv/bin/python -m bench.orders [--keys N] [--batch-rows N] [--batches K]``;
the LAST line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench._workload import write_workload
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.engine import InProcessEngine
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def split_order(src: Path, dst: Path) -> None:
    """``src`` with ``file`` (string) and ``pos`` (int64) added after ``offset``."""
    table = pq.read_table(src)
    offset = table.column("offset")
    thousands = pc.divide(offset, 1000)
    names = pc.binary_join_element_wise(
        "bin.", pc.utf8_lpad(pc.cast(thousands, pa.string()), 6, "0"), "")
    pos = pc.subtract(offset, pc.multiply(thousands, 1000))
    i = table.schema.get_field_index("offset") + 1
    table = table.add_column(i, "pos", pos).add_column(i, "file", names)
    pq.write_table(table, dst)


def run(landing: Path, files: list[Path], root: Path, order: str, scope: str) -> list[float]:
    """Ingest the files one run each; the seconds of each run."""
    root.mkdir(parents=True)
    shard = Shard.open(open_consensus(f"sqlite:///{root}/c.db"),
                       open_blob(f"file://{root}/blob"), "s", create=True)
    request = IngestRequest(order=order, order_scope=scope, maintain=False)
    times = []
    for path in files:
        (landing / path.name).write_bytes(path.read_bytes())
        start = time.perf_counter()
        ingest(shard, str(landing), request, engine=InProcessEngine())
        times.append(time.perf_counter() - start)
    return times


def snapshot_of(root: Path) -> pa.Table:
    shard = Shard.open(open_consensus(f"sqlite:///{root}/c.db"),
                       open_blob(f"file://{root}/blob"), "s")
    from upsert_core.shard_table import ShardTable

    table = ShardTable(shard).snapshot()
    return table.select(["key", "value", "amount"]).sort_by("key")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--batch-rows", type=int, default=50_000)
    parser.add_argument("--batches", type=int, default=5)
    args = parser.parse_args()
    figures: dict[str, object] = {"keys": args.keys, "batch_rows": args.batch_rows,
                                  "batches": args.batches}
    with tempfile.TemporaryDirectory(prefix="bench-orders-") as tmp:
        base = Path(tmp)
        initial, batches = write_workload(base / "workload", args.keys, args.batch_rows,
                                          args.batches)
        (base / "files").mkdir()
        files = [base / "files" / p.name for p in (initial, *batches)]
        for src, dst in zip((initial, *batches), files, strict=True):
            split_order(src, dst)
        one = two = files
        for scope in ("batch", "global"):
            results = {}
            for label, files, order in (("one", one, "offset"), ("two", two, "file,pos")):
                log(f"{scope}: {label} column(s) ...")
                root = base / f"{scope}-{label}"
                landing = base / f"{scope}-{label}-landing"
                landing.mkdir()
                times = run(landing, files, root, order, scope)
                results[label] = (times, snapshot_of(root))
            assert results["one"][1].equals(results["two"][1]), "the shards differ"
            for label, (times, _) in results.items():
                figures[f"{scope}_{label}_initial_s"] = round(times[0], 3)
                figures[f"{scope}_{label}_batch_s"] = round(statistics.fmean(times[1:]), 3)
            figures[f"{scope}_batch_ratio"] = round(
                figures[f"{scope}_two_batch_s"] / figures[f"{scope}_one_batch_s"], 2)  # type: ignore[operator]
            figures[f"{scope}_initial_ratio"] = round(
                figures[f"{scope}_two_initial_s"] / figures[f"{scope}_one_initial_s"], 2)  # type: ignore[operator]
            log(f"{scope}: per batch {figures[f'{scope}_one_batch_s']} s (one column) vs "
                f"{figures[f'{scope}_two_batch_s']} s (two columns)")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
