"""The Dagster code location: every source's assets, checks, jobs, sensor and schedule.

``workspace.yaml`` loads ``defs`` from this module; ``dagster dev``,
``dagster asset materialize -m orchestration.definitions`` and the backfill CLI all use
it. Configuration comes from the environment only (CONTRACT.md):

- sources: ``sources.yaml`` (or ``UPSERT_SOURCES``) plus ``UPSERT_LANDING`` /
  ``UPSERT_SHARD`` / ``UPSERT_KEY`` / ``UPSERT_ORDER`` (see ``orchestration.sources``);
- stores: ``UPSERT_CONSENSUS_URL`` / ``UPSERT_BLOB_URL``, else SQLite and local files
  under ``UPSERT_HOME``, resolved exactly as ``upsertctl`` does;
- Spark: ``SPARK_MASTER`` (or ``SPARK_REMOTE``), else ``local[*]``; ``UPSERT_ENGINE=local``
  runs the in-process engine instead.

Runs use the in-process executor: all steps of a run share one process and so one
SparkSession, instead of one JVM per step.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from dagster import (
    AssetChecksDefinition,
    AssetsDefinition,
    Definitions,
    EnvVar,
    ScheduleDefinition,
    SensorDefinition,
    in_process_executor,
)

from assets.factory import STATE, SourceAssets, build_source_assets
from assets.spec import SourceSpec
from assets.value_checks import build_value_checks
from orchestration.jobs import full_check_job, gc_job, ingest_job
from orchestration.schedules import full_check_schedule, gc_schedule
from orchestration.sensors import landing_sensor
from orchestration.sources import ENV_SOURCES, load_sources
from resources.spark import spark_resource_from_env
from resources.stores import (
    BlobStoreResource,
    ConsensusResource,
    LocalBlobStore,
    SqliteConsensus,
    UrlBlobStore,
    UrlConsensus,
)
from upsert_core.errors import ConfigError
from upsert_core.stores import ENV_BLOB, ENV_CONSENSUS, upsert_home


def store_resources(
    env: Mapping[str, str] | None = None,
) -> tuple[ConsensusResource, BlobStoreResource]:
    """The stores ``upsertctl`` would open in this environment."""
    env = os.environ if env is None else env
    home = upsert_home(env)
    consensus: ConsensusResource = (
        UrlConsensus(consensus_url=EnvVar(ENV_CONSENSUS))
        if env.get(ENV_CONSENSUS)
        else SqliteConsensus(path=str(home / "consensus.db"))
    )
    blob: BlobStoreResource = (
        UrlBlobStore(blob_url=EnvVar(ENV_BLOB))
        if env.get(ENV_BLOB)
        else LocalBlobStore(root=str(home / "blob"))
    )
    return consensus, blob


def store_kinds(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The Dagster kinds of the stores this environment configures: ``postgres`` or
    ``sqlite`` (or ``memory``), and ``s3`` or ``file`` (or ``memory``)."""
    env = os.environ if env is None else env
    consensus = env.get(ENV_CONSENSUS, "").strip().lower()
    blob = env.get(ENV_BLOB, "").strip().lower()
    consensus_kind = ("postgres" if consensus.startswith("postgres")
                      else "memory" if consensus.startswith("mem") else "sqlite")
    blob_kind = "s3" if blob.startswith("s3") else "memory" if blob.startswith("mem") else "file"
    return consensus_kind, blob_kind


def default_resources(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``consensus``, ``blob_store`` and ``spark`` as the environment configures them."""
    consensus, blob = store_resources(env)
    return {"consensus": consensus, "blob_store": blob, "spark": spark_resource_from_env(env)}


def build_definitions(
    sources: Sequence[SourceSpec], resources: Mapping[str, Any] | None = None
) -> Definitions:
    """A code location serving ``sources`` with ``resources`` (default: the environment)."""
    kinds = store_kinds()
    built: list[SourceAssets] = [build_source_assets(s, kinds) for s in sources]
    assets: list[AssetsDefinition] = []
    checks: list[AssetChecksDefinition] = []
    jobs: list[Any] = []
    sensors: list[SensorDefinition] = []
    schedules: list[ScheduleDefinition] = []
    for b in built:
        assets.extend(b.assets)
        checks.append(b.checks)
        values = build_value_checks(b.spec, b.key(STATE))  # only if the source declares some
        if values is not None:
            checks.append(values)
        ingest, gc, full = ingest_job(b), gc_job(b), full_check_job(b)
        jobs.extend([ingest, gc, full])
        sensors.append(landing_sensor(b, ingest))
        schedules.extend([gc_schedule(b.spec, gc), full_check_schedule(b.spec, full)])
    return Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=jobs,
        sensors=sensors,
        schedules=schedules,
        resources=dict(resources) if resources is not None else default_resources(),
        executor=in_process_executor,
    )


def require_sources(sources: Sequence[SourceSpec]) -> Sequence[SourceSpec]:
    """``sources``, or a ConfigError saying how to declare one: a code location that
    serves nothing must fail to load, visibly, not show an empty UI."""
    if not sources:
        raise ConfigError(
            "no sources to serve: write a sources.yaml in the working directory (or point"
            f" {ENV_SOURCES} at one), or set UPSERT_LANDING (with UPSERT_SHARD, UPSERT_KEY,"
            " UPSERT_ORDER) for one source from the environment"
        )
    return sources


SOURCES = require_sources(load_sources())
defs = build_definitions(SOURCES)
