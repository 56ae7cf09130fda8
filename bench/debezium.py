"""Benchmark of the Debezium path (issue 25) beside the plain one, on the same rows.

The workload is :class:`bench._workload.WideWorkload` (issue 22's): N keys loaded, then
change batches of R rows (70% updates, 20% new keys, 10% deletes, 5% in-batch
duplicates with an order just below or above the original's); columns ``key``,
``offset``, ``__deleted``, ``v_int`` int64, ``v_str`` (random, 50-70 ASCII characters),
``v_float`` float64. Every file of it is written, untimed, as:

- ``plain``: the workload's Parquet file as is (``--order offset``, delete marker
  ``__deleted``);
- ``debezium-parquet``: one Debezium change event per row, as Kafka Connect's S3 sink
  writes them with ``ParquetFormat``: ``before`` and ``after`` structs of the table's
  row (``key``, ``v_int``, ``v_str``, ``v_float``), a ``source`` struct (PostgreSQL's
  fields, ``lsn`` = the row's offset; or MySQL's with ``--order binlog``: ``file``,
  ``pos``, ``row`` in the offset's order), ``op``, ``ts_ms``, a null ``transaction``
  struct, and the Avro schema in the footer (``parquet.avro.schema``). The initial load
  is snapshot reads (``op`` ``r``), a batch's rows are ``u`` (a live key) or ``c`` (a
  new one); a delete is ``op`` ``d`` with ``before`` only (the key, other fields null:
  PostgreSQL's default replica identity) and a null ``after``; updates have a null
  ``before`` (likewise);
- ``debezium-jsonl``: the same events as JSON Lines in Kafka Connect's JsonConverter
  wrapper with ``schemas.enable``: ``{"schema": <the envelope's Connect schema>,
  "payload": EVENT}`` per line;
- ``debezium-jsonl-bare`` (only with ``--bare``): the same events, one bare object a line.

Each variant is ingested into its own shard (its own SQLite consensus and blob
directory) by one fresh ``upsertctl ingest --engine local`` process per file (``python
-m orchestration.cli``), after an untimed ``os.sync()``; the variants take turns file by
file (initial load of each, then batch 1 of each, ...), so a change of the machine's
load falls on all of them alike. Measured per process: wall clock from launch to exit,
CPU time (user + system of the process, from ``os.wait4``; steadier than wall clock on a
busy machine) and peak RSS. Reported per variant: the initial load, the median batch,
and the ratios debezium / plain of both. The load average is recorded before and after.

Check: the three shards' final snapshots must hold the same rows: (key, v_int, v_str,
v_float) sorted by key. A ``FAIL`` line says when they do not. The columns a Debezium
shard's snapshot shows besides ``after``'s are reported (none: its order columns,
``source.lsn`` or ``source.file``, ``source.pos``, ``source.row``, are stored in its rows
but hidden from reads, ``upsert_core.row_view``).

Before timing, one ``upsertctl --help`` runs untimed (bytecode, page cache).

Usage: ``.venv/bin/python -m bench.debezium [--quick] [--keys N] [--batch-rows R]
[--batches K] [--order lsn|binlog] [--order-scope batch|global] [--bare] [--out PATH]``
(defaults 1M keys, 100k rows, 5 batches, ``bench/out/debezium.md``; ``--quick``: 100k
keys, 10k rows, 3 batches). Progress goes to stderr; a markdown table goes to stdout and
``--out``; the LAST line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench._measure import rounded
from bench._workload import WIDE_SCHEMA, WideWorkload, write_landing

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "out" / "debezium.md"
ROW_COLUMNS = ["key", "v_int", "v_str", "v_float"]
"""The table's row: ``after``/``before`` of an event, the plain file's value columns."""
TARGETS = {"debezium-parquet": 1.3, "debezium-jsonl": 3.0}
"""Issue 25's targets: per-batch time of the variant / the plain one's, at most."""
ORDERS = {"lsn": ("source.lsn",), "binlog": ("source.file", "source.pos", "source.row")}
BINLOG_SPAN = 1_000_000
"""With ``--order binlog``: offset = (binlog file number - 1) * BINLOG_SPAN + pos."""
TS_MS0 = 1_764_000_000_000


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- the events ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Events:
    """One workload file as change events: the columns every writer below needs."""

    table: pa.Table  # the workload's rows (WIDE_SCHEMA)
    ops: pa.Array  # "r", "c", "u" or "d"
    order: str  # "lsn" or "binlog"

    @property
    def deleted(self) -> np.ndarray:
        return self.table.column("__deleted").to_numpy(zero_copy_only=False)


def to_events(table: pa.Table, first_new_key: int | None, order: str) -> Events:
    """``table``'s rows as events: snapshot reads when ``first_new_key`` is None (the
    initial load), else ``d`` for deletes, ``c`` for keys from ``first_new_key`` on
    (new in this batch), ``u`` for the others."""
    deleted = table.column("__deleted").to_numpy(zero_copy_only=False)
    if first_new_key is None:
        ops = np.full(len(deleted), "r", dtype=object)
    else:
        keys = table.column("key").to_numpy()
        ops = np.where(deleted, "d", np.where(keys >= first_new_key, "c", "u"))
    return Events(table, pa.array(ops.tolist(), pa.string()), order)


def _source_arrays(events: Events) -> dict[str, pa.Array]:
    """The ``source`` struct's fields, PostgreSQL's or MySQL's connector's."""
    offsets = events.table.column("offset").combine_chunks()
    n = len(offsets)
    ts_ms = pc.add(pc.divide(offsets, 1000), TS_MS0)
    snapshot = pc.if_else(pc.equal(events.ops, "r"), "true", "false")
    common = {
        "version": pa.repeat("2.7.3.Final", n),
        "connector": pa.repeat("postgresql" if events.order == "lsn" else "mysql", n),
        "name": pa.repeat("bench", n),
        "ts_ms": ts_ms,
        "snapshot": snapshot,
        "db": pa.repeat("bench", n),
    }
    if events.order == "lsn":
        return {**common, "sequence": pa.nulls(n, pa.string()),
                "schema": pa.repeat("public", n), "table": pa.repeat("wide", n),
                "txId": pc.add(pc.divide(offsets, 100), 700), "lsn": offsets,
                "xmin": pa.nulls(n, pa.int64())}
    number = pc.add(pc.divide(offsets, BINLOG_SPAN), 1)
    files = pc.binary_join_element_wise(
        "mysql-bin.", pc.utf8_lpad(pc.cast(number, pa.string()), 6, "0"), "")
    pos = pc.subtract(offsets, pc.multiply(pc.divide(offsets, BINLOG_SPAN), BINLOG_SPAN))
    return {**common, "table": pa.repeat("wide", n), "server_id": pa.repeat(223344, n),
            "gtid": pa.nulls(n, pa.string()), "file": files, "pos": pos,
            "row": pa.repeat(pa.scalar(0, pa.int32()), n), "thread": pa.repeat(7, n),
            "query": pa.nulls(n, pa.string())}


TRANSACTION = pa.struct([("id", pa.string()), ("total_order", pa.int64()),
                         ("data_collection_order", pa.int64())])


def events_table(events: Events) -> pa.Table:
    """The events as Kafka Connect's S3 sink writes them with ``ParquetFormat``."""
    table, deleted = events.table, events.deleted
    image = [table.column(c).combine_chunks() for c in ROW_COLUMNS]
    before = pa.StructArray.from_arrays(image, names=ROW_COLUMNS, mask=pa.array(~deleted))
    after = pa.StructArray.from_arrays(image, names=ROW_COLUMNS, mask=pa.array(deleted))
    source_fields = _source_arrays(events)
    source = pa.StructArray.from_arrays(list(source_fields.values()),
                                        names=list(source_fields))
    n = table.num_rows
    out = pa.table({
        "before": before, "after": after, "source": source, "op": events.ops,
        "ts_ms": pc.add(source_fields["ts_ms"], 3),
        "transaction": pa.nulls(n, TRANSACTION),
    })
    avro = json.dumps(_avro_schema(source.type))
    return out.replace_schema_metadata({b"parquet.avro.schema": avro.encode()})


