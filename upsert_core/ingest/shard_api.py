"""The one shard protocol of the ingest: what the driver (:func:`~upsert_core.ingest.ingest`)
and every engine (``Engine.run_file``) need of a shard handle.

``persist.shard.Shard`` provides it; tests wrap a ``Shard`` to inject races.
"""

from __future__ import annotations

from typing import Protocol

from upsert_core.persist.location import Blob
from upsert_core.persist.state.state import ShardState
from upsert_core.persist.write.append import AppendRequest, AppendResult
from upsert_core.persist.write.writers import WriterLease


class IngestShard(Protocol):
    """What the ingest needs of a shard handle (``persist.shard.Shard`` provides it)."""

    @property
    def shard_id(self) -> str: ...

    @property
    def blob(self) -> Blob: ...

    def state(self) -> ShardState: ...

    def compare_and_append(
        self,
        request: AppendRequest,
        *,
        writer_id: str | None = None,
    ) -> AppendResult: ...

    def writer_lease(self, lease_duration_ms: int = ...) -> WriterLease: ...


__all__ = ["IngestShard"]
