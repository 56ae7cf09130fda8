"""A file's task planned against the shard's state: :func:`plan_file`.

One place turns the shard's stored ingest config (``ShardIngestConfig``: options,
checkpoint references, bases, tombstone sets, commit history) and an ingest request into
the :class:`~upsert_core.ingest.tasks.FileTask` every engine runs: the driver
(``pipeline``) plans each file with it, the first-file check its dry run, and a rebucket
(``rebucket``) the loading of bucket states as an ingest at the shard's upper would load
them.

Invariants:

- The task is for ``ts = state.upper``, with the checkpoint, base and tombstone entries
  of buckets ``0 .. options.buckets - 1`` only, and ``checkpoints_current`` as the
  stored ``checkpoint.upper`` says; a fresh commit nonce each time.
"""

from __future__ import annotations

import uuid

from upsert_core.ingest.options import IngestRequest
from upsert_core.ingest.shard_config import ShardIngestConfig, ShardOptions
from upsert_core.ingest.tasks import FileTask
from upsert_core.landing import LandingFile
from upsert_core.persist.state.state import ShardState


def plan_file(
    state: ShardState,
    options: ShardOptions,
    file: LandingFile,
    request: IngestRequest,
    writer_id: str | None = None,
) -> FileTask:
    """The task for ingesting ``file`` at the upper of ``state``, written as ``writer_id``."""
    stored = ShardIngestConfig.read(state.config)
    return FileTask(
        shard_id=state.shard_id,
        ts=state.upper,
        file=file,
        schema_json=options.schema.to_json(),
        order_scope=options.order_scope.value,
        buckets=options.buckets,
        checkpoints={b: stored.checkpoint_refs.get(b, "") for b in range(options.buckets)},
        checkpoints_current=stored.checkpoints_current(state.upper),
        tombstones={
            b: stored.tombstone_refs[b]
            for b in range(options.buckets)
            if b in stored.tombstone_refs
        },
        inline_threshold=request.inline_threshold,
        typed_parts=request.typed_parts,
        values_only=request.values_only,
        part_bases=request.part_bases,
        shard_state=state,
        bases={
            b: stored.checkpoint_bases[b]
            for b in range(options.buckets)
            if b in stored.checkpoint_bases
        },
        commit_nonce=uuid.uuid4().hex,
        history=dict(stored.history),
        writer_id=writer_id,
        value_checks=request.value_checks,
        envelope=options.envelope.value,
        missing=options.missing.value,
        unavailable=options.unavailable,
    )


__all__ = ["plan_file"]
