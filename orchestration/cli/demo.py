"""``upsertctl demo``: generate a sample landing, ingest it into shard ``demo``, explain.

Runs on whatever stores the global options name (by default the embedded SQLite
consensus and local blob store under ``$UPSERT_HOME``). The landing is
``$UPSERT_HOME/demo-landing`` (see :mod:`orchestration.cli.demo_landing`).

Idempotent: the sample files are never rewritten and the ingest only takes files not
yet ingested, so a second run ingests nothing and the shard's upper stays put.
The report (what was ingested, and the commands to read it) goes to stdout; ingest
progress goes to stderr.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from orchestration.cli.config import open_stores, store_config
from orchestration.cli.demo_landing import generate_landing
from orchestration.cli.ingest import ingest_landing
from orchestration.cli.progress import file_line
from upsert_core.redact import redact_url

DEMO_SHARD = "demo"
LANDING_DIR = "demo-landing"


def _command_prefix(args: argparse.Namespace) -> str:
    """How the user can run upsertctl again with the same stores."""
    exe = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if exe is not None and exe.name == "upsertctl":
        try:
            shown = os.path.relpath(exe)
        except ValueError:
            shown = str(exe)
        prog = shown if "/" in shown else "upsertctl"
    else:
        prog = f"{Path(sys.executable).name} -m orchestration.cli"
    parts = [prog]
    if getattr(args, "consensus", None):
        parts += ["--consensus", shlex.quote(args.consensus)]
    if getattr(args, "blob", None):
        parts += ["--blob", shlex.quote(args.blob)]
    return " ".join(parts)


def run_demo(args: argparse.Namespace) -> int:
    # heavy: pyarrow, only when the demo runs
    from upsert_core.ingest import IngestRequest
    from upsert_core.persist.shard import Shard

    config = store_config(args)
    landing = config.home / LANDING_DIR
    written, facts = generate_landing(landing, args.rows)
    consensus, blob = open_stores(config)
    shard = Shard.open(consensus, blob, DEMO_SHARD, create=True)
    # The demo's options are the defaults, spelled out so a reader sees them.
    request = IngestRequest(key=("key",), order="offset", deleted_col="__deleted",
                            order_scope="batch")
    report = ingest_landing(shard, str(landing), request, args.engine)

    out = sys.stdout
    out.write(f"upsertctl demo: shard {DEMO_SHARD!r}\n")
    # The URLs may carry a password (UPSERT_CONSENSUS_URL): never print it.
    out.write(f"  consensus {redact_url(config.consensus_url)}\n")
    out.write(f"  blob      {redact_url(config.blob_url)}\n")
    out.write(f"  landing   {landing}\n")
    if written:
        out.write(f"generated {len(written)} sample batch file(s): {', '.join(written)}\n")
    else:
        out.write("the sample batch files already exist; they were left as they are\n")
    if report.files:
        out.write(f"ingested {len(report.files)} file(s) with the {args.engine} engine:\n")
        for f in report.files:
            out.write(f"  {file_line(f)}\n")
        out.write(
            f"totals: {report.rows_read} row(s) read, {report.inserts} insert(s),"
            f" {report.retractions} retraction(s), {report.errors} error row(s)\n"
        )
    else:
        out.write("nothing new to ingest: every sample file was ingested by an earlier run\n")
    out.write(f"upper {report.start_upper} -> {report.upper} (seqno {report.seqno})\n")
    out.write(
        "what to look for:\n"
        f"  {facts.duplicate_key}: two rows in {facts.files[0]}; the first has the greater"
        " offset and wins\n"
        f"  {facts.tie_key}: two rows with the same offset in {facts.files[0]}; the later"
        " one wins\n"
        f"  {facts.deleted_key}: deleted in {facts.files[1]} (which also adds the column"
        " 'tier')\n"
        f"  {facts.unchanged_key}: re-sent unchanged in {facts.files[2]}: no change at"
        " that ts\n"
        f"  {facts.late_key}: updated in {facts.files[3]} with a LOWER offset; order scope"
        " 'batch' applies it (a later batch overrides)\n"
        f"  {facts.bad_row[0]} row {facts.bad_row[1]}: a null key, kept in the error"
        " collection\n"
    )
    last = max(report.upper - 1, 0)
    prog = _command_prefix(args)
    out.write("read it with:\n")
    for cmd in (
        f"snapshot --shard {DEMO_SHARD}",
        f"snapshot --shard {DEMO_SHARD} --as-of 0 --format csv",
        f"changes --shard {DEMO_SHARD} --since {last} --until {last + 1}",
        f"errors --shard {DEMO_SHARD}",
        f"inspect --shard {DEMO_SHARD}",
        f"check --shard {DEMO_SHARD}",
    ):
        out.write(f"  {prog} {cmd}\n")
    if config.uses_home and not os.environ.get("UPSERT_HOME"):
        out.write(f"(from this directory, or with UPSERT_HOME={config.home})\n")
    return 0
