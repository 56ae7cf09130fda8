"""Jobs per source: the partitioned ingest job and the rollup/GC job.

- ``<source>_ingest``: ``source_snapshot``, ``upsert_state`` (with its checks) and
  ``output_shard`` for one partition (landing file). The sensor and the backfill CLI
  run it; the UI's partition backfills launch the same assets.
- ``<source>_rollup_gc``: ``rollup_gc`` alone (unpartitioned), run by the schedule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dagster import AssetSelection, define_asset_job

from assets.factory import GC, SourceAssets
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
        selection=AssetSelection.assets(*built.ingest_keys),
        description=f"Ingest landing files of {redact_url(repr(built.spec.landing))} through one"
        " partition.",
    )


def gc_job(built: SourceAssets) -> UnresolvedAssetJobDefinition:
    """Rollup, compaction and GC of the source's shard."""
    return define_asset_job(
        name=gc_job_name(built.spec.name),
        selection=AssetSelection.assets(built.key(GC)),
        description=f"Rollup, compaction and GC of shard {built.spec.shard!r}.",
    )
