"""Rebucketing: change the bucket count of an existing shard (``upsertctl rebucket``).

A shard's keys are spread over N upsert-state buckets (``persist.write.buckets``: a key's
bucket is the first 8 bytes of its digest mod N). N is chosen at the shard's first
ingest (``options.buckets_for_first_file``); as the table grows its buckets outgrow
memory and a Spark job runs at most N drain tasks, so N must be able to grow (and
shrink). :func:`rebucket` changes it to M, as one writer, in one commit:

1. it registers as a writer (``persist.write.writers``) and plans on the current state at
   upper ``u``;
2. it rewrites every bucket-labelled part of every retained batch for M
   (``persist.maintenance.relabel``: same updates, same times, labels ``b'/M``), so every
   retained time reads as before and every state stays labelled with one count;
3. it loads each old bucket's state at ``u`` as an ingest would (checkpoint and replay,
   or a rebuild with the recorded tombstones), the old buckets of one residue modulo
   ``gcd(N, M)`` at a time, and writes every new bucket's state as the checkpoint its
   bucket step would write (``ingest.bucket_split``), tombstone sets included;
4. it commits all of it with the new bucket count, checkpoint references, bases,
   ``checkpoint.upper = u``, the live row count and a fresh commit nonce in ONE
   transition (``persist.maintenance.relabel.commit_relayout``), only if the upper and the spine
   are still those it planned on, and fencing every other writer in it.

Invariants:

- A rebucket changes no data: the shard's updates, times, since, upper, error and late
  collections and ingested files are what they were; only labels, checkpoints and the
  bucket count change. Every read at every retained time answers as before.
- After it, the shard is what a shard created with M buckets would be: every labelled
  part is labelled for M, the checkpoint and tombstone entries exist for buckets
  ``0..M-1`` only (those of old buckets ``>= M`` are deleted), all current at ``u``. So
  nothing about what is stored changes format, and every reader, old releases
  included, reads it as it reads any shard of M buckets.
- Tombstones (global scope) are never forgotten: every key's tombstone moves with the
  key into its new bucket's state and tombstone set. A bucket whose recorded set is
  missing stops the rebucket as it stops an ingest (``TombstonesLost``).
- All or nothing: nothing is visible before the commit, and a rebucket killed at any
  point leaves the shard as it was (its blobs name its writer id: GC deletes them once
  the registration is gone, at once when its process is dead on GC's host). A
  committed rebucket is the new layout, whole.
- Racing writers: an ingest (or compaction) that planned on the old layout is fenced
  by the commit and, being an ingest, redoes its file as a new writer on the new
  layout (``pipeline``). A writer that commits first makes the rebucket plan again
  (reusing the batches it already relabelled that are still in the spine), up to
  ``max_attempts`` times; then it fails with :class:`ConcurrentModification`
  ("concurrently modified"), having committed nothing.
- The per-process state cache and a group's plans never mistake an old state for a
  new one: the commit records a fresh commit nonce for upper ``u``
  (``ingest.statecache``), and the checkpoint references all change.
- Growth with the table (:func:`grown_buckets`, run by the ingest after each file it
  commits, as the run's own writer: ``pipeline``): only up, only by doublings, only when
  the recorded base sizes say a bucket holds more than :data:`GROW_AT` times the target
  state, and only for runs that did not name a count (a deployment that pins
  ``--buckets``/``UPSERT_BUCKETS`` keeps it). Each doubling rewrites what the shard
  holds so far, so a first load that grows from 4 to N buckets rewrites about its own
  size in all (a geometric sum), and no bucket ever holds much more than twice the
  target while it loads.
"""

from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from upsert_core.errors import (
    ConcurrentModification,
    ConfigError,
    CorruptData,
    NotReadable,
    WriterFenced,
)
from upsert_core.ingest import options as ingest_options
from upsert_core.ingest.bucket_split import NewBucket, write_new_buckets
from upsert_core.ingest.checkpoint import CheckpointUnusable
from upsert_core.ingest.options import IngestRequest
from upsert_core.ingest.plan import plan_file
from upsert_core.ingest.shard_config import (
    ShardIngestConfig,
    ShardOptions,
    check_buckets,
    checkpoint_base_name,
    checkpoint_ref_name,
    recent_history,
    tombstones_ref_name,
)
from upsert_core.ingest.tasks import Base, load_bucket_state
from upsert_core.ingest.tombstones import TombstonesLost
from upsert_core.landing import LandingFile
from upsert_core.order_scope import OrderScope
from upsert_core.persist.keys import writing_as
from upsert_core.persist.maintenance.compact import provably_unreferenced
from upsert_core.persist.maintenance.relabel import (
    RelabelStats,
    Relayout,
    commit_relayout,
    relabel_batch,
)
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.state import HollowBatch, ShardState
from upsert_core.persist.write.writers import WriterLease

