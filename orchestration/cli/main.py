"""``upsertctl``: the command line of upsert-platform (see CONTRACT.md, "Command line").

This module only parses arguments, dispatches to :mod:`orchestration.cli.commands` and
turns failures into exit statuses. Invariants:

- Global options (``--consensus``, ``--blob``, ``--debug``) are accepted before and
  after the subcommand; a value after the subcommand wins.
- Data goes to stdout (or ``--out``); progress, summaries, warnings and errors go to
  stderr.
- Exit 0 on success. Any failure exits non-zero with exactly one line
  ``upsertctl: error: <message>`` on stderr (URL secrets redacted): 1 for errors of the
  platform's hierarchy (:class:`UpsertPlatformError`) and unexpected exceptions, 2 for
  bad usage, 130 for Ctrl-C. A traceback is printed (before that line, redacted too)
  only with ``--debug`` or ``UPSERT_DEBUG=1``.
- Heavy modules (pyarrow, the persist layer, Spark) are imported only by the command
  that needs them, so ``--help`` and usage errors are fast.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn

from orchestration.cli.commands import run
from orchestration.cli.config import debug_enabled
from upsert_core.errors import UpsertPlatformError
from upsert_core.read_times import parse_duration, parse_time_text, parse_ts_text
from upsert_core.redact import redact_url

PROG = "upsertctl"
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
MAX_MESSAGE_CHARS = 2000


class UsageError(Exception):
    """Bad command-line usage (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise instead of printing usage and exiting, so
    every failure is reported as the one ``upsertctl: error:`` line."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def one_line(message: str) -> str:
    """``message`` folded to one line (whitespace runs become one space), capped."""
    text = " ".join(message.split())
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[: MAX_MESSAGE_CHARS - 3] + "..."
    return text


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = parse_ts_text(text)  # ASCII digits only: "1_0" and "١" are not integers here
        if value is None:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}")
        if value < minimum:
            if minimum == 0:
                raise argparse.ArgumentTypeError(f"must not be negative: {value}")
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {value}")
        return value

    return parse


def _integer(text: str) -> int:
    """Any integer in ASCII digits (the range is checked where the value is used)."""
    value = parse_ts_text(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}")
    return value


def _time(text: str) -> str:
    """An ISO-8601 time (no zone: UTC), kept as text: ``persist.state.commit_times`` resolves it."""
    if parse_time_text(text) is None:
        raise argparse.ArgumentTypeError(
            f"not an ISO-8601 time to the microsecond: {text!r}"
        )
    return text


def _duration(text: str) -> int:
    """A duration such as ``7d`` or ``12h``, in seconds (``read_times.parse_duration``)."""
    try:
        return parse_duration(text)
    except UpsertPlatformError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


_non_negative = _int_at_least(0)
_positive = _int_at_least(1)


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0: {text}")
    return value


def _add_globals(parser: argparse.ArgumentParser, *, in_subcommand: bool) -> None:
    # In subcommands the defaults are SUPPRESS, so an option not repeated there leaves
    # the value parsed before the subcommand untouched.
    unset = argparse.SUPPRESS if in_subcommand else None
    group = parser.add_argument_group("global options")
    group.add_argument(
        "--consensus",
        metavar="URL",
        default=unset,
        help="consensus URL [UPSERT_CONSENSUS_URL]; default sqlite:///$UPSERT_HOME/consensus.db",
    )
    group.add_argument(
        "--blob",
        metavar="URL",
        default=unset,
        help="blob store URL [UPSERT_BLOB_URL]; default file://$UPSERT_HOME/blob",
    )
    group.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS if in_subcommand else False,
        help="print tracebacks of errors [UPSERT_DEBUG=1]",
    )


