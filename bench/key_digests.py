"""Benchmark of the upsert keys' digests: per-key ``xxhash`` against the numpy XXH3-128.

One process per measurement (so each peak RSS is its own): the keys of ``N`` rows are
encoded with the bulk encoder (``codec.encode_columns_in_chunks``, as validation does),
then digested either way into the ``binary(16)`` Arrow array the ingest keeps:

- ``old``: ``pa.array(codec.key_digests(encoded), pa.binary(16))``, one Python call and
  one bytes object per key (what validation did);
- ``new``: ``codec.key_digest_array(encoded)`` (``upsert_core.key_hash``).

Keys: ``int64`` (the wide workload's key column, ``0 .. N-1``: 10-byte encodings) or
``str`` (random ASCII strings of 20-60 characters: 26-66-byte encodings). Figures: CPU
seconds of the digest alone (``time.process_time``), minor page faults during it, the
process's peak RSS and its peak RSS just before the digest (both ``VmHWM``), with the
allocators ``upsertctl`` sets (``arrow_startup.prefer_jemalloc``,
``keep_freed_memory``).

Usage: ``.venv/bin/python -m bench.key_digests [--n N ...] [--repeats R]``; runs old and
new interleaved R times per key kind and N and prints the best CPU time of each, and one
JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _keys(kind: str, n: int) -> pa.Array:
    if kind == "int64":
        return pa.array(np.arange(n, dtype=np.int64))
    rng = np.random.default_rng(7)
    lens = rng.integers(20, 61, n)
    alphabet = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
                             np.uint8)
    data = alphabet[rng.integers(0, len(alphabet), int(lens.sum()), dtype=np.uint8)]
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))


def _one(kind: str, n: int, how: str) -> dict[str, float]:
    """Run in the child: encode, then digest, and measure the digest."""
    from upsert_core.arrow_startup import keep_freed_memory, prefer_jemalloc

    prefer_jemalloc()
    keep_freed_memory()
    from upsert_core.codec import encode_columns_in_chunks, key_digest_array, key_digests

    encoded = encode_columns_in_chunks([_keys(kind, n)])
    assert encoded is not None
    before_peak = _status_mb("VmHWM")
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.process_time()
    if how == "old":
        digests = pa.array(key_digests(encoded), pa.binary(16))
    else:
        digests = key_digest_array(encoded)
    cpu = time.process_time() - start
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    assert len(digests) == n
    return {"cpu_s": round(cpu, 3), "minor_faults": faults,
            "peak_rss_mb": round(_status_mb("VmHWM")), "peak_before_mb": round(before_peak)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--kinds", nargs="+", default=["int64", "str"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, n, how = args.child
        print(json.dumps(_one(kind, int(n), how)))
        return
    figures: dict[str, dict[str, float]] = {}
    for kind in args.kinds:
        for n in args.n:
            for _ in range(args.repeats):
                for how in ("old", "new"):
                    out = subprocess.run(
                        [sys.executable, "-m", "bench.key_digests", "--child", kind, str(n), how],
                        cwd=ROOT, check=True, capture_output=True, text=True,
                    ).stdout.strip().splitlines()[-1]
                    got = json.loads(out)
                    name = f"{kind}_{n}_{how}"
                    best = figures.get(name)
                    if best is None or got["cpu_s"] < best["cpu_s"]:
                        figures[name] = got
            old, new = figures[f"{kind}_{n}_old"], figures[f"{kind}_{n}_new"]
            print(f"{kind:5} n={n:>10,}: cpu {old['cpu_s']:.3f} s -> {new['cpu_s']:.3f} s, "
                  f"faults {old['minor_faults']:,} -> {new['minor_faults']:,}, peak RSS "
                  f"{old['peak_rss_mb']:.0f} -> {new['peak_rss_mb']:.0f} MB (before the "
                  f"digest {old['peak_before_mb']:.0f} / {new['peak_before_mb']:.0f} MB)",
                  file=sys.stderr, flush=True)
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main()