def _avro_type(arrow: pa.DataType) -> str:
    return {pa.int64(): "long", pa.int32(): "int", pa.string(): "string",
            pa.float64(): "double"}[arrow]


def _avro_schema(source: pa.StructType) -> dict[str, Any]:
    """The Avro schema Kafka Connect's Avro converter makes of the envelope."""
    ns = "bench.public.wide"
    value = {"type": "record", "name": "Value", "namespace": ns, "fields": [
        {"name": f.name, "type": _avro_type(f.type) if f.name == "key"
         else ["null", _avro_type(f.type)], **({} if f.name == "key" else {"default": None})}
        for f in WIDE_SCHEMA if f.name in ROW_COLUMNS]}
    src = {"type": "record", "name": "Source", "namespace": "io.debezium.connector",
           "fields": [{"name": f.name, "type": ["null", _avro_type(f.type)],
                       "default": None} for f in source]}
    return {"type": "record", "name": "Envelope", "namespace": ns,
            "connect.name": f"{ns}.Envelope",
            "fields": [
                {"name": "before", "type": ["null", value], "default": None},
                {"name": "after", "type": ["null", f"{ns}.Value"], "default": None},
                {"name": "source", "type": src},
                {"name": "op", "type": "string"},
                {"name": "ts_ms", "type": ["null", "long"], "default": None},
                {"name": "transaction", "type": ["null", {
                    "type": "record", "name": "block", "namespace": "event",
                    "fields": [{"name": "id", "type": "string"},
                               {"name": "total_order", "type": "long"},
                               {"name": "data_collection_order", "type": "long"}]}],
                 "default": None},
            ]}


