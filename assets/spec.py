"""What one source is: a landing location feeding one shard with fixed ingest options.

Loaded from ``sources.yaml`` and the environment by ``orchestration.sources``; turned
into an asset group by :mod:`assets.factory`. Plain data, no Dagster.

Invariants: ``name`` is a Dagster identifier (checked by the loader) and is the asset
group and key prefix; ``shard`` is the shard the assets write; options left ``None``
mean "the shard's stored option, or the default for a new shard". ``checks`` are the
source's value checks (``sources.yaml`` ``checks:``), passed with every ingest request
and never stored in the shard. ``retention`` (``sources.yaml`` ``retention:``) is stored
in the shard by each ingest run when it differs (:meth:`SourceSpec.store_retention`):
``("keep", N)``, ``("keep_for", seconds)`` or ``("all", None)``; None leaves the shard's
stored retention as ``upsertctl retention`` set it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from upsert_core.ingest import IngestRequest
from upsert_core.landing import ValueCheck
from upsert_core.persist.shard import Shard

Retention = tuple[str, int | None]
"""``("keep", N)``, ``("keep_for", seconds)`` or ``("all", None)``."""

DEFAULT_GC_CRON = "0 * * * *"
DEFAULT_SENSOR_INTERVAL_S = 10
"""How often a source's landing sensor lists its landing by default: a new file waits at
most this long (plus the run) before it is ingested."""


@dataclass(frozen=True)
class SourceSpec:
    """One feed (see the module docstring)."""

    name: str
    landing: str
    shard: str
    key: tuple[str, ...] | None = None
    order: str | None = None
    deleted_col: str | None = None
    order_scope: str | None = None
    envelope: str | None = None
    missing: str | None = None
    unavailable: str | None = None
    gc_cron: str = DEFAULT_GC_CRON
    gc_retain: int | None = None
    sensor_interval_s: int = DEFAULT_SENSOR_INTERVAL_S
    description: str | None = None
    owners: tuple[str, ...] = ()
    tags: tuple[tuple[str, str], ...] = ()
    checks: tuple[ValueCheck, ...] = ()
    retention: Retention | None = None
    origin: str = field(default="sources.yaml", compare=False)

    def store_retention(self, shard: Shard) -> None:
        """Store the source's ``retention`` in ``shard`` (nothing when None, and no
        commit when the shard stores it already)."""
        if self.retention is None:
            return
        kind, value = self.retention
        if kind == "keep_for" and value is not None:
            shard.set_retention_for(value)
        else:
            shard.set_retention(value if kind == "keep" else None)

    def request(self) -> IngestRequest:
        """The ingest options (``None`` = the shard's stored option or the default)."""
        return IngestRequest(
            key=self.key, order=self.order, deleted_col=self.deleted_col,
            order_scope=self.order_scope, envelope=self.envelope, missing=self.missing,
            unavailable=self.unavailable, value_checks=self.checks,
        )

    @property
    def partitions_name(self) -> str:
        """The name of the source's dynamic partitions (one per landing file)."""
        return f"{self.name}_files"