DEFAULT_ATTEMPTS = 3
"""Plans a rebucket makes before it gives up on writers that keep committing first."""

AUTO_REBUCKET_ENV = "UPSERT_AUTO_REBUCKET"
"""``0`` keeps ingests from growing a shard's bucket count (default on)."""

GROW_AT = 2.0
"""Maintenance grows the bucket count once a bucket's estimated state passes this many
times ``options.TARGET_BUCKET_BYTES`` (twice: a doubling then lands near the target)."""

STATE_PER_STORED_BYTE = 1.5
"""Upsert state per byte of a stored checkpoint base (compressed, as a Parquet landing
file is: the factor ``options.buckets_for_first_file`` uses for one)."""

_NO_FILE = LandingFile(name="(rebucket)", root="")
"""The loading of bucket states goes through an ingest's task, which names a file."""


@dataclass
class RebucketReport:
    """What :func:`rebucket` did. ``changed`` is False when the shard already had the
    count (nothing written or committed)."""

    shard: str
    buckets_before: int
    buckets: int
    upper: int = 0
    seqno: int = 0
    changed: bool = False
    attempts: int = 0
    batches: int = 0
    """Batches whose parts were rewritten (in the committed plan)."""
    parts_read: int = 0
    parts_written: int = 0
    bytes_read: int = 0
    """Encoded bytes of the parts rewritten (summed over every attempt)."""
    bytes_written: int = 0
    """Bytes of new parts, checkpoints and tombstone sets (summed over every attempt)."""
    state_keys: int = 0
    live_rows: int = 0
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {
            "shard": self.shard, "buckets_before": self.buckets_before,
            "buckets": self.buckets, "changed": self.changed, "upper": self.upper,
            "seqno": self.seqno, "attempts": self.attempts, "batches": self.batches,
            "parts_read": self.parts_read, "parts_written": self.parts_written,
            "bytes_read": self.bytes_read, "bytes_written": self.bytes_written,
            "state_keys": self.state_keys, "live_rows": self.live_rows,
            "seconds": round(self.seconds, 6), "warnings": list(self.warnings),
        }


@dataclass
class _Plan:
    layout: Relayout
    checkpoints: set[str]
    """The blobs of the new states (checkpoints, tombstone sets) the plan wrote."""
    live_rows: int
    state_keys: int


def stored_options(state: ShardState) -> ShardOptions:
    """The shard's ingest options; :class:`ConfigError` for a shard no ingest created."""
    options = ShardIngestConfig.read(state.config).options
    if options is None:
        raise ConfigError(
            f"shard {state.shard_id!r} has no ingest yet, so no buckets to change: its"
            " first ingest sets the count (upsertctl ingest --buckets N)"
        )
    return options


def rebucket(
    shard: Shard, buckets: int, *, max_attempts: int = DEFAULT_ATTEMPTS,
    request: IngestRequest | None = None, lease: WriterLease | None = None,
) -> RebucketReport:
    """Change ``shard``'s bucket count to ``buckets``; see the module docstring.
    ``request`` gives the checkpoint format settings and the writer lease (default: the
    environment's, as for an ingest). ``lease``: write as that (registered) writer, an
    ingest run's between two of its files, instead of registering one: the fence then
    spares it, which is safe because it has no plan in flight."""
    started = time.monotonic()
    check_buckets(buckets)
    request = request if request is not None else IngestRequest()
    state = shard.state()
    report = RebucketReport(shard.shard_id, stored_options(state).buckets, buckets,
                            state.upper, state.seqno)
    if report.buckets_before != buckets:
        if lease is not None:
            _attempts(shard, buckets, max(1, max_attempts), request, lease, report)
        else:
            with shard.writer_lease(request.writer_lease_ms) as own:
                _attempts(shard, buckets, max(1, max_attempts), request, own, report)
    report.seconds = time.monotonic() - started
    return report


