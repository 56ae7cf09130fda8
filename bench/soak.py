"""A bounded soak: concurrent ingesters, readers and a GC/compaction loop on one shard.

Loopback only (SQLite + local files by default, ``--postgres URL`` for the consensus,
``--blob s3://bucket/prefix`` for an S3 blob store such as a loopback moto server with
``AWS_ENDPOINT_URL`` set),
bounded in time (``--seconds``, default 120) and in count (``--max-files``). Runs:

- a generator (this process) writing landing files in name order, each a batch of
  upserts and deletes over ``--keys`` keys, while keeping a dict model of the upsert
  semantics and, per timestamp, an order-independent digest of the model's rows
  (``digests.jsonl``, written before the file becomes visible);
- ``--ingesters`` processes re-running the library ingest of the landing in a loop
  (they race for the same files; the shard applies each once);
- ``--readers`` processes reading snapshots at random readable timestamps and checking
  each against the model's digest for that timestamp (and that it is consolidated);
- one process running GC (``--retain``, compaction included) every ``--gc-every`` s;
- with ``--pause-every S``: every S seconds one ingester is stopped (SIGSTOP) for
  ``--pause-for`` seconds, longer than its writer lease (``--writer-lease``), so GC
  fences it and deletes the blobs it wrote; when continued, its commit is refused and it
  redoes the file under a new registration (counted as ``fenced_redos``).

Afterwards (every writer stopped): a final GC with leak grace 0; the shard must pass
``check_shard`` and ``compare_state``, equal the dict model row for row, have exactly
one timestamp per file and hold no unreferenced blob. Each process reports its peak RSS
(VmHWM) and its RSS at a quarter of the run and at the end (bounded memory means the
two stay close). Prints sustained rows/s and p50/p99 commit latency (per file, from
planning to the committed compare-and-append, as the ingest reports it); the last line
is one JSON object. Exit status 1 when any check failed.

    .venv/bin/python bench/soak.py --seconds 120
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import xxhash

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from upsert_core.errors import NotReadable, UpsertPlatformError  # noqa: E402
from upsert_core.ingest import IngestRequest, ingest  # noqa: E402
from upsert_core.ingest.shard_config import CONFIG_SCHEMA  # noqa: E402
from upsert_core.ingest.verify import compare_state  # noqa: E402
from upsert_core.landing import SourceSchema, decode_row  # noqa: E402
from upsert_core.persist.keys import shard_prefix  # noqa: E402
from upsert_core.persist.location.urls import open_blob, open_consensus  # noqa: E402
from upsert_core.persist.maintenance.check import check_shard  # noqa: E402
from upsert_core.persist.shard import Shard  # noqa: E402
from upsert_core.persist.testing import unreferenced_blobs  # noqa: E402

MASK64 = (1 << 64) - 1
REQUEST = IngestRequest(key=("key",), order="offset", buckets=4)


# --- shared helpers ---------------------------------------------------------------------


def _kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def row_hash(row: dict[str, Any]) -> int:
    canonical = json.dumps(sorted((k, v) for k, v in row.items() if v is not None))
    return xxhash.xxh64_intdigest(canonical)


def open_shard(cfg: dict[str, Any]) -> Shard:
    return Shard.open(open_consensus(cfg["consensus"]), open_blob(cfg["blob"]), cfg["shard"])


def snapshot_rows(shard: Shard, ts: int) -> tuple[dict[Any, dict[str, Any]], list[str]]:
    """Decoded rows by key at ``ts``, and consolidation problems seen."""
    schema = SourceSchema.from_json(shard.state().config[CONFIG_SCHEMA])
    rows: dict[Any, dict[str, Any]] = {}
    problems: list[str] = []
    for batch in shard.snapshot(ts, positive_only=False):
        for row, diff in zip(batch.column("row").to_pylist(), batch.column("diff").to_pylist(),
                             strict=True):
            decoded = decode_row(schema, row)
            if diff != 1 or decoded["key"] in rows:
                problems.append(f"ts {ts}: key {decoded['key']} diff {diff} or duplicated")
            rows[decoded["key"]] = decoded
    return rows, problems


class Memory:
    """RSS samples of this process: at start, at a quarter of the run, at the end."""

    def __init__(self, seconds: float) -> None:
        self.quarter_at = time.monotonic() + seconds / 4
        self.start_kb = _kb("VmRSS")
        self.quarter_kb = 0

    def tick(self) -> None:
        if not self.quarter_kb and time.monotonic() >= self.quarter_at:
            self.quarter_kb = _kb("VmRSS")

    def report(self) -> dict[str, int]:
        return {"rss_start_kb": self.start_kb, "rss_quarter_kb": self.quarter_kb,
                "rss_end_kb": _kb("VmRSS"), "rss_peak_kb": _kb("VmHWM")}


# --- the processes ----------------------------------------------------------------------


def ingester(cfg: dict[str, Any], stop: Any, out: Any, index: int) -> None:
    shard = open_shard(cfg)
    memory = Memory(cfg["seconds"])
    latencies: list[float] = []
    rows = files = runs = failures = fenced = renewed = 0
    last_error = ""
    request = dataclasses.replace(REQUEST, writer_lease_ms=int(cfg["writer_lease"] * 1000))
    while True:
        final = stop.is_set()
        runs += 1
        try:
            report = ingest(shard, cfg["landing"], request)
            fenced += sum(1 for w in report.warnings if "fenced" in w)
            renewed += sum(1 for w in report.warnings if "lost its registration" in w)
        except UpsertPlatformError as exc:  # e.g. "concurrently modified": re-run
            failures += 1
            last_error = str(exc)[:200]
            if final:
                continue
            time.sleep(0.01)
            continue
        for f in report.files:
            latencies.append(f.seconds)
            rows += f.rows_read
            files += 1
        memory.tick()
        if final:
            break
        if not report.files:
            time.sleep(0.02)
    out.put({"role": "ingester", "index": index, "latencies": latencies, "rows": rows,
             "files": files, "runs": runs, "failures": failures, "last_error": last_error,
             "fenced_redos": fenced, "renewed_registrations": renewed,
             **memory.report()})


def reader(cfg: dict[str, Any], stop: Any, out: Any, index: int) -> None:
    shard = open_shard(cfg)
    memory = Memory(cfg["seconds"])
    rng = random.Random(cfg["seed"] * 1000 + index)
    digests_path = Path(cfg["digests"])
    expected: dict[int, int] = {}
    reads = not_readable = 0
    problems: list[str] = []
    while not stop.is_set():
        state = shard.state()
        if state.upper == 0:
            time.sleep(0.05)
            continue
        ts = rng.randint(state.since, state.upper - 1)
        if ts not in expected:
            for line in digests_path.read_text().splitlines():
                entry = json.loads(line)
                expected[int(entry["ts"])] = int(entry["digest"])
        try:
            rows, bad = snapshot_rows(shard, ts)
        except NotReadable:
            not_readable += 1  # GC moved since past ts meanwhile
            continue
        reads += 1
        problems.extend(bad)
        digest = sum(row_hash(r) for r in rows.values()) & MASK64
        if digest != expected[ts]:
            problems.append(f"snapshot at ts {ts} differs from the model")
        memory.tick()
    out.put({"role": "reader", "index": index, "reads": reads, "not_readable": not_readable,
             "problems": problems[:20], **memory.report()})


def collector(cfg: dict[str, Any], stop: Any, out: Any, index: int) -> None:
    shard = open_shard(cfg)
    memory = Memory(cfg["seconds"])
    runs = failures = merges = deleted = 0
    seconds: list[float] = []
    while not stop.wait(cfg["gc_every"]):
        try:
            report = shard.gc(retain=cfg["retain"])
        except UpsertPlatformError:
            failures += 1
            continue
        runs += 1
        merges += report.compaction_merges
        deleted += report.parts_deleted + report.rollups_deleted
        seconds.append(report.seconds)
        memory.tick()
    out.put({"role": "gc", "index": index, "runs": runs, "failures": failures,
             "compaction_merges": merges, "blobs_deleted": deleted,
             "max_gc_s": round(max(seconds, default=0.0), 3), **memory.report()})


# --- the generator and the model --------------------------------------------------------


class Generator:
    """Writes landing files in name order and keeps the dict model and its digests."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg["seed"])
        self.landing = Path(cfg["landing"])
        self.model: dict[int, dict[str, Any]] = {}
        self.hashes: dict[int, int] = {}
        self.digest = 0
        self.files = 0
        self.rows = 0
        self.digests = open(cfg["digests"], "a")  # noqa: SIM115 (closed in close())

    def write_file(self) -> None:
        n, keys = self.cfg["rows"], self.cfg["keys"]
        batch: list[dict[str, Any]] = []
        winners: dict[int, dict[str, Any]] = {}
        for r in range(n):
            key = self.rng.randrange(keys)
            row: dict[str, Any] = {"key": key, "offset": self.rng.randrange(10_000)}
            if self.rng.random() < 0.1:
                row["__deleted"] = True
            else:
                row["v"] = f"{self.files}-{r}-{self.rng.randrange(10**9)}"
            batch.append(row)
            # Greatest offset wins within a file; ties go to the later row.
            if key not in winners or row["offset"] >= winners[key]["offset"]:
                winners[key] = row
        for key, row in winners.items():
            self.digest = (self.digest - self.hashes.pop(key, 0)) & MASK64
            self.model.pop(key, None)
            if not row.get("__deleted"):
                self.model[key] = row
                self.hashes[key] = row_hash(row)
                self.digest = (self.digest + self.hashes[key]) & MASK64
        ts = self.files
        self.digests.write(json.dumps({"ts": ts, "digest": self.digest}) + "\n")
        self.digests.flush()
        name = f"{ts:08d}.jsonl"
        tmp = self.landing / f"{name}.tmp"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in batch))
        os.replace(tmp, self.landing / name)  # visible only when complete
        self.files += 1
        self.rows += n

    def close(self) -> None:
        self.digests.close()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def final_checks(cfg: dict[str, Any], gen: Generator) -> dict[str, Any]:
    shard = open_shard(cfg)
    ingest(shard, cfg["landing"], REQUEST)  # nothing should be pending
    gc_report = shard.gc(leak_grace_ms=0)
    problems: list[str] = []
    state = shard.state()
    if state.upper != gen.files:
        problems.append(f"upper {state.upper} != files written {gen.files}")
    if sorted(state.ingested_files.values()) != list(range(gen.files)):
        problems.append("ingested files do not take one timestamp each")
    check = check_shard(shard)
    problems.extend(check.problems)
    comparison = compare_state(shard)
    problems.extend(comparison.problems)
    rows, bad = snapshot_rows(shard, state.upper - 1)
    problems.extend(bad)
    model = {k: {"key": k, "offset": r["offset"], "v": r.get("v")} for k, r in gen.model.items()}
    if rows != model:
        diff = {k for k in rows.keys() | model.keys() if rows.get(k) != model.get(k)}
        problems.append(f"final snapshot differs from the dict model ({len(diff)} keys differ)")
    leaked = unreferenced_blobs(shard)
    if leaked:
        problems.append(f"{len(leaked)} blob(s) leaked after a final GC")
    return {"problems": problems, "upper": state.upper, "since": state.since,
            "live_keys": len(rows), "leaked_blobs": len(leaked),
            "final_gc_leaked_deleted": gc_report.leaked_blobs_deleted,
            "blob_keys": sum(1 for _ in shard.blob.list_keys(shard_prefix(shard.shard_id)))}


