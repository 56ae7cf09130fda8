"""The ingest step of one partition: every pending landing file up to and including F.

A partition is one landing file F. Running partition F runs THE ingest
(``upsert_core.ingest.ingest``, the same driver ``upsertctl ingest`` runs, with the
engine the caller passes) but stops before the first pending file whose name sorts
after F. So whatever order partitions run in, files are applied in name order and the
shard ends exactly as after one sequential ingest:

- F pending: every pending file with a name <= F is applied, in name order (earlier
  partitions that have not run yet are applied now; their own runs become no-ops).
- F already ingested: nothing is read or written; the result says at which ts it was.
- F not in the landing: :class:`IngestError` naming F (nothing is applied).

Invariants: the driver's ``through=F`` stops before the first file after F, so
nothing of it is read or written; a file-level error in a file <= F raises the
pipeline's one-line :class:`IngestError` with earlier files committed (as the CLI).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from upsert_core.errors import IngestError
from upsert_core.ingest import Engine, FileReport, IngestRequest, IngestShard, ProgressEvent, ingest
from upsert_core.landing import LandingFile, list_landing, pending
from upsert_core.redact import redact_url


@dataclass
class PartitionIngest:
    """What running one partition did."""

    partition: str
    start_upper: int
    upper: int = 0
    seqno: int = 0
    already_ingested_at: int | None = None
    files: list[FileReport] = field(default_factory=list)
    ingested_elsewhere: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

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
    partition: str,
    *,
    engine: Engine | None = None,
    progress: Callable[[ProgressEvent], None] | None = None,
) -> PartitionIngest:
    """Ingest every pending file of ``landing`` whose name is <= ``partition``
    (``progress`` receives the driver's events, e.g. to log each file)."""
    state = shard.state()
    result = PartitionIngest(partition=partition, start_upper=state.upper)
    if partition in state.ingested_files:
        result.already_ingested_at = state.ingested_files[partition]
        result.upper, result.seqno = state.upper, state.seqno
        return result
    find_file(list_landing(landing), partition, landing)

    report = ingest(shard, landing, request, engine=engine, progress=progress,
                    through=partition)
    result.files.extend(report.files)
    result.ingested_elsewhere.extend(report.ingested_elsewhere)
    result.warnings.extend(report.warnings)
    state = shard.state()
    result.upper, result.seqno = state.upper, state.seqno
    if partition in state.ingested_files and not any(f.name == partition for f in result.files):
        result.already_ingested_at = state.ingested_files[partition]
    return result