def _attempts(
    shard: Shard, buckets: int, attempts: int, request: IngestRequest, lease: WriterLease,
    report: RebucketReport,
) -> None:
    """Plan and commit until one commit lands (module docstring)."""
    done = _Relabelled()
    for attempt in range(1, attempts + 1):
        report.attempts = attempt
        if lease.lost:
            lease.renew()
            done.forget(shard)  # named after the lost id: never committable
        state = shard.state()
        options = stored_options(state)
        report.buckets_before = options.buckets
        if options.buckets == buckets:  # another rebucket got there first
            return
        try:
            plan = _plan(shard, state, options, buckets, request, lease, done, report)
        except (CorruptData, NotReadable, CheckpointUnusable, TombstonesLost):
            # SUBTLE: a GC that compacted (or truncated) since this plan began may have
            # deleted parts, and an ingest's maintenance the tombstone sets it replaced,
            # that only older states reference: plan again on the fresh state, as an
            # ingest's bucket step does; on an unchanged shard it is real. The last
            # attempt on a moved shard lost a race, as a lost commit does, and says so
            # below (reporting the part or set as lost would send an operator to a
            # backup of a healthy shard).
            fresh = shard.state()
            if fresh.seqno == state.seqno:
                done.forget(shard)  # no plan committed: none of it is referenced
                raise
            done.keep_only(shard, set(fresh.batches))
            continue
        try:
            result = commit_relayout(shard.machine, plan.layout, writer_id=lease.writer_id,
                                     now_ms=shard.clock_ms)
        except WriterFenced:
            # Nothing of it committed (a proposal before the fence lost its race, which
            # is determinate), and what it wrote names the fenced id: all of it goes.
            _delete(shard, plan.checkpoints)
            done.forget(shard)
            lease.renew()
            continue
        if result.committed:
            report.changed = True
            report.upper, report.seqno = result.state.upper, result.state.seqno
            report.batches = done.rewritten(plan.layout.batches)
            report.live_rows, report.state_keys = plan.live_rows, plan.state_keys
            done.keep_only(shard, set(plan.layout.batches))
            return
        # SUBTLE: a lost compare-and-set is determinate (another state took the seqno),
        # so nothing of this plan is referenced; provably_unreferenced double-checks.
        # The relabelled batches still in the spine stay for the next plan.
        if provably_unreferenced(shard.machine, plan.checkpoints, result.proposed):
            _delete(shard, plan.checkpoints)
        done.keep_only(shard, set(result.state.batches))
    done.forget(shard)  # no plan committed: none of it is referenced
    raise ConcurrentModification(
        f"shard {shard.shard_id}: concurrently modified: the rebucket to {buckets} buckets"
        f" lost the race to other writers {attempts} times (each commit of an ingest or a"
        " compaction changes the shard it planned on); nothing was changed: run it again"
        " while fewer writers run"
    )


class _Relabelled:
    """The batches relabelled so far (old batch -> new batch) with the blobs each
    wrote, kept across attempts while the old batch stays in the spine."""

    def __init__(self) -> None:
        self.batches: dict[HollowBatch, tuple[HollowBatch, list[str]]] = {}

    def get(self, shard: Shard, batch: HollowBatch, buckets: int, request: IngestRequest,
            report: RebucketReport) -> HollowBatch:
        if batch not in self.batches:
            stats = RelabelStats()
            new = relabel_batch(shard.blob, shard.shard_id, batch, buckets,
                                inline_threshold=request.inline_threshold, stats=stats)
            self.batches[batch] = (new, stats.new_blobs)
            report.parts_read += stats.parts_read
            report.parts_written += stats.parts_written
            report.bytes_read += stats.bytes_read
            report.bytes_written += stats.bytes_written
        return self.batches[batch][0]

    def rewritten(self, spine: Sequence[HollowBatch]) -> int:
        return sum(1 for b in spine if b in self.batches and self.batches[b][0] is not b)

    def keep_only(self, shard: Shard, spine: set[HollowBatch]) -> None:
        """Delete what was written for batches no longer in ``spine`` (referenced by no
        state: no plan holding them committed)."""
        for old in [b for b in self.batches if b not in spine]:
            _delete(shard, set(self.batches.pop(old)[1]))

    def forget(self, shard: Shard) -> None:
        self.keep_only(shard, set())


def _delete(shard: Shard, keys: set[str]) -> None:
    for key in keys:
        shard.blob.delete(key)


def _plan(
    shard: Shard, state: ShardState, options: ShardOptions, buckets: int,
    request: IngestRequest, lease: WriterLease, done: _Relabelled, report: RebucketReport,
) -> _Plan:
    """Write the new layout of ``state`` (parts and checkpoints) and return it, not yet
    committed. A failure deletes the checkpoints it wrote (the relabelled batches stay
    in ``done`` for the caller)."""
    with writing_as(lease.writer_id):
        spine = tuple(done.get(shard, b, buckets, request, report) for b in state.batches)
        new, warnings = _new_states(shard, state, options, buckets, request, lease)
    report.bytes_written += sum(b.bytes_written for b in new)
    report.warnings.extend(w for w in warnings if w not in report.warnings)
    layout = Relayout(
        upper=state.upper, batches=state.batches, relabelled=spine,
        config_updates=_config_updates(state, options, buckets, new),
    )
    return _Plan(layout, {k for b in new for k in b.new_blobs},
                 sum(b.live_rows for b in new), sum(b.keys for b in new))