# --- the driver -------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=120.0, help="load phase length")
    p.add_argument("--max-files", type=int, default=100_000, help="stop after this many files")
    p.add_argument("--ingesters", type=int, default=3)
    p.add_argument("--readers", type=int, default=2)
    p.add_argument("--rows", type=int, default=2000, help="rows per landing file")
    p.add_argument("--keys", type=int, default=20_000, help="distinct keys")
    p.add_argument("--backlog", type=int, default=4, help="pending files kept ahead")
    p.add_argument("--retain", type=int, default=20, help="gc --retain (N >= 1)")
    p.add_argument("--gc-every", type=float, default=2.0, help="seconds between GC runs")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--writer-lease", type=float, default=900.0,
                   help="seconds an ingester's writer registration lives without a heartbeat")
    p.add_argument("--pause-every", type=float, default=0.0,
                   help="stop one ingester (SIGSTOP) every this many seconds (0: never)")
    p.add_argument("--pause-for", type=float, default=0.0,
                   help="how long a stopped ingester stays stopped (default: 2x the lease)")
    p.add_argument("--postgres", metavar="URL", help="PostgreSQL consensus URL (loopback)")
    p.add_argument("--blob", metavar="URL",
                   help="blob store URL (default: files in the work dir); e.g. s3://bucket/soak")
    p.add_argument("--workdir", type=Path, help="default: a fresh temp dir, removed after")
    args = p.parse_args(argv)
    if args.retain < 1:  # the GC process would otherwise count every run as a failure
        p.error(f"--retain must be >= 1, got {args.retain}")
    if args.writer_lease <= 0:
        p.error(f"--writer-lease must be > 0, got {args.writer_lease}")
    if args.pause_every and not args.pause_for:
        args.pause_for = 2 * args.writer_lease
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="upsert-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "landing").mkdir(exist_ok=True)
    cfg: dict[str, Any] = {
        "consensus": args.postgres or f"sqlite:///{workdir / 'consensus.db'}",
        "blob": args.blob or f"file://{workdir / 'blob'}",
        "shard": f"soak-{uuid.uuid4().hex[:8]}",
        "landing": str(workdir / "landing"),
        "digests": str(workdir / "digests.jsonl"),
        "seconds": args.seconds,
        "seed": args.seed,
        "retain": args.retain,
        "gc_every": args.gc_every,
        "writer_lease": args.writer_lease,
    }
    gen = Generator({**cfg, "rows": args.rows, "keys": args.keys})
    watcher = open_shard(cfg)  # creates the shard before the processes race for it
    ctx = mp.get_context("spawn")
    stop, gc_stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=ingester, args=(cfg, stop, out, i))
             for i in range(args.ingesters)]
    procs += [ctx.Process(target=reader, args=(cfg, stop, out, i)) for i in range(args.readers)]
    procs.append(ctx.Process(target=collector, args=(cfg, gc_stop, out, 0)))
    for proc in procs:
        proc.start()
    started = time.monotonic()
    deadline = started + args.seconds
    upper = 0
    pauses = 0
    paused: tuple[int, float] | None = None  # (pid, continue at)
    next_pause = started + args.pause_every if args.pause_every else float("inf")
    rng = random.Random(args.seed)
    while time.monotonic() < deadline and gen.files < args.max_files:
        now = time.monotonic()
        if paused is None and now >= next_pause:
            pid = procs[rng.randrange(args.ingesters)].pid
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
            paused, pauses = (pid, now + args.pause_for), pauses + 1
        elif paused is not None and now >= paused[1]:
            os.kill(paused[0], signal.SIGCONT)
            paused, next_pause = None, now + args.pause_every
        upper = watcher.upper
        if gen.files - upper < args.backlog:
            gen.write_file()
        else:
            time.sleep(0.01)
    if paused is not None:
        os.kill(paused[0], signal.SIGCONT)
    gen.close()
    stop.set()  # ingesters finish what is pending, readers stop
    while watcher.upper < gen.files and any(p.is_alive() for p in procs[: args.ingesters]):
        time.sleep(0.05)
    load_seconds = time.monotonic() - started
    gc_stop.set()
    results = [out.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
    final = final_checks(cfg, gen)

    ingesters = [r for r in results if r["role"] == "ingester"]
    readers = [r for r in results if r["role"] == "reader"]
    gc_result = next(r for r in results if r["role"] == "gc")
    latencies = [x for r in ingesters for x in r["latencies"]]
    problems = final["problems"] + [p for r in readers for p in r["problems"]]
    rss = {f"{r['role']}{r['index']}": {k: v for k, v in r.items() if k.startswith("rss_")}
           for r in results}
    summary = {
        "seconds": round(load_seconds, 1),
        "consensus": "postgres" if args.postgres else "sqlite",
        "blob": args.blob.split("://", 1)[0] if args.blob else "file",
        "ingesters": args.ingesters, "readers": args.readers,
        "files": gen.files, "rows": gen.rows,
        "rows_per_s": round(gen.rows / load_seconds, 1),
        "commit_latency_p50_s": round(percentile(latencies, 0.50), 4),
        "commit_latency_p99_s": round(percentile(latencies, 0.99), 4),
        "files_committed_by": [r["files"] for r in ingesters],
        "ingest_run_failures": sum(r["failures"] for r in ingesters),
        "writer_lease_s": args.writer_lease, "pauses": pauses,
        "fenced_redos": sum(r["fenced_redos"] for r in ingesters),
        "renewed_registrations": sum(r["renewed_registrations"] for r in ingesters),
        "ingest_last_errors": sorted({r["last_error"] for r in ingesters if r["last_error"]}),
        "reads_verified": sum(r["reads"] for r in readers),
        "reads_not_readable": sum(r["not_readable"] for r in readers),
        "gc_runs": gc_result["runs"], "gc_failures": gc_result["failures"],
        "compaction_merges": gc_result["compaction_merges"],
        "gc_blobs_deleted": gc_result["blobs_deleted"], "max_gc_s": gc_result["max_gc_s"],
        "max_rss_mb": round(max(r["rss_peak_kb"] for r in results) / 1024, 1),
        "rss": rss,
        **{k: v for k, v in final.items() if k != "problems"},
        "problems": problems[:20],
        "ok": not problems,
    }
    print(f"soak: {gen.files} files, {gen.rows} rows in {load_seconds:.1f} s ="
          f" {summary['rows_per_s']} rows/s; commit latency p50"
          f" {summary['commit_latency_p50_s']} s, p99 {summary['commit_latency_p99_s']} s;"
          f" {summary['reads_verified']} snapshots verified; {gc_result['runs']} GC runs;"
          f" {pauses} writer pauses, {summary['fenced_redos']} fenced redos,"
          f" {summary['renewed_registrations']} renewed registrations;"
          f" max RSS {summary['max_rss_mb']} MB; {'OK' if not problems else 'PROBLEMS'}",
          file=sys.stderr)
    for name, values in rss.items():
        print(f"  {name}: " + ", ".join(f"{k}={v}" for k, v in values.items()), file=sys.stderr)
    print(json.dumps(summary))
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