def _connect_type(arrow: pa.DataType) -> str:
    return {pa.int64(): "int64", pa.int32(): "int32", pa.string(): "string",
            pa.float64(): "double"}[arrow]


def connect_schema(source: pa.StructType) -> dict[str, Any]:
    """The envelope's Connect schema, as JsonConverter writes it with ``schemas.enable``."""
    def row(side: str) -> dict[str, Any]:
        return {"type": "struct", "optional": True, "name": "bench.public.wide.Value",
                "field": side, "fields": [
                    {"type": _connect_type(f.type), "optional": f.name != "key",
                     "field": f.name} for f in WIDE_SCHEMA if f.name in ROW_COLUMNS]}

    return {"type": "struct", "optional": False, "name": "bench.public.wide.Envelope",
            "version": 1, "fields": [
                row("before"), row("after"),
                {"type": "struct", "optional": False, "field": "source",
                 "name": "io.debezium.connector.Source",
                 "fields": [{"type": _connect_type(f.type), "optional": True,
                             "field": f.name} for f in source]},
                {"type": "string", "optional": False, "field": "op"},
                {"type": "int64", "optional": True, "field": "ts_ms"},
                {"type": "struct", "optional": True, "field": "transaction",
                 "name": "event.block", "version": 1, "fields": [
                     {"type": "string", "optional": False, "field": "id"},
                     {"type": "int64", "optional": False, "field": "total_order"},
                     {"type": "int64", "optional": False,
                      "field": "data_collection_order"}]},
            ]}


def write_jsonl(path: Path, events: pa.Table, wrapper: bool) -> int:
    """The events of ``events`` (:func:`events_table`'s) as JSON Lines, with Kafka
    Connect's ``schema``/``payload`` wrapper or bare; returns the file's size."""
    head = ""
    if wrapper:
        schema = connect_schema(events.schema.field("source").type)
        head = '{"schema":' + json.dumps(schema, separators=(",", ":")) + ',"payload":'
    tail = "}" if wrapper else ""
    dumps = json.JSONEncoder(separators=(",", ":")).encode
    with path.open("w") as out:
        for batch in events.to_batches(max_chunksize=20_000):
            out.write("".join(head + dumps(event) + tail + "\n" for event in batch.to_pylist()))
    return path.stat().st_size