def _new_states(
    shard: Shard, state: ShardState, options: ShardOptions, buckets: int,
    request: IngestRequest, lease: WriterLease,
) -> tuple[list[NewBucket], list[str]]:
    """Every new bucket's state at the upper, written as checkpoints; and the warnings
    the loading of the old buckets gave."""
    task = plan_file(state, options, _NO_FILE, request, lease.writer_id)
    old = options.buckets
    g = math.gcd(old, buckets)
    written: list[NewBucket] = []
    warnings: list[str] = []
    try:
        for residue in range(g):
            states = []
            for bucket in range(residue, old, g):
                loaded, result = load_bucket_state(task, bucket, shard.blob)
                states.append(loaded)
                warnings.extend(result.warnings)
            written.extend(write_new_buckets(
                shard.blob, task, states, list(range(residue, buckets, g)), buckets))
    except BaseException:
        for new in written:
            for key in new.new_blobs:
                shard.blob.delete(key)
        raise
    return sorted(written, key=lambda n: n.bucket), warnings


def grown_buckets(state: ShardState) -> int | None:
    """The bucket count maintenance should grow ``state``'s shard to, or None.

    Each bucket's state is estimated from its checkpoint base's stored size
    (:data:`STATE_PER_STORED_BYTE` per byte; a base holds the bucket's rows as of its
    upper, the updates since it are at most ``tasks.REPLAY_FRACTION`` more). Once the
    largest passes :data:`GROW_AT` times the target per bucket (``options``: about
    256 MiB, what a new shard's count aims at), the count doubles until the estimated
    state per bucket is within the target, up to ``options.MAX_AUTO_BUCKETS``: a
    multiple, so each new bucket is cut from one old one. None when nothing is known
    (no sizes recorded, checkpoints not current) or nothing is due; never shrinks."""
    stored = ShardIngestConfig.read(state.config)
    options = stored.options
    if options is None or not stored.checkpoints_current(state.upper):
        return None
    sizes = [
        Base.decode(stored.checkpoint_bases.get(b), state.upper).size
        for b in range(options.buckets)
    ]
    known = [size * STATE_PER_STORED_BYTE for size in sizes if size >= 0]
    target = ingest_options.TARGET_BUCKET_BYTES
    if not known or max(known) <= GROW_AT * target:
        return None
    total = sum(known) * options.buckets / len(known)
    grown = options.buckets
    while total / grown > target and grown * 2 <= ingest_options.MAX_AUTO_BUCKETS:
        grown *= 2
    return None if grown == options.buckets else grown


def auto_rebucket_from_env(env: Mapping[str, str] | None = None) -> bool:
    """Whether ingests may grow bucket counts (:data:`AUTO_REBUCKET_ENV`, default on)."""
    return ingest_options.on_off_setting(os.environ if env is None else env,
                                         AUTO_REBUCKET_ENV)


def _config_updates(
    state: ShardState, options: ShardOptions, buckets: int, new: list[NewBucket]
) -> dict[str, str | None]:
    """The config entries of the new layout; ``None`` deletes an old bucket's entry."""
    stored = ShardIngestConfig.read(state.config)
    nonce = uuid.uuid4().hex
    scope_global = options.order_scope is OrderScope.GLOBAL
    committed = ShardIngestConfig(
        options=replace(options, buckets=buckets),
        checkpoint_upper=state.upper,
        checkpoint_refs={n.bucket: n.checkpoint for n in new},
        checkpoint_bases={n.bucket: n.base for n in new},
        tombstone_refs={n.bucket: n.tombstones or "" for n in new} if scope_global else {},
        live_rows=sum(n.live_rows for n in new),
        commit_nonce=nonce,
        history=recent_history(stored.history, state.upper, nonce),
    )
    updates: dict[str, str | None] = dict(committed.entries())
    for gone in (set(stored.checkpoint_refs) | set(stored.checkpoint_bases)
                 | set(stored.tombstone_refs)):
        if gone >= buckets:
            for name in (checkpoint_ref_name(gone), checkpoint_base_name(gone),
                         tombstones_ref_name(gone)):
                if name in state.config:
                    updates[name] = None
    return updates


__all__ = [
    "AUTO_REBUCKET_ENV", "DEFAULT_ATTEMPTS", "RebucketReport", "auto_rebucket_from_env",
    "grown_buckets", "rebucket", "stored_options",
]
