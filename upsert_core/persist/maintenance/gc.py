"""Garbage collection of a shard: expire leases, retain history, compact, roll up,
truncate old diffs, and delete the blobs that no live state references.

One :func:`gc` run does, in this order (each step is safe to crash after):

1. Expire stale writer and reader leases, and remove writers whose process is known dead
   (on this host); both by compare-and-set, which fences those writers for good.
2. With ``retain=N`` (``N >= 1``: :func:`check_retain`): advance ``since`` to
   ``max(since, upper - N)``, but never backwards and never past a leased reader's since;
   the commit times of ts left wholly below it go, and the late parts of batches below
   it (``commit_times.with_since``).
   ``N = 0`` is refused: ``since == upper`` on a non-empty shard leaves no readable time,
   so no ingest could rehydrate its state again.
3. Compact (size tiers; everything into one batch when step 2 moved the since).
4. Write a rollup of the current state and record it (skipped when the newest rollup is
   already at the current seqno or the one before), dropping in the same transition the
   rollups below the truncation point of step 5.
5. Choose the truncation point ``T``: the newest recorded rollup at or below the smallest
   seqno a leased reader holds (the current seqno when there are none).
6. Drop the rollups below ``T`` from the state (if step 4 did not already).
7. Find the blobs referenced by live states below ``T`` and by none at or above it
   (parts replaced by compaction, error parts, superseded checkpoints).
8. Truncate the diffs below ``T`` in Consensus, THEN delete the blobs of step 7: a
   crash in between leaves unreferenced blobs for the sweep, never a live state whose
   blobs are gone (``check`` would report it, and a reader of that state would fail).
9. Delete rollup blobs whose seqno is below the earliest live seqno: no one can use them.
10. Sweep leaked blobs (see below).

Why rollups are deleted after truncation (step 9), not before as in the reference: the
rollup at ``earliest`` is what rebuilds the oldest live state. Deleting it before the
truncation leaves, if GC crashes in between, a log that ``fetch_all_live_states`` (and so
the next GC) cannot read. Deleting after truncation loses nothing: a rollup below
``earliest`` is recognisable from its key alone (``keys.parse_rollup_seqno``), so a crash
leaves only blobs that the next run's step 9 removes.

Leaked blobs. A crashed or stalled writer leaves parts (and checkpoints, rollups) that
no state references; a live writer has the same kind of blobs between writing them and
its compare-and-set. Each run lists the shard's part, error, late, rollup and checkpoint
blobs FIRST, then reads every live state (the newest of them is the *current* state), and
calls a listed blob *unreferenced* if no live state references it (rollups: if none lists
it at a seqno at or above ``earliest``). An unreferenced blob is deleted when it provably can
never become referenced, decided without clocks:

- A blob naming a writer id (``keys.writer_id_of``; every blob an ingest, a compaction
  or a ``Shard`` handle writes): deleted iff that id is not registered in a state GC
  proved current after the listing by committing on it (a read alone may lag, e.g. a
  commit seen late), and no live state up to it references the blob. Registration
  precedes the writing of any blob naming the id, a removed registration never
  returns, and no state may start to reference a blob naming an unregistered id
  (``persist.write.writers``), so such a blob is either referenced already or never will be.
  The blobs of a live, registered writer are never deleted, however long it stalls;
  GC removes a stalled writer's registration only by compare-and-set (lease expiry in
  step 1, or its process being dead on this host), and deletes its blobs on a LATER
  read of the state.
- A rollup: deleted iff its seqno is at or below the newest rollup recorded in the
  current state (a rollup is recorded only if it is newer than every recorded one, and
  that maximum never decreases) or below ``earliest``. A newer unrecorded rollup may
  still be recorded and waits.
- A legacy blob (no writer id: written before registrations existed, or by a caller
  outside any writer): the old rule. The run records when it first saw it in
  ``{shard}/gc/leak-candidates.json`` and deletes it once seen unreferenced for
  ``leak_grace_ms`` (:data:`DEFAULT_LEAK_GRACE_MS`, one hour), or at once when its
  legacy token names a process on this host that is not running.

Guarantees:

- A blob referenced by a live state is never swept: the listing precedes the read of
  the live states, so a blob committed in between is seen as referenced, and a blob
  written after the listing is not considered at all.
- No registered writer ever commits a blob GC deleted; a stalled writer past its lease
  is refused at commit (``WriterFenced``) and redoes its work under a new id.
- GC itself writes (compaction parts, rollups) as a registered writer, released before
  the sweep, so its own failed writes are swept by the same rule.

Invariants kept (with ``state_versions``):

- GC never deletes a blob that a live state at or above ``T`` references, and ``T`` is
  at most every leased reader's held seqno, so a leased reader's state stays readable.
- After a run on a quiescent shard with ``leak_grace_ms=0``, the shard's blobs are
  exactly those the live states reference.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from upsert_core.errors import CorruptData, InvalidUsage, WriterFenced
from upsert_core.persist.keys import (
    CHECKPOINT_DIR,
    ERRORS_DIR,
    LATE_DIR,
    PART_DIR,
    ROLLUP_DIR,
    parse_rollup_seqno,
    rollup_prefix,
    shard_prefix,
    writer_id_of,
    writer_is_dead,
)
from upsert_core.persist.location import Blob
from upsert_core.persist.maintenance.compact import PartTyper, compact, has_work
from upsert_core.persist.state.commit_times import with_since
from upsert_core.persist.state.leases import expire_leases, min_held_seqno, min_reader_since
from upsert_core.persist.state.machine import Machine
from upsert_core.persist.state.state import RollupRef, ShardState
from upsert_core.persist.state.state_versions import StateVersions
from upsert_core.persist.write.writers import WriterLease, expire_dead_local_writers

log = logging.getLogger(__name__)

DEFAULT_LEAK_GRACE_MS = 60 * 60 * 1000
"""How long a blob must have been seen unreferenced before GC deletes it (one hour)."""

GC_DIR = "gc"
SWEPT_DIRS = (PART_DIR, ERRORS_DIR, ROLLUP_DIR, CHECKPOINT_DIR, LATE_DIR)
CANDIDATES_FORMAT = 1


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)


def leak_candidates_key(shard: str) -> str:
    """The blob holding when GC first saw each unreferenced blob of ``shard``."""
    return f"{shard_prefix(shard)}{GC_DIR}/leak-candidates.json"


@dataclass
class GcReport:
    """What one :func:`gc` run did. ``deleted_keys`` lists every blob it deleted."""

    shard_id: str
    leases_expired: int = 0
    since_before: int = 0
    since_after: int = 0
    compaction_merges: int = 0
    rollups_written: int = 0
    rollups_deleted: int = 0
    diffs_truncated: int = 0
    parts_deleted: int = 0
    leaked_blobs_deleted: int = 0
    leak_candidates_pending: int = 0
    truncated_below: int | None = None
    bytes_freed: int = 0
    seconds: float = 0.0
    deleted_keys: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        """The counts as a JSON-ready dict (without the list of deleted keys)."""
        return {
            "shard": self.shard_id,
            "leases_expired": self.leases_expired,
            "since_before": self.since_before,
            "since_after": self.since_after,
            "compaction_merges": self.compaction_merges,
            "rollups_written": self.rollups_written,
            "rollups_deleted": self.rollups_deleted,
            "diffs_truncated": self.diffs_truncated,
            "parts_deleted": self.parts_deleted,
            "leaked_blobs_deleted": self.leaked_blobs_deleted,
            "leak_candidates_pending": self.leak_candidates_pending,
            "truncated_below": self.truncated_below,
            "bytes_freed": self.bytes_freed,
            "seconds": round(self.seconds, 6),
        }

    def _delete(self, blob: Blob, key: str) -> bool:
        size = blob.delete(key)
        if size is None:
            return False
        self.deleted_keys.append(key)
        self.bytes_freed += size
        return True


# --- transitions ------------------------------------------------------------------------


def check_retain(retain: int) -> None:
    """Refuse a ``retain`` below 1 (see step 2 of the module docstring)."""
    if isinstance(retain, bool) or not isinstance(retain, int) or retain < 1:
        raise InvalidUsage(
            f"retain must be an integer >= 1 (timestamps to keep readable), got {retain!r}"
        )


def retained_since(state: ShardState, retain: int) -> int:
    """The since ``gc --retain`` moves to: ``upper - retain`` within the bounds."""
    check_retain(retain)
    target = min(state.upper, max(state.since, state.upper - retain))
    reader_since = min_reader_since(state)
    if reader_since is not None:
        target = min(target, reader_since)
    return max(state.since, target)


def advance_since(retain: int) -> Callable[[ShardState], ShardState | None]:
    """A transition applying :func:`retained_since` (no change when it stays put)."""
    check_retain(retain)

    def advance(state: ShardState) -> ShardState | None:
        since = retained_since(state, retain)
        return None if since == state.since else with_since(state, since)

    return advance


def truncation_point(state: ShardState) -> int | None:
    """The newest recorded rollup at or below every held seqno (None: there is none)."""
    held = min_held_seqno(state)
    eligible = [seqno for seqno in state.rollups if seqno <= held]
    return max(eligible) if eligible else None


def drop_rollups_below(seqno: int) -> Callable[[ShardState], ShardState | None]:
    """A transition removing the recorded rollups below ``seqno``."""

    def drop(state: ShardState) -> ShardState | None:
        kept = {s: r for s, r in state.rollups.items() if s >= seqno}
        if len(kept) == len(state.rollups) or not kept:
            return None
        return state.evolve(rollups=kept)

    return drop


def rollup_current(machine: Machine) -> RollupRef | None:
    """Write a rollup of the current state and record it; None when none was needed.

    The recording transition also drops the rollups below the new truncation point.
    A rollup that ends up unrecorded (a newer one was recorded first) is deleted.
    """
    state = machine.state()
    latest = state.latest_rollup()
    if latest is not None and latest.seqno >= state.seqno - 1:
        return None
    ref = machine.versions.write_rollup(state)

    def record(current: ShardState) -> ShardState | None:
        newest = current.latest_rollup()
        if newest is not None and newest.seqno >= ref.seqno:
            return None
        recorded = current.evolve(rollups={**current.rollups, ref.seqno: ref})
        # Drop the rollups GC will truncate below in the same transition, so an idle
        # shard's next GC finds its newest rollup one seqno back and has nothing to do.
        point = truncation_point(recorded)
        return recorded if point is None else drop_rollups_below(point)(recorded) or recorded

    recorded = machine.apply(record)
    if recorded.rollups.get(ref.seqno) != ref:
        machine.versions.delete_rollup(ref.key)
        return None
    return ref


# --- blob deletion ----------------------------------------------------------------------


def _replaced_blobs(versions: StateVersions, below: int) -> set[str]:
    """Blobs referenced by live states below ``below`` and by none at or above it."""
    old: set[str] = set()
    kept: set[str] = set()
    for state in versions.fetch_all_live_states():
        (kept if state.seqno >= below else old).update(state.referenced_blob_keys())
    # SUBTLE: a state committed after this scan derives from a state at or above
    # ``below`` (all of which were scanned), so it references blobs in ``kept`` or new
    # ones, never one of ``old - kept``.
    return old - kept


def _delete_replaced(blob: Blob, keys: set[str], report: GcReport) -> None:
    for key in sorted(keys):
        if report._delete(blob, key):
            report.parts_deleted += 1


def _truncate(versions: StateVersions, seqno: int, report: GcReport) -> None:
    earliest = versions.earliest_live_seqno()
    if earliest is None or earliest >= seqno:
        return
    try:
        report.diffs_truncated += versions.truncate(seqno)
    except InvalidUsage:
        # SUBTLE: a racing GC truncated further and dropped our rollup from the state;
        # that is only fine if the log is already truncated at or past our point.
        earliest = versions.earliest_live_seqno()
        if earliest is None or earliest < seqno:
            raise


def _delete_obsolete_rollups(versions: StateVersions, blob: Blob, report: GcReport) -> None:
    """Delete rollup blobs below the earliest live seqno (nothing can use them)."""
    earliest = versions.earliest_live_seqno()
    if earliest is None:
        return
    for meta in list(blob.list_keys(rollup_prefix(versions.shard_id))):
        seqno = parse_rollup_seqno(meta.key)
        if seqno is not None and seqno < earliest and report._delete(blob, meta.key):
            report.rollups_deleted += 1


def _swept(key: str, prefix: str) -> bool:
    rest = key[len(prefix):]
    return "/" in rest and rest.split("/", 1)[0] in SWEPT_DIRS


def _load_candidates(blob: Blob, key: str) -> dict[str, int]:
    data = blob.get(key)
    if data is None:
        return {}
    try:
        doc = json.loads(data)
        seen = doc["first_seen_ms"]
        return {str(k): int(v) for k, v in seen.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        # The record only ever delays deletions; a damaged one is reset, not fatal.
        log.warning("%s", CorruptData(f"GC leak-candidate record {key!r} is unreadable: {exc}"))
        return {}


def _referenced(live: list[ShardState], earliest: int) -> set[str]:
    referenced: set[str] = set()
    for state in live:
        referenced.update(state.referenced_blob_keys())
        referenced.update(ref.key for seqno, ref in state.rollups.items() if seqno >= earliest)
    return referenced


def _confirmed_current(
    machine: Machine, versions: StateVersions
) -> tuple[ShardState, set[str]] | None:
    """A state proven current after the listing, and the blobs live states reference up
    to it; None if the store's reads do not reach it yet.

    A read may lag (a follower, or a commit seen late); only a compare-and-set proves
    what the head is. So GC commits a state identical but for its seqno: the state it
    replaced was the head when the commit landed, which was after the listing. Every
    writer registered when its blob was listed is still registered in it unless removed
    (ids are never re-registered), and every reference committed before it is in the
    live states up to it.
    """
    marker = machine.apply(lambda state: state)
    earliest = versions.earliest_live_seqno()
    live = list(versions.fetch_all_live_states())
    if earliest is None or not live or max(s.seqno for s in live) < marker.seqno:
        return None
    return marker, _referenced(live, earliest)


def sweep_leaked(
    versions: StateVersions,
    blob: Blob,
    *,
    now_ms: int,
    leak_grace_ms: int,
    report: GcReport,
    machine: Machine | None = None,
) -> None:
    """Delete unreferenced blobs that can never become referenced (module docstring).

    Blobs naming a writer id are deleted only with a ``machine``, on a state it proved
    current after the listing (:func:`_confirmed_current`); without one they wait.
    """
    if leak_grace_ms < 0:
        raise InvalidUsage(f"leak_grace_ms must be >= 0, got {leak_grace_ms}")
    shard = versions.shard_id
    prefix = shard_prefix(shard)
    # SUBTLE: list before reading the live states (see the module docstring): a blob
    # committed after the listing is then seen as referenced.
    listed = [m.key for m in blob.list_keys(prefix) if _swept(m.key, prefix)]
    earliest = versions.earliest_live_seqno()
    if earliest is None:
        return
    live = list(versions.fetch_all_live_states())
    if not live:
        return
    current = max(live, key=lambda st: st.seqno)
    newest_rollup = max(current.rollups, default=-1)
    referenced = _referenced(live, earliest)
    record_key = leak_candidates_key(shard)
    before = _load_candidates(blob, record_key)
    pending: dict[str, int] = {}
    waiting = 0
    unregistered: list[str] = []
    for key in listed:
        if key in referenced:
            continue
        seqno = parse_rollup_seqno(key)
        if seqno is not None:
            # A stale read only makes ``earliest`` and ``newest_rollup`` smaller: safe.
            if seqno < earliest or seqno <= newest_rollup:
                if report._delete(blob, key):
                    report.rollups_deleted += 1
            else:
                waiting += 1  # may still be recorded (it is newer than every recorded one)
            continue
        writer = writer_id_of(key)
        if writer is not None:
            if writer in current.writers:
                waiting += 1  # a registered writer may still commit it
            else:
                unregistered.append(key)
            continue
        first_seen = before.get(key, now_ms)
        if now_ms - first_seen >= leak_grace_ms or writer_is_dead(key):
            if report._delete(blob, key):
                report.leaked_blobs_deleted += 1
        else:
            pending[key] = first_seen
    if unregistered:
        confirmed = None if machine is None else _confirmed_current(machine, versions)
        if confirmed is None:
            waiting += len(unregistered)  # decided by a later run
        else:
            state, referenced_now = confirmed
            for key in unregistered:
                if key in referenced_now or writer_id_of(key) in state.writers:
                    waiting += 1
                elif report._delete(blob, key):
                    report.leaked_blobs_deleted += 1
    report.leak_candidates_pending = len(pending) + waiting
    if pending:
        doc = {"format": CANDIDATES_FORMAT, "first_seen_ms": dict(sorted(pending.items()))}
        blob.set(record_key, json.dumps(doc, separators=(",", ":")).encode())
    elif before or blob.get(record_key) is not None:
        blob.delete(record_key)


# --- the driver ---------------------------------------------------------------------------


def gc(
    machine: Machine,
    blob: Blob,
    *,
    retain: int | None = None,
    leak_grace_ms: int = DEFAULT_LEAK_GRACE_MS,
    run_compaction: bool = True,
    clock_ms: Callable[[], int] = _wall_clock_ms,
    typer: PartTyper | None = None,
) -> GcReport:
    """Run every GC step on the machine's shard (see the module docstring); its
    compaction writes typed parts with ``typer`` (``compact.PartTyper``)."""
    started = time.monotonic()
    versions = machine.versions
    report = GcReport(shard_id=versions.shard_id)
    if retain is not None:
        check_retain(retain)
    if leak_grace_ms < 0:
        raise InvalidUsage(f"leak_grace_ms must be >= 0, got {leak_grace_ms}")

    state = machine.state()
    report.since_before = state.since
    leases_before = len(state.writers) + len(state.leased_readers)
    state = machine.apply(lambda s: expire_leases(s, clock_ms()))
    state = machine.apply(expire_dead_local_writers)
    report.leases_expired = max(0, leases_before - len(state.writers) - len(state.leased_readers))

    if retain is not None:
        state = machine.apply(advance_since(retain))
    report.since_after = state.since

    moved = report.since_after > report.since_before
    if run_compaction and has_work(state, merge_all=moved):
        with WriterLease(versions, clock_ms=clock_ms) as lease:
            try:
                result = compact(machine, blob, merge_all=moved, writer_id=lease.writer_id,
                                 typer=typer)
                report.compaction_merges = result.merges
            except WriterFenced as exc:
                # This GC stalled past its own lease; its merged parts name a writer
                # that is gone, so the sweep below (or the next GC) deletes them.
                log.warning("%s", exc)
        state = machine.state()

    if rollup_current(machine) is not None:
        report.rollups_written += 1

    state = machine.state()
    point = truncation_point(state)
    if point is not None:
        report.truncated_below = point
        machine.apply(drop_rollups_below(point))
        # Truncate first, then delete: a crash in between leaves only unreferenced blobs
        # (swept later), never a live state that references a deleted blob.
        replaced = _replaced_blobs(versions, point)
        _truncate(versions, point, report)
        _delete_replaced(blob, replaced, report)
    _delete_obsolete_rollups(versions, blob, report)
    sweep_leaked(versions, blob, now_ms=clock_ms(), leak_grace_ms=leak_grace_ms, report=report,
                 machine=machine)
    report.seconds = time.monotonic() - started
    return report
