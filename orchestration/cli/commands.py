"""What each ``upsertctl`` command does, given parsed arguments.

Invariants:

- Read commands (snapshot, changes, errors, late, inspect, check) never create a shard: a
  missing one is :class:`ShardNotFound`. ``ingest`` creates it on first use.
- Data (rows, changes, error rows, inspect/gc/check reports) goes to stdout or
  ``--out``; progress and summaries go to stderr (:mod:`orchestration.cli.progress`).
- Rows are decoded with a schema read AFTER the read started: schemas only append
  columns, so that schema is at least as new as every row the read returns.
- Rows have the shard's visible columns only (``upsert_core.row_view``: a Debezium
  shard's stored order columns are hidden), and changes are consolidated as such.
- Every function returns the process exit status; failures raise (``cli.main`` turns
  them into the one error line).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from orchestration.cli.config import open_shard, store_config
from orchestration.cli.demo import run_demo
from orchestration.cli.ingest import run_ingest
from orchestration.cli.output import dumps, json_row, json_value, row_writer, write_jsonl
from upsert_core.errors import CorruptData, InvariantViolation
from upsert_core.read_times import format_duration
from upsert_core.stores import shard_names, sqlite_file_missing

if TYPE_CHECKING:
    import pyarrow as pa

    from upsert_core.ingest.shard_config import ShardOptions
    from upsert_core.landing import SourceSchema
    from upsert_core.persist.shard import Shard
    from upsert_core.row_view import RowView

EXIT_OK = 0


def shard_options(shard: Shard) -> ShardOptions | None:
    """The shard's ingest options (None before its first ingest committed them)."""
    # heavy: pyarrow and the ingest package, loaded only once a shard is open
    from upsert_core.ingest.shard_config import ShardIngestConfig

    return ShardIngestConfig.read(shard.state().config).options


def shard_view(shard: Shard) -> RowView:
    """The shard's stored schema and the columns reads hide (``upsert_core.row_view``)."""
    from upsert_core.row_view import RowView  # heavy: pyarrow, the ingest's config

    return RowView.of(shard_options(shard))


def _columns(view: RowView) -> list[tuple[str, object]]:
    """The output columns: the shard's visible ones, as ``(name, Arrow type)``."""
    return [(field.name, field.type) for field in view.arrow_schema]


def _decoded(
    schema: SourceSchema | None, batches: Iterator[pa.RecordBatch | pa.Table]
) -> Iterator[tuple[list[dict[str, object]], list[int], list[int]]]:
    """Per batch: decoded rows, their ts and their diffs."""
    from upsert_core.landing import decode_row  # heavy: pyarrow

    for batch in batches:
        rows = batch.column("row").to_pylist()
        if rows and schema is None:
            raise CorruptData("the shard has rows but no stored source schema")
        decoded = [] if schema is None else [decode_row(schema, r) for r in rows]
        yield decoded, batch.column("ts").to_pylist(), batch.column("diff").to_pylist()


# --- read commands ----------------------------------------------------------------------


def cmd_snapshot(args: argparse.Namespace) -> int:
    shard = open_shard(args)
    as_of = _as_of(shard, args)
    if args.format == "parquet":
        return _snapshot_parquet(shard, as_of, args)
    batches = shard.snapshot(as_of)  # raises NotReadable now, not mid-output
    view = shard_view(shard)
    # Decoded with the stored schema; the writer writes the visible columns only (a
    # snapshot holds one row per key, so dropping hidden columns needs no consolidation).
    with row_writer(args.format, _columns(view), args.out) as writer:
        for rows, _ts, diffs in _decoded(view.stored, batches):
            # A live row has diff 1; a larger count (never seen in a consolidated
            # shard) is written that many times rather than hidden.
            writer.write([row for row, d in zip(rows, diffs, strict=True) for _ in range(d)])
    return EXIT_OK


def _as_of(shard: Shard, args: argparse.Namespace) -> int | None:
    """``--as-of``, or the ts ``--as-of-time`` stands for (``persist.state.commit_times``)."""
    from upsert_core.persist.state.commit_times import as_of_ts  # heavy: the persist layer

    if args.as_of_time is None:
        return args.as_of  # no state read needed
    return as_of_ts(shard.state(), args.as_of, args.as_of_time, ("--as-of", "--as-of-time"))