VARIANTS = ("plain", "debezium-parquet", "debezium-jsonl", "debezium-jsonl-bare")
SUFFIX = {"plain": "parquet", "debezium-parquet": "parquet", "debezium-jsonl": "jsonl",
          "debezium-jsonl-bare": "jsonl"}


def write_files(root: Path, variants: Sequence[str], n_keys: int, rows: int, batches: int,
                order: str) -> dict[str, list[Path]]:
    """Every workload file written as each variant; ``{variant: [initial, batch...]}``."""
    workload = WideWorkload(n_keys, rows)
    files: dict[str, list[Path]] = {v: [] for v in variants}
    next_key = n_keys
    for i in range(batches + 1):
        table = workload.initial() if i == 0 else workload.batch()
        events = to_events(table, None if i == 0 else next_key, order)
        next_key = max(next_key, int(pc.max(table.column("key")).as_py()) + 1)
        as_events = events_table(events)
        name = "0000-initial" if i == 0 else f"{i:04d}-batch"
        for variant in variants:
            path = root / variant / f"{name}.{SUFFIX[variant]}"
            path.parent.mkdir(parents=True, exist_ok=True)
            if variant == "plain":
                write_landing(path, table)
            elif variant == "debezium-parquet":
                write_landing(path, as_events)
            else:
                write_jsonl(path, as_events, wrapper=variant == "debezium-jsonl")
            files[variant].append(path)
        log(f"  {name}: {table.num_rows} rows written as {len(variants)} variants")
    return files


# --- processes -----------------------------------------------------------------------------


@dataclass
class Proc:
    """A finished child: wall clock launch to exit, CPU time (user + system), peak RSS."""

    seconds: float
    cpu_s: float
    peak_mb: float


