"""``upsertctl ingest``: run the ingest pipeline on a landing with the chosen engine.

- ``--engine spark`` (default): the Spark step (``resources.spark_ingest.SparkEngine``)
  on ``get_spark()``: the Spark Connect server at ``SPARK_REMOTE`` when set (attaching
  takes about a second), else ``SPARK_MASTER``, else the warm local Spark Connect server
  (``resources.local_spark``: the first command starts it, later ones attach), else
  (``UPSERT_SPARK_SERVER=off``) ``local[*]`` in this process. The session is
  created on the first file that runs (``resources.engines``: nothing pending, no
  Spark) and stopped before the command returns (for Connect: the remote session is
  released, the server keeps running).
- ``--engine local``: the in-process engine (no JVM; fast for small landings).

Options not given are ``None`` so that a shard's stored options apply (conflicting
ones are a :class:`ConfigError` from the pipeline). Row errors do not fail the command:
their count is in the summary on stderr. A file-level error stops the run with that
file's one-line error; files committed before it stay committed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from orchestration.cli.config import open_shard
from orchestration.cli.progress import ProgressPrinter, summary_line
from upsert_core.errors import ConfigError, IngestError, ShardNotFound
from upsert_core.read_times import parse_ts_text

if TYPE_CHECKING:
    from upsert_core.ingest import IngestReport, IngestRequest
    from upsert_core.persist.shard import Shard


def parse_key(text: str | None) -> tuple[str, ...] | None:
    """``--key a,b`` -> ``("a", "b")``; None when not given."""
    if text is None:
        return None
    names = tuple(part.strip() for part in text.split(","))
    if not names or any(not n for n in names):
        raise ConfigError(f"--key {text!r}: give column names separated by commas")
    return names


def _column(text: str | None, option: str) -> str | None:
    """A column option's value; None when not given.

    SUBTLE: an empty value (``--order "$COL"`` with the variable unset) is an error, not
    "not given": the shard's default column would otherwise be fixed in its place.
    """
    if text is None:
        return None
    if not text.strip():
        raise ConfigError(f"{option} {text!r}: give a column name")
    return text


def request_from_args(args: argparse.Namespace) -> IngestRequest:
    from upsert_core.ingest import IngestRequest  # heavy: pyarrow, the ingest package

    return IngestRequest(
        key=parse_key(args.key),
        order=_column(args.order, "--order"),
        deleted_col=_column(args.deleted_col, "--deleted-col"),
        order_scope=args.order_scope,
        buckets=_buckets(args),
        envelope=getattr(args, "envelope", None),
        missing=getattr(args, "missing", None),
        unavailable=getattr(args, "unavailable", None),
    )


def _buckets(args: argparse.Namespace) -> int | None:
    """``--buckets``, else ``UPSERT_BUCKETS``, else None (the shard's or the default)."""
    if getattr(args, "buckets", None) is not None:
        return int(args.buckets)
    text = os.environ.get("UPSERT_BUCKETS", "").strip()
    if not text:
        return None
    value = parse_ts_text(text)  # ASCII digits only, as --buckets
    if value is None:
        raise ConfigError(f"UPSERT_BUCKETS must be an integer, got {text!r}")
    return value


def ingest_landing(
    shard: Shard,
    landing: str,
    request: IngestRequest,
    engine_name: str,
    *,
    progress_bar: bool | None = None,
) -> IngestReport:
    """Ingest every pending file of ``landing``, reporting progress on stderr."""
    # heavy: pyarrow, the ingest package and (for --engine spark) pyspark, only to ingest
    from resources.engines import engine_named
    from upsert_core.ingest import ingest

    printer = ProgressPrinter(bar=progress_bar)
    try:
        with engine_named(engine_name) as engine:
            report = ingest(shard, landing, request, engine=engine, progress=printer)
    finally:
        printer.close()
    for warning in report.warnings:
        if warning not in printer.warned:  # not printed as it came
            sys.stderr.write(f"warning: {warning}\n")
    return report


def run_ingest(args: argparse.Namespace) -> int:
    from upsert_core.persist.keys import claim_writer_token  # heavy: shard state (~35 ms)

    # The ingest registers a writer id in the shard, which protects and fences what it
    # writes (upsert_core.persist.write.writers); this legacy process token only names blobs
    # written outside any registration (rollups).
    claim_writer_token()
    # heavy: pyarrow, only for an ingest
    from upsert_core.ingest.first_file import first_file_problem

    request = request_from_args(args)
    try:
        shard = open_shard(args)
    except ShardNotFound:
        # A new shard is created only once its landing can be listed and its first file
        # has no file-level problem: a typo in the landing path or a first file without
        # its key column must not leave an empty shard behind.
        problem = first_file_problem(args.shard, args.landing, request)
        if problem is not None:
            raise IngestError(problem) from None
        shard = open_shard(args, create=True)
    report = ingest_landing(
        shard, args.landing, request, args.engine, progress_bar=False if args.no_progress else None
    )
    sys.stderr.write(summary_line(report) + "\n")
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(report.to_dict(), sort_keys=True) + "\n")
    return 0
