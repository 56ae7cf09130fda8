"""What an ingest reports: per file, totals, the final upper and seqno, progress events.

Invariants: ``files`` lists only files this run committed, in commit (= name = ts)
order; files another writer committed meanwhile are in ``ingested_elsewhere``; totals
are sums over ``files``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class FileReport:
    """One committed file: where it landed and what it did."""

    name: str
    ts: int
    rows_read: int
    inserts: int
    retractions: int
    errors: int
    bytes_written: int
    seconds: float
    rehydrated_buckets: tuple[int, ...] = ()
    attempts: int = 1
    skipped: int = 0
    """Debezium events that change nothing and are not error rows (op t/m)."""
    size: int = -1
    """The file's size as listed (-1: unknown)."""
    landing_bytes_read: int = 0
    """Bytes of the file this run read from the landing: the engine's reads (every
    attempt, every task) and the ledger's digest, when it had to read the file again."""
    digest_bytes_read: int = 0
    """Of ``landing_bytes_read``, the bytes the ledger's digest read (``ingest.ledger``:
    0 when the engine read the file whole in this process)."""
    read_tasks: int = 0
    """Spark tasks that read the file (the split path's read tasks, or the one-stage
    path's slices, each reading it whole); 0 in-process."""
    drain_tasks: int = 0
    """Distinct Spark tasks that drained its buckets; 0 in-process."""
    late_rows: int = 0
    """Rows of the file that were late (global scope; ``ingest.late``)."""
    task_peak_memory: int = 0
    """Bytes: the largest peak resident set of a Spark Python worker over the tasks that
    read or drained the file (``resources.task_memory``); 0 in-process."""
    read_memory_added: int = 0
    """Bytes: the most one such worker grew while its task read (a part of) the file: its
    peak minus its resident set at the task's start (which holds what earlier tasks left,
    such as cached bucket states); bounded by what a task reads. 0 in-process."""
    drain_memory_added: int = 0
    """Bytes: the same growth, from a task's start to the end of a bucket it drained: on
    the split path a bucket task's, bounded by its bucket; on the one-stage path a
    slice's, which read the whole file first. 0 in-process."""
    largest_bucket_keys: int = 0
    """Keys (tombstones included) of the largest state among the buckets the file
    drained, after it: what a drain task holds of its bucket."""


@dataclass
class IngestReport:
    """The outcome of one ingest run."""

    shard: str
    start_upper: int
    upper: int = 0
    seqno: int = 0
    files: list[FileReport] = field(default_factory=list)
    ingested_elsewhere: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    rehydrations: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)  # left for the next run (changed)
    rewritten: list[str] = field(default_factory=list)
    """Listed files rewritten under a name already ingested (``ingest.ledger``): each is
    also named in ``warnings``, and never ingested again."""
    maintenance: dict[str, object] | None = None  # ingest.maintenance, when it ran
    rebucketed: list[dict[str, object]] = field(default_factory=list)
    """The bucket counts the run grew the shard to (``ingest.rebucket.grown_buckets``),
    each ``RebucketReport.to_dict`` with the ts after which it ran."""

    @property
    def rows_read(self) -> int:
        return sum(f.rows_read for f in self.files)

    @property
    def inserts(self) -> int:
        return sum(f.inserts for f in self.files)

    @property
    def retractions(self) -> int:
        return sum(f.retractions for f in self.files)

    @property
    def errors(self) -> int:
        return sum(f.errors for f in self.files)

    @property
    def late_rows(self) -> int:
        return sum(f.late_rows for f in self.files)

    @property
    def skipped(self) -> int:
        return sum(f.skipped for f in self.files)

    @property
    def bytes_written(self) -> int:
        return sum(f.bytes_written for f in self.files)

    @property
    def landing_bytes_read(self) -> int:
        return sum(f.landing_bytes_read for f in self.files)

    @property
    def seconds(self) -> float:
        return sum(f.seconds for f in self.files)

    def totals(self) -> dict[str, int | float]:
        return {
            "files": len(self.files),
            "rows_read": self.rows_read,
            "inserts": self.inserts,
            "retractions": self.retractions,
            "errors": self.errors,
            "late_rows": self.late_rows,
            "skipped": self.skipped,
            "bytes_written": self.bytes_written,
            "landing_bytes_read": self.landing_bytes_read,
            "seconds": self.seconds,
        }


    def to_dict(self) -> dict[str, object]:
        """The report as plain JSON-ready data (``upsertctl ingest --json``): the shard,
        uppers and seqno, totals, one entry per committed file, and the lists of files
        ingested by someone else, left pending, found rewritten (``rewritten_files``),
        warnings and rehydrations."""
        return {
            "shard": self.shard,
            "start_upper": self.start_upper,
            "upper": self.upper,
            "seqno": self.seqno,
            **self.totals(),
            "files": [
                {
                    "name": f.name,
                    "ts": f.ts,
                    "rows_read": f.rows_read,
                    "inserts": f.inserts,
                    "retractions": f.retractions,
                    "errors": f.errors,
                    "late_rows": f.late_rows,
                    "bytes_written": f.bytes_written,
                    "seconds": round(f.seconds, 6),
                    "rehydrated_buckets": list(f.rehydrated_buckets),
                    "attempts": f.attempts,
                    "skipped": f.skipped,
                    "size": f.size,
                    "landing_bytes_read": f.landing_bytes_read,
                    "digest_bytes_read": f.digest_bytes_read,
                    "read_tasks": f.read_tasks,
                    "drain_tasks": f.drain_tasks,
                    "task_peak_memory": f.task_peak_memory,
                    "read_memory_added": f.read_memory_added,
                    "drain_memory_added": f.drain_memory_added,
                    "largest_bucket_keys": f.largest_bucket_keys,
                }
                for f in self.files
            ],
            "ingested_elsewhere": list(self.ingested_elsewhere),
            "pending": list(self.pending),
            "rewritten_files": list(self.rewritten),
            "warnings": list(self.warnings),
            "rehydrations": list(self.rehydrations),
            "maintenance": self.maintenance,
            "rebucketed": list(self.rebucketed),
        }


ProgressKind = Literal["start", "warning", "file_started", "file_done", "file_skipped", "done"]


@dataclass(frozen=True)
class ProgressEvent:
    """A progress notification. ``index``/``total`` count pending files (1-based index);
    ``file`` is set for per-file events, ``report`` for ``file_done`` and ``message``
    for ``warning`` (as soon as it is known: also in the report's ``warnings``)."""

    kind: ProgressKind
    index: int
    total: int
    file: str | None = None
    report: FileReport | None = None
    message: str | None = None