def run(command: Sequence[str], env: dict[str, str]) -> Proc:
    """Run ``command`` to completion after an untimed ``os.sync()``; a failure raises
    with the child's stderr shown. Rusage is the child's own (``os.wait4``)."""
    os.sync()
    with tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(list(command), env=env, stdout=subprocess.DEVNULL,
                                stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - started
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            err.seek(0)
            log(err.read().decode(errors="replace"))
            raise RuntimeError(f"{list(command)} exited with {code}")
    return Proc(seconds, usage.ru_utime + usage.ru_stime, round(usage.ru_maxrss / 1024, 1))


# --- the run -------------------------------------------------------------------------------


def load_average() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def shard_urls(work: Path) -> tuple[str, str]:
    return f"sqlite:///{work / 'consensus.db'}", f"file://{work / 'blob'}"


def ingest_options(variant: str, order: str, scope: str) -> list[str]:
    common = ["--key", "key", "--order-scope", scope]
    if variant == "plain":
        return [*common, "--order", "offset"]
    return [*common, "--envelope", "debezium", "--order", ",".join(ORDERS[order])]


def compare(snapshots: dict[str, pa.Table]) -> dict[str, Any]:
    """Each Debezium shard's final rows against the plain shard's (module docstring)."""
    def rows(table: pa.Table) -> pa.Table:
        return table.select(ROW_COLUMNS).sort_by("key").combine_chunks().cast(
            pa.schema([WIDE_SCHEMA.field(c) for c in ROW_COLUMNS]))

    want_rows = rows(snapshots["plain"])
    out: dict[str, Any] = {"final_rows": {v: t.num_rows for v, t in snapshots.items()},
                           "extra_columns": {}, "equal": {}}
    for variant, table in snapshots.items():
        if variant == "plain":
            continue
        out["extra_columns"][variant] = [c for c in table.column_names
                                         if c not in ROW_COLUMNS]
        out["equal"][variant] = rows(table).equals(want_rows)
    return out


def measure(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    variants = [v for v in VARIANTS if args.bare or v != "debezium-jsonl-bare"]
    figures: dict[str, Any] = {
        "keys": args.keys, "batch_rows": args.batch_rows, "batches": args.batches,
        "order": ",".join(ORDERS[args.order]), "order_scope": args.order_scope,
        "variants": variants, "load_average_start": load_average(),
    }
    log(f"workload: {args.keys} keys, {args.batches} batches of {args.batch_rows} rows, "
        f"as {', '.join(variants)}")
    started = time.perf_counter()
    files = write_files(root / "files", variants, args.keys, args.batch_rows, args.batches,
                        args.order)
    figures["workload_gen_s"] = time.perf_counter() - started
    figures["landing_bytes"] = {v: {"initial": paths[0].stat().st_size,
                                    "batch": paths[1].stat().st_size}
                                for v, paths in files.items()}

    env = {**os.environ}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # a user's Python caches bytecode
    cli = [sys.executable, "-m", "orchestration.cli"]
    log("warm-up (untimed): upsertctl --help")
    run([*cli, "--help"], env)

    runs: dict[str, list[Proc]] = {v: [] for v in variants}
    landings = {v: root / v / "landing" for v in variants}
    envs = {}
    for v in variants:
        landings[v].mkdir(parents=True)
        consensus, blob = shard_urls(root / v)
        envs[v] = {**env, "UPSERT_CONSENSUS_URL": consensus, "UPSERT_BLOB_URL": blob}
    log("ingest: a fresh upsertctl ingest --engine local per file, variants in turn")
    for i in range(args.batches + 1):
        for v in variants:
            path = files[v][i]
            os.link(path, landings[v] / path.name)
            command = [*cli, "ingest", "--shard", v.replace("-", "_"), "--engine", "local",
                       "--no-progress", *ingest_options(v, args.order, args.order_scope),
                       str(landings[v])]
            proc = run(command, envs[v])
            runs[v].append(proc)
            log(f"  {v} {path.name}: {proc.seconds:.3f}s wall, {proc.cpu_s:.3f}s CPU, "
                f"peak RSS {proc.peak_mb:.0f} MB")
    figures["load_average_end"] = load_average()

    for v, procs in runs.items():
        figures[v] = {
            "initial_s": procs[0].seconds, "initial_cpu_s": procs[0].cpu_s,
            "batch_s_list": [p.seconds for p in procs[1:]],
            "batch_cpu_s_list": [p.cpu_s for p in procs[1:]],
            "batch_s": median([p.seconds for p in procs[1:]]),
            "batch_cpu_s": median([p.cpu_s for p in procs[1:]]),
            "peak_initial_mb": procs[0].peak_mb,
            "peak_batches_mb": max(p.peak_mb for p in procs[1:]),
        }
    plain = figures["plain"]
    for v in variants[1:]:
        f = figures[v]
        for name in ("batch_s", "batch_cpu_s", "initial_s", "initial_cpu_s"):
            f[f"{name}_ratio"] = f[name] / plain[name] if plain[name] else None

    from upsert_core import open_shard

    snapshots = {v: open_shard(v.replace("-", "_"), *shard_urls(root / v)).snapshot()
                 for v in variants}
    figures.update(compare(snapshots))
    figures["targets"] = {
        v: {"max_ratio": limit, "batch_ratio": figures[v]["batch_s_ratio"],
            "met": figures[v]["batch_s_ratio"] <= limit}
        for v, limit in TARGETS.items() if v in figures}
    return figures


# --- reporting -----------------------------------------------------------------------------


def report(f: dict[str, Any]) -> list[str]:
    title = (f"{f['keys']:,} keys, {f['batches']} batches of {f['batch_rows']:,} rows, "
             f"order {f['order']}, scope {f['order_scope']}")
    lines = [f"### Debezium beside plain: {title}", "",
             "| variant | MB initial / batch file | initial load s (CPU s) | batch median s "
             "(CPU s) | batch / plain, wall (CPU) | initial / plain, wall (CPU) | peak RSS MB "
             "initial / batches |",
             "|---|---:|---:|---:|---:|---:|---:|"]

    def ratio(v: dict[str, Any], name: str) -> str:
        if f"{name}_ratio" not in v:
            return "1"
        wall, cpu = v[f"{name}_ratio"], v[name.replace("_s", "_cpu_s") + "_ratio"]
        return f"{wall:.2f}x ({cpu:.2f}x)"

    for variant in f["variants"]:
        v, size = f[variant], f["landing_bytes"][variant]
        lines.append(
            f"| {variant} | {size['initial'] / 1e6:.1f} / {size['batch'] / 1e6:.1f} | "
            f"{v['initial_s']:.2f} ({v['initial_cpu_s']:.2f}) | {v['batch_s']:.2f} "
            f"({v['batch_cpu_s']:.2f}) | {ratio(v, 'batch_s')} | {ratio(v, 'initial_s')} | "
            f"{v['peak_initial_mb']:.0f} / {v['peak_batches_mb']:.0f} |")
    lines.append("")
    for variant in f["variants"]:
        batches = ", ".join(f"{s:.2f}" for s in f[variant]["batch_s_list"])
        lines.append(f"Batches, s, {variant}: {batches}.")
    for variant, target in f["targets"].items():
        verdict = "met" if target["met"] else "MISSED"
        lines.append(f"Target {variant} per batch <= {target['max_ratio']}x plain: "
                     f"{target['batch_ratio']:.2f}x, {verdict}.")
    lines.append(f"Load average (1, 5, 15 min): {f['load_average_start']} at the start, "
                 f"{f['load_average_end']} at the end.")
    for variant, extra in f["extra_columns"].items():
        lines.append(f"Columns of the {variant} shard besides `after`'s: "
                     + (", ".join(f"`{c}`" for c in extra) or "none") + ".")
    rows = f["final_rows"]
    if all(f["equal"].values()):
        lines.append(f"Final snapshots agree: {rows['plain']:,} rows, equal on sorted "
                     "(key, v_int, v_str, v_float).")
    for variant, equal in f["equal"].items():
        if not equal:
            lines.append(f"FAIL: the {variant} shard's final snapshot differs from the plain "
                         f"one ({rows[variant]:,} rows against {rows['plain']:,})")
    return lines


def positive(parser: argparse.ArgumentParser, name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            parser.error(f"{name} must be a whole number of at least 1, got {text!r}")
        return value
    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 100k keys, 10k-row batches, 3 batches")
    parser.add_argument("--keys", type=positive(parser, "--keys"), help="keys loaded (1M)")
    parser.add_argument("--batch-rows", type=positive(parser, "--batch-rows"),
                        help="rows per batch (100k)")
    parser.add_argument("--batches", type=positive(parser, "--batches"),
                        help="change batches (5)")
    parser.add_argument("--order", choices=sorted(ORDERS), default="lsn",
                        help="the Debezium order: source.lsn (PostgreSQL, default) or "
                             "source.file,source.pos,source.row (MySQL's binlog)")
    parser.add_argument("--order-scope", choices=("batch", "global"), default="batch")
    parser.add_argument("--bare", action="store_true",
                        help="also JSON Lines of bare events (no schema/payload wrapper)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="markdown output")
    args = parser.parse_args(argv)
    quick = {"keys": 100_000, "batch_rows": 10_000, "batches": 3}
    full = {"keys": 1_000_000, "batch_rows": 100_000, "batches": 5}
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    with tempfile.TemporaryDirectory(prefix="bench-debezium-") as tmp:
        figures = measure(args, Path(tmp))
    lines = report(figures)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(json.dumps(rounded(figures)))
    return 0 if all(figures["equal"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
