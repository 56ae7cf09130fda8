"""The maintenance an ingest runs after its commits, so that nobody has to run ``gc`` for
a shard's reads and storage to stay in shape.

After a run that committed files, :func:`maintain`:

1. applies the shard's stored retention (``persist.maintenance.retention``: a count of times, or a
   duration resolved from commit times): ``since`` moves to ``upper - keep``, so
   compaction may fold the history before it;
2. once the shard holds :data:`AUTO_COMPACT_BATCHES` batches or more, runs one GC pass:
   size-tiered compaction (with the ingest's part typer, so parts come out typed and
   in the format the ingest writes), a rollup, truncation and the deletion of the blobs
   that only replaced states referenced. The number of batches stays logarithmic in
   the history kept, and history before ``since`` is folded as the tiers merge it.

Invariants:

- It runs after the run's commits, so it never delays or risks them: a failure comes
  back as a warning naming the shard and what to run by hand (``upsertctl gc``), and
  the ingest still succeeds. GC's own guarantees (fencing, leases, blobs deleted only
  when no live state references them) hold as for a ``gc`` run beside the ingest.
- Retention never forces a rebuild of upsert state: ``since`` stays below the upper
  of every bucket's checkpoint base that is behind the shard (a base replays the
  shard's changes since it, which needs ``since`` below it), so maintenance keeps
  more history than asked for until the bases move on. In the global scope bases are
  always current, so nothing holds ``since`` back.
- ``UPSERT_AUTO_MAINTENANCE=0`` turns it off (then schedule ``upsertctl gc``, as
  before); without a stored retention it folds nothing: all history stays readable.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from upsert_core.errors import ConfigError, UpsertPlatformError
from upsert_core.ingest.part_typer import part_typer
from upsert_core.ingest.shard_config import ShardIngestConfig
from upsert_core.ingest.tasks import MAX_REPLAY_BATCHES, Base
from upsert_core.order_scope import OrderScope
from upsert_core.persist.maintenance.gc import GcReport, retained_since
from upsert_core.persist.maintenance.retention import retention_keep
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.commit_times import with_since
from upsert_core.persist.state.state import ShardState

AUTO_MAINTENANCE_ENV = "UPSERT_AUTO_MAINTENANCE"

AUTO_COMPACT_BATCHES = 12
"""A GC pass runs after an ingest once the shard holds this many batches or more."""


@dataclass
class MaintenanceReport:
    """What :func:`maintain` did (all zero/False when nothing was due)."""

    since_before: int = 0
    since_after: int = 0
    batches_before: int = 0
    batches_after: int = 0
    gc_ran: bool = False
    compaction_merges: int = 0
    blobs_deleted: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "since_before": self.since_before, "since_after": self.since_after,
            "batches_before": self.batches_before, "batches_after": self.batches_after,
            "gc_ran": self.gc_ran, "compaction_merges": self.compaction_merges,
            "blobs_deleted": self.blobs_deleted, "seconds": round(self.seconds, 6),
        }


def auto_maintenance_from_env(env: Mapping[str, str] | None = None) -> bool:
    """Whether ingests maintain their shard (:data:`AUTO_MAINTENANCE_ENV`, default on)."""
    text = (os.environ if env is None else env).get(AUTO_MAINTENANCE_ENV, "").strip().lower()
    if text in ("", "1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{AUTO_MAINTENANCE_ENV}={text!r}: use 1 (the default) or 0")


def replay_floor(state: ShardState) -> int:
    """The greatest ``since`` every bucket's checkpoint base can still replay from.

    Only batch-scope bases are replayed (global-scope checkpoints are current), and a
    base more than ``MAX_REPLAY_BATCHES`` behind is rewritten rather than replayed, so
    neither holds ``since`` back (an idle bucket would otherwise hold it forever)."""
    stored = ShardIngestConfig.read(state.config)
    floor = state.upper
    if stored.checkpoint_upper is None:
        return floor
    if stored.options is not None and stored.options.order_scope is OrderScope.GLOBAL:
        return floor
    floor = min(floor, stored.checkpoint_upper)
    oldest = stored.checkpoint_upper - MAX_REPLAY_BATCHES
    for text in stored.checkpoint_bases.values():
        base = Base.decode(text, stored.checkpoint_upper)
        if oldest <= base.as_of < stored.checkpoint_upper:
            floor = min(floor, max(0, base.as_of - 1))
    return floor


def retained(state: ShardState, keep: int) -> int:
    """The ``retain`` to hand GC's since transition: ``keep``, or more where a base
    needs its history (see the module docstring)."""
    target = max(state.since, min(state.upper - keep, replay_floor(state)))
    return max(keep, state.upper - target)


def _advance_keeping(now_ms: int) -> Callable[[ShardState], ShardState | None]:
    """A transition moving ``since`` as :func:`retained` says for the stored retention,
    both resolved from the state it transforms (not from an earlier read: an ingest
    committing in between would move the target past a checkpoint base, or a duration's
    window start past the ts a read at its start needs)."""

    def advance(state: ShardState) -> ShardState | None:
        keep = retention_keep(state, now_ms)
        if keep is None or not state.upper:
            return None
        since = retained_since(state, retained(state, keep))
        # with_since: the commit times of ts left wholly below the new since go too, and
        # the late parts of batches below it, as when GC advances it.
        return None if since == state.since else with_since(state, since)

    return advance


def gc_with_retention(shard: Shard, retain: int | None, **options: object) -> GcReport:
    """``shard.gc``: with ``retain`` as given, else after applying the stored retention
    (:func:`apply_stored_retention`), with the report's ``since_before`` from before it
    (what ``upsertctl gc`` and the ``rollup_gc`` asset run)."""
    before = shard.state().since
    if retain is None:
        apply_stored_retention(shard)
    report = shard.gc(retain, typer=part_typer(shard), **options)  # type: ignore[arg-type]
    report.since_before = min(before, report.since_before)
    return report


def apply_stored_retention(shard: Shard) -> ShardState:
    """Move ``since`` as the shard's stored retention says (nothing without one), in one
    compare-and-set against the state it changes; returns the state after."""
    return shard.machine.apply(_advance_keeping(shard.clock_ms()))


def maintain(shard: Shard) -> MaintenanceReport:
    """Apply the stored retention and bound the number of batches (module docstring).
    Raises what GC raises; :func:`maintain_after_ingest` turns that into a warning."""
    started = time.monotonic()
    state = shard.state()
    report = MaintenanceReport(since_before=state.since, since_after=state.since,
                               batches_before=len(state.batches),
                               batches_after=len(state.batches))
    state = apply_stored_retention(shard)
    report.since_after = state.since
    if len(state.batches) >= AUTO_COMPACT_BATCHES:
        gc = shard.gc(typer=part_typer(shard))
        report.gc_ran = True
        report.compaction_merges = gc.compaction_merges
        report.blobs_deleted = len(gc.deleted_keys)
        state = shard.state()
    report.batches_after = len(state.batches)
    report.seconds = time.monotonic() - started
    return report


def maintain_after_ingest(shard: Shard) -> tuple[MaintenanceReport | None, str | None]:
    """:func:`maintain` for a shard an ingest just wrote: ``(report, None)``, or
    ``(None, warning)`` when it failed (the files stay committed)."""
    try:
        return maintain(shard), None
    except UpsertPlatformError as exc:
        return None, (
            f"shard {shard.shard_id}: the files are committed, but maintenance after the"
            f" ingest failed ({exc}); run `upsertctl gc --shard {shard.shard_id}`"
        )
