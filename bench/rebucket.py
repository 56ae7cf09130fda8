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

Usage: ``.venv/bin/python -m bench.rebucket [--keys N] [--rows R] [--batches K]
[--buckets N] [--to M] [--scope batch|global]``. Progress on stderr; the LAST line on
stdout is one JSON object.
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--buckets", type=int, default=4)
    parser.add_argument("--to", type=int, default=16)
    parser.add_argument("--scope", choices=("batch", "global"), default="batch")
    args = parser.parse_args(argv)
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
