"""A new shard's first file, checked before the shard is created (issue 23).

Creating a shard is a commit of its own, before any file is applied. A first ingest
whose first file is refused as a whole (a missing key or order column, a conflicting
option) used to leave an empty shard behind, which ``upsertctl shards`` listed and
reads found although nothing was ever ingested into it. :func:`first_file_problem`
finds such a problem first, so the caller refuses the run before it creates anything.

Invariants:

- Creates and writes nothing in the real stores: the file is planned and read against
  a scratch shard of the same name on memory stores, exactly as the ingest would plan
  and read it at ts 0 (the same options, bucket count and validation), so its answer
  is the ingest's own ``"<file>: <problem>"`` line.
- Reads at most one file: the first pending file in name order (at or before
  ``through``), and only when it is at most :data:`PREFLIGHT_BYTES` (a bigger one is
  not read twice; the ingest then finds its problem as before, after the shard exists).
- Reports only file-level problems; row-level problems are the ingest's to record.
- Conflicting or invalid options raise as the ingest raises them (``ConfigError``,
  ``IngestError``), also before anything is created.
"""

from __future__ import annotations

from dataclasses import replace

from upsert_core.ingest.options import IngestRequest, buckets_for_first_file, resolve_options
from upsert_core.ingest.plan import plan_file
from upsert_core.ingest.tasks import read_file
from upsert_core.landing import list_landing, pending
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.shard import Shard

PREFLIGHT_BYTES = 16 * 1024 * 1024
"""A first file up to this size is read before anything costly starts (or is created)."""


def first_file_problem(
    shard_id: str, landing_url: str, request: IngestRequest, *, through: str | None = None
) -> str | None:
    """The file-level problem of the first file a new shard ``shard_id`` would ingest
    from ``landing_url`` (``"<file>: <problem>"``), or None when it has none, nothing is
    pending, or the file is too big to read twice (module docstring)."""
    todo = pending(list_landing(landing_url), ())
    if through is not None:
        todo = [f for f in todo if f.name <= through]
    if not todo or todo[0].size < 0 or todo[0].size > PREFLIGHT_BYTES:
        return None
    file = todo[0]
    scratch = Shard.open(MemoryConsensus(), MemoryBlob(), shard_id, create=True)
    state = scratch.state()
    sized = request if request.buckets is not None else replace(
        request, buckets=buckets_for_first_file(file.size, file.suffix))
    options = resolve_options(state.config, sized)
    read, _ = read_file(plan_file(state, options, file, sized), scratch.blob,
                        write_errors=False)
    return read.file_error
