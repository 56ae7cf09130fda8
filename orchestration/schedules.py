"""Schedules: ``rollup_gc`` of each source on its ``gc_cron`` (``sources.yaml``), and the
full-history checks of each source daily (:data:`FULL_CHECK_CRON`).

Stopped by default, like every schedule in a fresh deployment: turn it on in the UI
(Automation) or with ``dagster schedule start``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dagster import DefaultScheduleStatus, ScheduleDefinition

from assets.spec import SourceSpec

if TYPE_CHECKING:
    from dagster._core.definitions.unresolved_asset_job_definition import (
        UnresolvedAssetJobDefinition,
    )


def gc_schedule(spec: SourceSpec, job: UnresolvedAssetJobDefinition) -> ScheduleDefinition:
    """Runs the source's rollup/GC job on ``spec.gc_cron``."""
    return ScheduleDefinition(
        name=f"{spec.name}_rollup_gc_schedule",
        job=job,
        cron_schedule=spec.gc_cron,
        default_status=DefaultScheduleStatus.STOPPED,
        description=f"Rollup, compaction and GC of shard {spec.shard!r} ({spec.gc_cron}).",
    )


FULL_CHECK_CRON = "0 3 * * *"
"""When the full-history checks run: daily, at night (their cost follows the shard)."""


def full_check_schedule(
    spec: SourceSpec, job: UnresolvedAssetJobDefinition
) -> ScheduleDefinition:
    """Runs the source's full-history check job daily (non-blocking checks)."""
    return ScheduleDefinition(
        name=f"{spec.name}_full_check_schedule",
        job=job,
        cron_schedule=FULL_CHECK_CRON,
        default_status=DefaultScheduleStatus.STOPPED,
        description=f"Full-history checks of shard {spec.shard!r} ({FULL_CHECK_CRON}).",
    )
