"""The ingest step of one run: every pending landing file up to the run's greatest partition.

A partition is one landing file F. A run covers one partition or, with the assets'
single-run backfill policy, a key range of them (``context.partition_keys``). Dynamic
partitions are ordered by when they were added, not by name, so the keys of a range are
sorted here and the run's *target* is the greatest name among them. The run calls THE
ingest (``upsert_core.ingest.ingest``, the same driver ``upsertctl ingest`` runs, with the
engine the caller makes) once, stopping before the first pending file whose name sorts
after the target. So whatever partitions a run covers and whatever order runs come in,
files are applied in name order and the shard ends exactly as after one sequential
ingest:

- something pending <= target: every pending file with a name <= target is applied, in
  name order, in ONE ingest (one engine: one Spark session for the whole range, and one
  Spark job for each group of small files, ``resources/spark_paths.py``); files that no
  run covers yet are applied now and their own runs become no-ops.
- every partition of the run already ingested: nothing is read or written and no engine
  is made (no Spark session starts); the result says at which ts each went in.
- a partition not yet ingested and not in the landing (say a broken file removed):
  :class:`IngestError` naming it, after the pending files through the greatest
  partition that IS there were applied (nothing, when there is none).
- a partition the ingest left pending (a file that changed while it was read, or one
  after it): :class:`LandingFileChanged` naming it, after the files before it were
  committed (a retry applies what is still pending).

Invariants: the driver's ``through=target`` stops before the first file after it, so
nothing of it is read or written; a file-level error in a file <= target raises the
pipeline's one-line :class:`IngestError` with earlier files committed (as the CLI). Every
partition of a successful run is in the shard afterwards (``applied_at``), which is what
lets Dagster mark the whole range materialized truthfully. Re-running is idempotent: a
retry applies only what is still pending.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from upsert_core.errors import IngestError, LandingFileChanged
from upsert_core.ingest import Engine, FileReport, IngestRequest, IngestShard, ProgressEvent, ingest
from upsert_core.landing import LandingFile, list_landing, pending
from upsert_core.redact import redact_url


@dataclass
class PartitionIngest:
    """What running one partition (or a range of them) did."""

    partitions: list[str]
    start_upper: int
    upper: int = 0
    seqno: int = 0
    files: list[FileReport] = field(default_factory=list)
    ingested_elsewhere: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: the ts each of ``partitions`` went in at (every one, after a successful run)
    applied_at: dict[str, int] = field(default_factory=dict)

    @property
    def partition(self) -> str:
        """The run's target: its greatest partition name."""
        return self.partitions[-1]

    @property
    def applied_here(self) -> dict[str, int]:
        """The files this run committed, name -> ts."""
        return {f.name: f.ts for f in self.files}

    @property
    def already_ingested_at(self) -> int | None:
        """The target's ts when this run did not apply it (someone else had)."""
        if self.partition in self.applied_here:
            return None
        return self.applied_at.get(self.partition)

    @property
    def no_op(self) -> bool:
        return not self.files

    def total(self, name: str) -> int | float:
        return sum(getattr(f, name) for f in self.files)


def find_file(files: list[LandingFile], name: str, landing: str) -> LandingFile:
    """The landing file called ``name``; :class:`IngestError` if it is not there."""
    for f in files:
        if f.name == name:
            return f
    raise IngestError(f"{name}: no such file in the landing location {redact_url(landing)}")


def run_partitions(partitions: str | Iterable[str]) -> list[str]:
    """A run's partitions in name order, without repeats (a range's keys come in the
    order the partitions were added)."""
    keys = [partitions] if isinstance(partitions, str) else list(partitions)
    if not keys:
        raise IngestError("a run needs at least one partition (landing file)")
    return sorted(set(keys))


def pending_through(
    landing: str, ingested: Mapping[str, int] | Iterable[str], partition: str
) -> tuple[LandingFile, list[LandingFile]]:
    """The partition's file and the pending files (name order) a run for it applies."""
    files = list_landing(landing)
    file = find_file(files, partition, landing)
    return file, [f for f in pending(files, ingested) if f.name <= partition]


def ingest_through(
    shard: IngestShard,
    landing: str,
    request: IngestRequest,
    partitions: str | Sequence[str],
    *,
    engine: Engine | None = None,
    engine_factory: Callable[[], Engine] | None = None,
    progress: Callable[[ProgressEvent], None] | None = None,
) -> PartitionIngest:
    """Ingest every pending file of ``landing`` whose name is <= the greatest of
    ``partitions``, in one ingest (``progress`` receives the driver's events, e.g. to log
    each file). ``engine_factory`` is called only when a file is actually pending, so a
    run whose partitions are all ingested never makes an engine."""
    keys = run_partitions(partitions)
    state = shard.state()
    result = PartitionIngest(partitions=keys, start_upper=state.upper)
    done = state.ingested_files
    if all(k in done for k in keys):
        result.applied_at = {k: done[k] for k in keys}
        result.upper, result.seqno = state.upper, state.seqno
        return result
    files = list_landing(landing)
    listed = {f.name for f in files}
    gone = [k for k in keys if k not in done and k not in listed]
    todo = [k for k in keys if k not in done and k in listed]
    if not todo:
        find_file(files, gone[0], landing)  # raises: nothing of this run is there
    # SUBTLE: a partition whose file was removed before it was ingested (the contract's
    # remedy for a broken file) stays a partition, inside the key range of every later
    # backfill that spans it. The files that are there are applied (through the greatest
    # of them) before the run fails naming it; failing first blocked them for good.

    if engine is None and engine_factory is not None:
        engine = engine_factory()
    report = ingest(shard, landing, request, engine=engine, progress=progress,
                    through=todo[-1])
    result.files.extend(report.files)
    result.ingested_elsewhere.extend(report.ingested_elsewhere)
    result.warnings.extend(report.warnings)
    state = shard.state()
    result.upper, result.seqno = state.upper, state.seqno
    result.applied_at = {k: state.ingested_files[k] for k in keys if k in state.ingested_files}
    missing = [k for k in keys if k not in result.applied_at and k not in gone]
    if missing:
        # SUBTLE: the driver stops without an error at a file that changed while it was
        # read (LandingFileChanged: left pending, with the files after it). The run's
        # partitions are then not all applied: say so, as the error it is, instead of
        # returning a result the caller would report as every partition applied.
        why = "; ".join(result.warnings) or "left pending by the ingest"
        raise LandingFileChanged(
            f"{len(missing)} partition(s) not applied: {missing[:10]} ({why})"
        )
    if gone:
        raise IngestError(
            f"{gone[0]}: no such file in the landing location {redact_url(landing)}"
            f" ({len(gone)} partition(s) without a file: {gone[:10]}); the pending files"
            f" through {todo[-1]} were applied; materialize the other partitions without"
            " these to publish them"
        )
    return result