def _snapshot_parquet(shard: Shard, as_of: int | None, args: argparse.Namespace) -> int:
    """Parquet straight from the typed Arrow read (``upsert_core.shard_table``)."""
    import pyarrow as pa

    from upsert_core.shard_table import ShardTable  # heavy: pyarrow

    reader = ShardTable(shard).to_batches(as_of)  # raises NotReadable now
    columns = [(f.name, f.type) for f in reader.schema]
    with row_writer("parquet", columns, args.out) as writer:
        for batch in reader:
            writer.write_table(pa.Table.from_batches([batch]))  # type: ignore[attr-defined]
    return EXIT_OK


def cmd_changes(args: argparse.Namespace) -> int:
    from upsert_core.persist.state.commit_times import changes_ts  # heavy: the persist layer

    shard = open_shard(args)
    state = shard.state()
    since, until = changes_ts(
        state, args.since, args.until, args.since_time, args.until_time,
        ("--since", "--until", "--since-time", "--until-time"),
    )
    lower = state.since if since is None else since
    batches = shard.changes(lower, until)
    view = shard_view(shard)
    names = list(view.names)
    # Each batch holds all updates of its keys, so each is projected on its own.
    visible = (view.project_updates(batch) for batch in batches)

    def lines() -> Iterator[dict[str, object]]:
        for rows, times, diffs in _decoded(view.visible, visible):
            for row, ts, diff in zip(rows, times, diffs, strict=True):
                yield {"row": json_row(names, row), "ts": ts, "diff": diff}

    write_jsonl(lines(), args.out)
    return EXIT_OK


def cmd_errors(args: argparse.Namespace) -> int:
    shard = open_shard(args)
    write_jsonl(
        ({"file": e["file"], "row": e["row"], "reason": e["reason"]} for e in shard.errors()),
        args.out,
    )
    return EXIT_OK


def cmd_late(args: argparse.Namespace) -> int:
    from upsert_core.shard_table import ShardTable  # heavy: pyarrow, the ingest package

    table = ShardTable(open_shard(args))
    write_jsonl(
        (
            {
                "file": rec["file"],
                "row": rec["row"],
                "key": {name: json_value(value) for name, value in rec["key"].items()},
                "order": _json_order(rec["order"]),
                "stored_order": _json_order(rec["stored_order"]),
            }
            for rec in table.late_records()
        ),
        args.out,
    )
    return EXIT_OK


def _json_order(order: object) -> object:
    """An order value (a list for several order columns) made JSON-safe."""
    return [json_value(v) for v in order] if isinstance(order, list) else json_value(order)


def cmd_inspect(args: argparse.Namespace) -> int:
    from upsert_core.shard_summary import shard_summary  # heavy: the ingest's config

    # The summary open_shard().inspect() returns too: one source, the same fields.
    print(dumps(shard_summary(open_shard(args))))
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    from upsert_core.ingest.verify import compare_state  # heavy: pyarrow, the ingest package

    shard = open_shard(args)
    report = shard.check()
    # The upsert state the next ingest starts from must equal the consolidated shard.
    state = compare_state(shard)
    for problem in state.problems:
        report.add("upsert_state", problem)
    report.counts.update(state_keys=state.state_keys, state_live_keys=state.live_keys)
    print(dumps(report.as_dict()))
    errors = report.counts.get("error_rows", 0)
    if not report.ok:
        first = report.problems[0]
        raise InvariantViolation(
            f"check failed for shard {shard.shard_id!r}: {len(report.problems)} problem(s);"
            f" first: {first}"
        )
    sys.stderr.write(
        f"check: shard {shard.shard_id!r} ok: upper {report.counts.get('upper')},"
        f" since {report.counts.get('since')}, {errors} error row(s) (data, not problems)\n"
    )
    return EXIT_OK


