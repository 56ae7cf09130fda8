"""What does ``upsertctl rebucket`` cost? Issue 24: "rebucket 4 -> 16 of a 1M-key shard:
time, bytes".

The run: :class:`bench._workload.Workload` (``--keys`` loaded, then ``--batches`` change
batches of ``--rows`` rows), each a Parquet landing file ingested in this process with
``--buckets`` (default 4) buckets, the ingest's maintenance on (the shard keeps all
history, compacted by size tiers), on SQLite consensus and a local blob directory
(``--scope`` batch or global). Then, each in a fresh ``Shard`` handle:

- ``rebucket`` to ``--to`` (default 16): wall and CPU seconds (user + system of this
  process, every thread), the bytes of parts it read and of parts, checkpoints and
  tombstone sets it wrote, the blob directory's size before, after, and after a
  ``gc`` (which deletes what only older states referenced);
- a latest snapshot (``ShardTable``) before and after, and the next change batch's
  ingest on the new count, against the same batch ingested on the old count in a copy
  made before the rebucket (CPU seconds);
- ``rebucket`` back to the first count.

With ``--grow K``, instead: a first load of ``--keys`` keys split into K Parquet files
(as Spark writes part files), ingested in one run with ``--target-mb`` as the target
state per bucket, once growing the count between files and once with
``UPSERT_AUTO_REBUCKET=0``: CPU seconds, the counts it grew through and the bytes those
rebuckets wrote.

Usage: ``.venv/bin/python -m bench.rebucket [--keys N] [--rows R] [--batches K]
[--buckets N] [--to M] [--scope batch|global] [--grow K --target-mb T]``. Progress on
stderr; the LAST line on stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._measure import dir_bytes
from bench._workload import Workload, write_landing
from upsert_core.ingest import IngestRequest, InProcessEngine, ingest
from upsert_core.ingest.rebucket import rebucket
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard
from upsert_core.shard_table import ShardTable


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measured(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """``fn()``, its wall seconds and its CPU seconds (this process, every thread)."""
    wall, cpu = time.perf_counter(), _cpu()
    out = fn()
    return out, round(time.perf_counter() - wall, 3), round(_cpu() - cpu, 3)


def _open(root: Path) -> Shard:
    return Shard.open(open_consensus(f"sqlite:///{root}/consensus.db"),
                      open_blob(f"file://{root}/blob"), "s")


def _snapshot_rows(root: Path) -> int:
    return sum(b.num_rows for b in ShardTable(_open(root)).to_batches())


def grow(keys: int, files: int, target_mb: float) -> dict[str, Any]:
    """The ``--grow`` run (module docstring)."""
    import os

    import numpy as np
    import pyarrow as pa

    from upsert_core.ingest import options

    out: dict[str, Any] = {"keys": keys, "files": files, "target_mb": target_mb}
    table = Workload(keys, 1).initial()
    order = pa.array(np.random.default_rng(3).permutation(keys))
    table = table.take(order)  # part files hold keys of every bucket
    with tempfile.TemporaryDirectory(prefix="bench-grow-") as tmp:
        landing = Path(tmp) / "landing"
        step = -(-keys // files)
        for i in range(files):
            write_landing(landing / f"part-{i:05d}.parquet", table.slice(i * step, step))
        options.TARGET_BUCKET_BYTES = int(target_mb * (1 << 20))
        for name, setting in (("growing", "1"), ("fixed", "0")):
            os.environ["UPSERT_AUTO_REBUCKET"] = setting
            root = Path(tmp) / name
            root.mkdir()
            def load(where: Path = root) -> Any:
                return ingest(_open(where), str(landing), IngestRequest())

            report, wall, cpu = measured(load)
            out[name] = {
                "seconds": wall, "cpu": cpu,
                "buckets": [(g["buckets_before"], g["buckets"], g["after_ts"])
                            for g in report.rebucketed],
                "rebucket_bytes_written": sum(int(str(g["bytes_written"]))
                                              for g in report.rebucketed),
                "ingest_bytes_written": report.bytes_written,
            }
            log(f"{name}: {out[name]}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--buckets", type=int, default=4)
    parser.add_argument("--to", type=int, default=16)
    parser.add_argument("--scope", choices=("batch", "global"), default="batch")
    parser.add_argument("--grow", type=int, metavar="K")
    parser.add_argument("--target-mb", type=float, default=8.0)
    args = parser.parse_args(argv)
    if args.grow:
        print(json.dumps(grow(args.keys, args.grow, args.target_mb)))
        return 0
    out: dict[str, Any] = {"keys": args.keys, "rows": args.rows, "batches": args.batches,
                           "from": args.buckets, "to": args.to, "scope": args.scope}
    with tempfile.TemporaryDirectory(prefix="bench-rebucket-") as tmp:
        work = Path(tmp)
        landing, root = work / "landing", work / "shard"
        root.mkdir()
        workload = Workload(args.keys, args.rows)
        request = IngestRequest(buckets=args.buckets, order_scope=args.scope)
        write_landing(landing / "f0000.parquet", workload.initial())
        for i in range(1, args.batches + 1):
            write_landing(landing / f"f{i:04d}.parquet", workload.batch())
        _, wall, cpu = measured(lambda: ingest(_open(root), str(landing), request))
        log(f"loaded {args.keys} keys + {args.batches} batches: {wall} s")
        state = _open(root).state()
        out["shard"] = {"upper": state.upper, "batches": len(state.batches),
                        "updates": state.num_updates(), "blob_bytes": dir_bytes(root / "blob")}
        rows, wall, cpu = measured(lambda: _snapshot_rows(root))
        out["snapshot_before"] = {"rows": rows, "seconds": wall, "cpu": cpu}
        copy = work / "copy"
        shutil.copytree(root, copy)

        report, wall, cpu = measured(lambda: rebucket(_open(root), args.to))
        assert report.changed
        after = dir_bytes(root / "blob")
        _open(root).gc()
        out["rebucket"] = {
            "seconds": wall, "cpu": cpu, "parts_read": report.parts_read,
            "parts_written": report.parts_written, "bytes_read": report.bytes_read,
            "bytes_written": report.bytes_written, "blob_bytes_after": after,
            "blob_bytes_after_gc": dir_bytes(root / "blob"),
        }
        log(f"rebucket {args.buckets} -> {args.to}: {out['rebucket']}")
        rows, wall, cpu = measured(lambda: _snapshot_rows(root))
        out["snapshot_after"] = {"rows": rows, "seconds": wall, "cpu": cpu}

        write_landing(landing / f"f{args.batches + 1:04d}.parquet", workload.batch())
        ingests: dict[str, Any] = {}
        for name, path, count in (("old_count", copy, args.buckets), ("new_count", root,
                                                                        args.to)):
            fresh = InProcessEngine(cache="new")
            _, wall, cpu = measured(lambda p=path, e=fresh: ingest(  # type: ignore[misc]
                _open(p), str(landing), IngestRequest(maintain=False), engine=e))
            ingests[name] = {"buckets": count, "seconds": wall, "cpu": cpu}
        out["next_batch"] = ingests
        log(f"next batch: {ingests}")

        back, wall, cpu = measured(lambda: rebucket(_open(root), args.buckets))
        out["rebucket_back"] = {"seconds": wall, "cpu": cpu, "bytes_read": back.bytes_read,
                                "bytes_written": back.bytes_written}
        log(f"rebucket {args.to} -> {args.buckets}: {out['rebucket_back']}")
        check, wall, cpu = measured(lambda: _open(root).check())
        assert check.ok, check.problems
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
