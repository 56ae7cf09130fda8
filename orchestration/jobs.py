"""Jobs per source: the partitioned ingest job and the rollup/GC job.

- ``<source>_ingest``: ``source_snapshot``, ``upsert_state`` (with its checks) and
  ``output_shard`` for one partition (landing file). The sensor and the backfill CLI
  run it; the UI's partition backfills launch the same assets.
- ``<source>_rollup_gc``: ``rollup_gc`` alone (unpartitioned), run by the schedule.
- ``<source>_full_check``: the full-history checks of ``upsert_state`` alone (no asset
  runs), run by its schedule; the ingest job runs only the batch-scoped checks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dagster import AssetSelection, define_asset_job

from assets.checks import full_check_keys
from assets.factory import GC, STATE, SourceAssets
from upsert_core.redact import redact_url

if TYPE_CHECKING:
    from dagster._core.definitions.unresolved_asset_job_definition import (
        UnresolvedAssetJobDefinition,
    )


def ingest_job_name(source: str) -> str:
    return f"{source}_ingest"


def gc_job_name(source: str) -> str:
    return f"{source}_rollup_gc"


def ingest_job(built: SourceAssets) -> UnresolvedAssetJobDefinition:
    """One partition's ingest, its checks, and the published shard."""
    return define_asset_job(
        name=ingest_job_name(built.spec.name),
        selection=AssetSelection.assets(*built.ingest_keys)
        - AssetSelection.checks(*full_check_keys(built.key(STATE))),
        description=f"Ingest landing files of {redact_url(repr(built.spec.landing))} through one"
        " partition.",
    )


def full_check_job_name(source: str) -> str:
    return f"{source}_full_check"


def full_check_job(built: SourceAssets) -> UnresolvedAssetJobDefinition:
    """The full-history checks of the source's shard (non-blocking, scheduled)."""
    return define_asset_job(
        name=full_check_job_name(built.spec.name),
        selection=AssetSelection.checks(*full_check_keys(built.key(STATE))),
        description=f"Full-history checks of shard {built.spec.shard!r}: consolidation at"
        " every readable time, every referenced blob, every bucket's checkpoint.",
    )


def gc_job(built: SourceAssets) -> UnresolvedAssetJobDefinition:
    """Rollup, compaction and GC of the source's shard."""
    return define_asset_job(
        name=gc_job_name(built.spec.name),
        selection=AssetSelection.assets(built.key(GC)),
        description=f"Rollup, compaction and GC of shard {built.spec.shard!r}.",
    )