def _version() -> str:
    """The installed distribution's version (the checkout's when not installed)."""
    from importlib.metadata import PackageNotFoundError, version  # heavy: only --version

    try:
        return version("upsert-platform")
    except PackageNotFoundError:
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """``--version``: looks the version up only when asked. (argparse's own action takes
    the string when the parser is built; ``importlib.metadata`` then costs every command
    ~25 ms.)"""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS) -> None:
        super().__init__(
            option_strings, dest, nargs=0, default=argparse.SUPPRESS,
            help="show program's version number and exit",
        )

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
        sys.stdout.write(f"{PROG} {_version()}\n")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Ingest keyed change streams into versioned, consolidated shards.",
        epilog="UPSERT_HOME (default ./.upsert) holds the embedded defaults.",
    )
    _add_globals(parser, in_subcommand=False)
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, help_text: str, *, shard: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        if shard:
            p.add_argument("--shard", required=True, metavar="NAME", help="the shard's name")
        _add_globals(p, in_subcommand=True)
        return p

    p = command("ingest", "ingest every pending batch file, in name order, one timestamp each")
    p.add_argument("landing", metavar="LANDING", help="a directory or s3://bucket/prefix")
    p.add_argument("--key", metavar="K1,K2", help="key column(s), comma-separated (default key)")
    p.add_argument("--order", metavar="C1,C2",
                   help="order column(s), comma-separated: compared on the first, then the"
                        " next (default offset)")
    p.add_argument("--deleted-col", metavar="COL", help="delete marker column (default __deleted)")
    p.add_argument("--order-scope", choices=("batch", "global"), help="default batch")
    p.add_argument(
        "--envelope", choices=("plain", "debezium"),
        help="default plain; debezium: each JSON line is a Debezium change event (the order "
        "then names an event field, default source.lsn)",
    )
    p.add_argument(
        "--missing", choices=("null", "keep"),
        help="default null; keep: a value column a row leaves out (or holds the placeholder"
        " in) keeps the key's previous value",
    )
    p.add_argument(
        "--unavailable", metavar="TEXT",
        help="with --missing keep: the placeholder that marks a value left out (default"
        " __debezium_unavailable_value)",
    )
    p.add_argument(
        "--json", action="store_true",
        help="print the run's report as one JSON object on stdout (files, counts, uppers)",
    )
    p.add_argument(
        "--buckets", type=_integer, metavar="N",
        help="upsert state buckets of a new shard (default: 4, or about one per 256 MiB of "
        "state the first file brings, up to 256; fixed once set): a few buckets' state is "
        "in memory at a time, see the README [UPSERT_BUCKETS]",
    )
    p.add_argument(
        "--engine",
        choices=("spark", "local"),
        default=os.environ.get("UPSERT_ENGINE", "spark"),
        help="spark (default; SPARK_REMOTE, else SPARK_MASTER, else a warm local Spark "
        "Connect server, see 'upsertctl spark') or local (in-process) [UPSERT_ENGINE]",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    p = command("snapshot", "the consolidated rows as of a time, one per live key")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--as-of", type=_non_negative, metavar="TS", help="default: the latest")
    when.add_argument("--as-of-time", type=_time, metavar="T",
                      help="the greatest ts committed at or before T (ISO-8601; no zone: UTC)")
    p.add_argument("--format", choices=("jsonl", "parquet", "csv"), default="jsonl")
    p.add_argument("--out", metavar="PATH", help="write to PATH instead of stdout")

    p = command("changes", "consolidated updates with since <= ts < until")
    lower = p.add_mutually_exclusive_group()
    lower.add_argument("--since", type=_non_negative, metavar="TS",
                       help="default: the shard's since")
    lower.add_argument("--since-time", type=_time, metavar="T",
                       help="the first ts committed at or after T (ISO-8601; no zone: UTC)")
    upper = p.add_mutually_exclusive_group()
    upper.add_argument("--until", type=_non_negative, metavar="TS",
                       help="default: the shard's upper")
    upper.add_argument("--until-time", type=_time, metavar="T",
                       help="the first ts committed at or after T, else the upper (ISO-8601)")
    p.add_argument("--format", choices=("jsonl",), default="jsonl")
    p.add_argument("--out", metavar="PATH", help="write to PATH instead of stdout")

    p = command("errors", "the error collection as JSON Lines")
    p.add_argument("--out", metavar="PATH", help="write to PATH instead of stdout")

    p = command("late", "the late collection (global order scope) as JSON Lines")
    p.add_argument("--out", metavar="PATH", help="write to PATH instead of stdout")

    command("inspect", "the shard's metadata as one JSON object")

    p = command("gc", "rollup, compaction, truncation and deletion of unreferenced blobs")
    p.add_argument(
        "--retain",
        type=_positive,
        metavar="N",
        help="keep only the last N timestamps readable (N >= 1; default: the shard's"
        " stored retention, else all history)",
    )
    p.add_argument(
        "--leak-grace",
        type=_non_negative_float,
        metavar="SECONDS",
        help="delete unreferenced (leaked) blobs once GC has seen them unreferenced for this"
        " long (default: one hour; 0 only when no ingest is running)",
    )

    p = command("retention", "show or set how many newest timestamps stay readable (stored"
                " in the shard, applied by gc and after each ingest)")
    choice = p.add_mutually_exclusive_group()
    choice.add_argument("--keep", type=_positive, metavar="N",
                        help="keep the last N timestamps readable (N >= 1)")
    choice.add_argument("--keep-for", type=_duration, metavar="DURATION",
                        help="keep readable what was committed in the last DURATION (e.g. 7d,"
                        " 12h, 30m; s m h d w), and the time before it an as-of read needs")
    choice.add_argument("--keep-all", action="store_true", help="keep all history (default)")

    p = command("rebucket", "change the number of upsert state buckets of an existing shard"
                " (every retained ts stays readable; one commit, as a writer like an ingest)")
    p.add_argument(
        "--buckets", type=_positive, metavar="N", required=True,
        help="the new bucket count (1-4096; a multiple or divisor of the current one"
        " keeps a fraction of the shard in memory at a time, see the README)",
    )

    command("check", "verify consolidation and storage invariants (exit 0 when all hold)")

    command("shards", "the names of the shards in the stores, one per line", shard=False)

    p = command("spark", "the warm local Spark Connect server that Spark ingests start on"
                " the embedded defaults (UPSERT_SPARK_SERVER=off: none): its status, or"
                " stop it", shard=False)
    p.add_argument("action", choices=("status", "stop"))

    p = command("demo", "generate a sample landing and ingest it into shard 'demo'", shard=False)
    p.add_argument(
        "--engine",
        choices=("spark", "local"),
        default=os.environ.get("UPSERT_ENGINE", "spark"),
        help="default spark [UPSERT_ENGINE]",
    )
    p.add_argument("--rows", type=_non_negative, default=1000, metavar="N", help="rows to generate")
    return parser


def _report(message: str) -> None:
    # Last line of defence: the message may quote a URL from a library's own error.
    sys.stderr.write(f"{PROG}: error: {one_line(redact_url(message))}\n")
    sys.stderr.flush()


class StdoutClosed(UpsertPlatformError):
    """A command that writes data was started with its standard output closed."""


class _ClosedStdout(io.TextIOBase):
    """``sys.stdout`` of a command started with it closed (Python leaves it None): a
    command that writes nothing there (an ingest without ``--json``) runs as usual; one
    that writes data fails with one line instead of a traceback."""

    def write(self, text: str) -> int:
        raise StdoutClosed("standard output is closed: nothing was written; give the"
                           " command an open stdout, or --out PATH where it takes one")

    def flush(self) -> None:
        return None


class _ClosedStderr(io.TextIOBase):
    """``sys.stderr`` of a command started with it closed: progress, warnings and
    errors go nowhere, as the user chose; the exit status still says how it ended."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        return None


def _closed_streams() -> None:
    if sys.stdout is None:
        sys.stdout = _ClosedStdout()
    if sys.stderr is None:
        sys.stderr = _ClosedStderr()


def _utf8_stdout() -> None:
    """Make stdout UTF-8, as ``--out`` files are.

    SUBTLE: stdout otherwise takes the locale's encoding. JSON Lines is UTF-8 by
    definition and CSV readers default to it: under a legacy locale (ISO-8859-1, ASCII)
    a snapshot wrote non-UTF-8 bytes, or stopped half-way at the first character the
    locale's encoding lacks.
    """
    stream = sys.stdout
    reconfigure = getattr(stream, "reconfigure", None)
    encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "").replace("_", "")
    if reconfigure is not None and encoding != "utf8":
        reconfigure(encoding="utf-8")


def main(argv: Sequence[str] | None = None, *, defer_pandas: bool = False) -> int:
    """Run ``upsertctl`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status.

    ``defer_pandas`` (the console script): keep pyarrow from importing pandas, which no
    command needs, and allocate with jemalloc (``upsert_core.arrow_startup``); set after
    the arguments parsed, so ``--help`` and usage errors never import pyarrow.
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    _closed_streams()
    debug = debug_enabled("--debug" in args_list)
    try:
        args = build_parser().parse_args(args_list)
        debug = debug_enabled(bool(args.debug))
        if defer_pandas:
            from upsert_core.arrow_startup import (  # heavy: pyarrow, after --help parsed
                defer_pandas as withhold_pandas,
            )
            from upsert_core.arrow_startup import (  # heavy: pyarrow, as above
                keep_freed_memory,
                prefer_jemalloc,
            )

            keep_freed_memory()
            prefer_jemalloc()
            withhold_pandas()
        _utf8_stdout()
        return run(args)
    except UsageError as exc:
        _report(f"{exc} (see {PROG} --help)")
        return EXIT_USAGE
    except KeyboardInterrupt:
        _report("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of stdout went away (e.g. `| head`): stop quietly, and keep Python
        # from complaining again when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_ERROR
    except Exception as exc:  # noqa: BLE001 - the one place every failure becomes one line
        if debug:
            sys.stderr.write(redact_url(traceback.format_exc()))
        if isinstance(exc, UpsertPlatformError):
            _report(str(exc) or type(exc).__name__)
        else:
            _report(f"unexpected {type(exc).__name__}: {exc}")
        return EXIT_ERROR


def run_command(argv: Sequence[str]) -> int:
    """Run ``upsertctl argv`` as the console script does and flush its output; the exit
    status (a reader of stdout that went away makes a success a failure)."""
    status = main(argv, defer_pandas=True)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        status = status or EXIT_ERROR
    return status


def entry() -> NoReturn:
    """Run the command in this process (the console script, ``orchestration.cli.entry``,
    comes here where no warm process runs it), flush, and leave without interpreter
    teardown.

    SUBTLE: by the time ``main`` returns, every result is committed and flushed below.
    Native thread pools (pyarrow's, the Py4J gateway's) have been seen to abort the
    process during interpreter teardown ("terminate called without an active
    exception", exit -6) after a successful run, which would turn success into a
    failure exit status; ``os._exit`` skips that teardown.
    """
    os._exit(run_command(sys.argv[1:]))


if __name__ == "__main__":
    entry()
