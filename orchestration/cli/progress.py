"""Ingest progress and summaries on stderr (never stdout, which is for data).

On a terminal, a one-line bar is redrawn in place while a file is being ingested; in
any case one line per committed file is printed, so logs and tests see the same facts.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from upsert_core.ingest.report import FileReport, IngestReport, ProgressEvent

BAR_WIDTH = 24


def file_line(report: FileReport) -> str:
    return (
        f"{report.name}: ts {report.ts}, {report.rows_read} row(s) read, "
        f"{report.inserts} insert(s), {report.retractions} retraction(s), "
        f"{report.errors} error row(s), "
        + (f"{report.late_rows} late row(s), " if report.late_rows else "")
        + f"{report.bytes_written} bytes, {report.seconds:.2f}s"
    )


def summary_line(report: IngestReport) -> str:
    if not report.files:
        return (
            f"nothing new to ingest into shard {report.shard!r}; upper stays {report.upper}"
        )
    return (
        f"ingested {len(report.files)} file(s) into shard {report.shard!r}: "
        f"{report.rows_read} row(s) read, {report.inserts} insert(s), "
        f"{report.retractions} retraction(s), {report.errors} error row(s); "
        + (f"{report.late_rows} late row(s) (upsertctl late); " if report.late_rows else "")
        + (f"{report.skipped} Debezium event(s) skipped (op t/m); " if report.skipped else "")
        + f"upper {report.start_upper} -> {report.upper} (seqno {report.seqno})"
        + _maintenance(report)
        + "".join(f"; grew to {r['buckets']} buckets after ts {r['after_ts']}"
                  for r in report.rebucketed)
    )


def _maintenance(report: IngestReport) -> str:
    """``"; maintenance: ..."`` when the ingest's maintenance changed something."""
    done = report.maintenance
    if not done:
        return ""
    parts = []
    if done["since_before"] != done["since_after"]:
        parts.append(f"since {done['since_before']} -> {done['since_after']}")
    if done["gc_ran"]:
        parts.append(f"compacted {done['batches_before']} -> {done['batches_after']} batches")
    return "; maintenance: " + ", ".join(parts) if parts else ""


class ProgressPrinter:
    """A ``progress`` callback for ``upsert_core.ingest.ingest``."""

    def __init__(self, out: TextIO | None = None, *, bar: bool | None = None) -> None:
        self.out = sys.stderr if out is None else out
        self.bar = self.out.isatty() if bar is None else bar
        self._drawn = False
        self.warned: list[str] = []  # warnings printed as they came (``warning`` events)

    def _clear(self) -> None:
        if self._drawn:
            self.out.write("\r\x1b[2K")
            self._drawn = False

    def _line(self, text: str) -> None:
        self._clear()
        self.out.write(text + "\n")
        self.out.flush()

    def _draw(self, index: int, total: int, name: str) -> None:
        done = max(index - 1, 0)
        filled = BAR_WIDTH * done // max(total, 1)
        bar = "#" * filled + "-" * (BAR_WIDTH - filled)
        self.out.write(f"\r\x1b[2K[{bar}] {done}/{total} ingesting {name}")
        self.out.flush()
        self._drawn = True

    def __call__(self, event: ProgressEvent) -> None:
        if event.kind == "start":
            self._line(f"{event.total} pending file(s)")
        elif event.kind == "warning" and event.message is not None:
            self._line(f"warning: {event.message}")
            self.warned.append(event.message)
        elif event.kind == "file_started" and self.bar:
            self._draw(event.index, event.total, event.file or "")
        elif event.kind == "file_done" and event.report is not None:
            self._line(f"[{event.index}/{event.total}] " + file_line(event.report))
        elif event.kind == "file_skipped":
            self._line(
                f"[{event.index}/{event.total}] {event.file}: already ingested by another"
                " writer, skipped"
            )
        elif event.kind == "done":
            self._clear()

    def close(self) -> None:
        self._clear()
        self.out.flush()