def cmd_gc(args: argparse.Namespace) -> int:
    # heavy: pyarrow, the ingest package
    from upsert_core.ingest.maintenance import gc_with_retention

    shard = open_shard(args)
    # Without --retain, the stored retention, applied as ingest maintenance applies it
    # (never forcing a rebuild of upsert state); an explicit --retain N as given. The
    # part typer lets compaction rewrite plain parts as typed ones (fast snapshots).
    options = {} if args.leak_grace is None else {"leak_grace_ms": int(args.leak_grace * 1000)}
    report = gc_with_retention(shard, args.retain, **options)
    print(dumps(report.as_dict()))
    return EXIT_OK


def cmd_rebucket(args: argparse.Namespace) -> int:
    from upsert_core.ingest.rebucket import rebucket  # heavy: pyarrow, the ingest package

    shard = open_shard(args)
    report = rebucket(shard, args.buckets)
    print(dumps(report.to_dict()))
    for warning in report.warnings:
        sys.stderr.write(f"warning: {warning}\n")
    if not report.changed:
        sys.stderr.write(f"rebucket: shard {shard.shard_id!r} already has {report.buckets}"
                         " buckets: nothing changed\n")
    else:
        sys.stderr.write(
            f"rebucket: shard {shard.shard_id!r}: {report.buckets_before} -> {report.buckets}"
            f" buckets at upper {report.upper} ({report.batches} batch(es),"
            f" {report.parts_read} part(s) rewritten as {report.parts_written},"
            f" {report.bytes_written} bytes written, {report.seconds:.1f} s); the parts it"
            f" replaced stay for older states until `upsertctl gc --shard {shard.shard_id}`\n"
        )
    return EXIT_OK


def cmd_shards(args: argparse.Namespace) -> int:
    # heavy: the store modules (sqlite3, SQLAlchemy)
    from upsert_core.persist.location.urls import open_consensus

    config = store_config(args)
    if sqlite_file_missing(config.consensus_url) is None:  # a read creates nothing
        for name in shard_names(open_consensus(config.consensus_url)):
            print(name)
    return EXIT_OK


def cmd_spark(args: argparse.Namespace) -> int:
    from resources import local_spark  # heavy: the pyspark package's paths

    if args.action == "stop":
        using = local_spark.users()
        was = local_spark.stop()
        if not was:
            sys.stderr.write("spark: no local Spark Connect server was running\n")
        elif using:
            pids = ", ".join(str(pid) for pid in using)
            sys.stderr.write(f"spark: stopped the local Spark Connect server while in use by"
                             f" pid {pids}: a file running on it fails (nothing of it is"
                             f" committed); run that command again\n")
        else:
            sys.stderr.write("spark: stopped the local Spark Connect server\n")
    print(dumps(local_spark.status()))
    return EXIT_OK


def cmd_retention(args: argparse.Namespace) -> int:
    shard = open_shard(args)
    if args.keep_for is not None:
        shard.set_retention_for(args.keep_for)
    elif args.keep is not None or args.keep_all:
        shard.set_retention(None if args.keep_all else args.keep)
    state = shard.state()
    keep = shard.retention()
    seconds = shard.retention_for()
    keep_for = None if seconds is None else format_duration(seconds)
    print(dumps({"shard": shard.shard_id, "retention": keep, "retention_keep_for": keep_for,
                 "since": state.since, "upper": state.upper}))
    if keep_for is not None:
        now = "all of it" if keep is None else f"the last {keep} timestamp(s)"
        what = f"what was committed in the last {keep_for} readable ({now} now)"
    else:
        what = "all history" if keep is None else f"the last {keep} timestamp(s) readable"
    sys.stderr.write(f"retention: shard {shard.shard_id!r} keeps {what}"
                     " (applied by gc and after each ingest)\n")
    return EXIT_OK


# --- ingest and demo ----------------------------------------------------------------------


COMMANDS = {
    "ingest": run_ingest,
    "snapshot": cmd_snapshot,
    "changes": cmd_changes,
    "errors": cmd_errors,
    "late": cmd_late,
    "inspect": cmd_inspect,
    "gc": cmd_gc,
    "retention": cmd_retention,
    "rebucket": cmd_rebucket,
    "spark": cmd_spark,
    "shards": cmd_shards,
    "check": cmd_check,
    "demo": run_demo,
}


def run(args: argparse.Namespace) -> int:
    """Run the parsed command; returns its exit status."""
    return COMMANDS[args.command](args)
