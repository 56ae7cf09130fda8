"""Writer registrations: the fence that lets GC delete blobs no one can commit any more.

A process that will commit blobs (an ingest, a compaction) first registers a fresh writer
id in the shard's state (:func:`~upsert_core.persist.state.leases.register_writer`, a
compare-and-set), names every blob it writes after that id
(:func:`~upsert_core.persist.keys.writing_as`) and heartbeats the registration while it
works (:class:`WriterLease`). Every transition that makes a writer's blobs referenced
(``append.compare_and_append``, ``compact``'s replace) first checks, in the same
compare-and-set, that the writer is still registered (:func:`require_registered`).

Invariants:

- A registration is created only by ``register_writer`` with an id from
  :func:`~upsert_core.persist.keys.new_writer_id` (fresh per call), before any blob
  naming it is written; heartbeats never re-create one that is gone (``LeaseExpired``).
- A registration is removed only by compare-and-set: released by its holder, expired by
  GC once ``now > last heartbeat + lease``
  (:func:`~upsert_core.persist.state.leases.expire_leases`), or removed by GC because it names a
  process on GC's host that is not running (:func:`expire_dead_local_writers`), or fenced by a
  change of the shard's bucket layout (``persist.maintenance.relabel.commit_relayout`` removes every
  registration but its own writer's: whatever the others planned was for the old layout).
- A state may only start to reference a blob naming a writer id that the same state
  registers (:func:`require_new_references_registered`, checked in the transition that
  adds the reference: ``append``, compaction's replace). So once an id is removed, no
  blob naming it can become referenced, whoever commits it (a handle that registered a
  new id after being fenced cannot commit a batch written under the old one). Its own
  commits are refused too (``require_registered``,
  :class:`~upsert_core.errors.WriterFenced`, determinately). Hence a blob naming an id
  that a state shown to be current after listing the blob does not register is either
  referenced by a live state already or never will be, and GC may delete it if
  unreferenced (``persist.maintenance.gc``).
- Safety does not depend on clocks. A skewed or paused clock only decides WHEN a lease
  expires: a live writer expired too early is fenced and redoes its work under a new
  id; it never commits a blob GC deleted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType

from upsert_core.errors import LeaseExpired, UpsertPlatformError, WriterFenced
from upsert_core.persist.keys import new_writer_id, process_is_dead, writer_id_of
from upsert_core.persist.state import leases
from upsert_core.persist.state.machine import Machine
from upsert_core.persist.state.state import ShardState
from upsert_core.persist.state.state_versions import StateVersions

log = logging.getLogger(__name__)

HEARTBEATS_PER_LEASE = 4
"""A lease is heartbeated this many times per lease duration."""


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)


def require_registered(state: ShardState, writer_id: str) -> None:
    """Raise :class:`WriterFenced` unless ``writer_id`` is registered in ``state``."""
    if writer_id not in state.writers:
        raise WriterFenced(
            f"shard {state.shard_id}: writer {writer_id} is fenced: its registration is"
            " gone (its lease expired while it was stalled, it was released, or a rebucket"
            " of the shard fenced every writer that planned on the old bucket count), so GC may"
            " have deleted the blobs it wrote; nothing was committed. Register a new writer"
            " and write again"
        )


def require_new_references_registered(before: ShardState, after: ShardState) -> None:
    """Raise :class:`WriterFenced` if ``after`` starts to reference a blob whose key names
    a writer id that ``after`` does not register.

    This is what makes GC's deletion of a removed writer's blobs safe for every caller,
    not only for a writer committing its own blobs. Blobs already referenced by
    ``before`` (e.g. checkpoints carried forward) and blobs naming no writer id (written
    by older versions; GC keeps its grace period for those) are not checked.
    """
    new = set(after.referenced_blob_keys()) - set(before.referenced_blob_keys())
    for key in sorted(new):
        writer = writer_id_of(key)
        if writer is not None and writer not in after.writers:
            raise WriterFenced(
                f"shard {after.shard_id}: blob {key} was written by writer {writer}, whose"
                " registration is gone, so GC may have deleted it; nothing was committed."
                " Write it again as a registered writer"
            )


def refresh_in(state: ShardState, writer_id: str, now_ms: int) -> ShardState:
    """``state`` with ``writer_id``'s heartbeat refreshed (it must be registered)."""
    require_registered(state, writer_id)
    return leases.heartbeat_writer(state, writer_id, now_ms)


def expire_dead_local_writers(state: ShardState) -> ShardState | None:
    """Remove every writer whose id names a process on this host that is not running.

    The fast path for a crashed writer: through the same compare-and-set fence as lease
    expiry, so the dead process's blobs become deletable at once. A reused pid only
    keeps a dead writer registered until its lease runs out.
    """
    dead = [w for w in state.writers if process_is_dead(w)]
    if not dead:
        return None
    return state.evolve(writers={k: v for k, v in state.writers.items() if k not in dead})


class WriterLease:
    """A writer registration held (and heartbeated from a thread) while a writer works.

    ``with WriterLease(versions) as lease:`` registers ``lease.writer_id``; a daemon
    thread heartbeats it every ``lease_duration_ms / HEARTBEATS_PER_LEASE`` through its
    own :class:`Machine`; leaving the block stops the thread and releases the
    registration (best effort: an unreleased one expires with its lease, or GC removes
    it once the process is gone). After a :class:`WriterFenced`, :meth:`renew`
    registers a fresh id (never the old one again).
    """

    def __init__(
        self,
        versions: StateVersions,
        *,
        lease_duration_ms: int = leases.DEFAULT_LEASE_DURATION_MS,
        clock_ms: Callable[[], int] = _wall_clock_ms,
    ) -> None:
        self._versions = StateVersions(versions.consensus, versions.blob, versions.shard_id)
        self._machine = Machine(self._versions, clock_ms=clock_ms)
        self.lease_duration_ms = lease_duration_ms
        self._clock_ms = clock_ms
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.writer_id = ""
        self.lost = False
        self.registrations = 0

    # --- registration -------------------------------------------------------------------

    def register(self) -> str:
        """Register a fresh writer id and start heartbeating it; returns the id."""
        writer_id = new_writer_id()
        with self._lock:
            self._machine.apply(
                lambda s: leases.register_writer(
                    s, writer_id, self._clock_ms(), self.lease_duration_ms
                )
            )
            self.writer_id, self.lost = writer_id, False
            self.registrations += 1
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._beat, name=f"writer-lease-{self._versions.shard_id}", daemon=True
            )
            self._thread.start()
        return writer_id

    def renew(self) -> str:
        """After being fenced: release what is left of the old id, register a new one."""
        self._release(self.writer_id)
        return self.register()

    def heartbeat(self) -> None:
        """Refresh the registration now; :class:`WriterFenced` if it is gone."""
        with self._lock:
            writer_id = self.writer_id
            try:
                self._machine.apply(
                    lambda s: leases.heartbeat_writer(s, writer_id, self._clock_ms())
                )
            except LeaseExpired as exc:
                self.lost = True
                raise WriterFenced(str(exc)) from exc

    def _beat(self) -> None:
        interval_s = self.lease_duration_ms / HEARTBEATS_PER_LEASE / 1000
        while not self._stop.wait(interval_s):
            if self.lost:
                continue
            try:
                self.heartbeat()
            except WriterFenced:
                log.warning("shard %s: writer %s lost its registration",
                            self._versions.shard_id, self.writer_id)
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any failure
                # Retried at the next beat; a lease that runs out only fences the writer.
                log.warning("shard %s: heartbeat of writer %s failed: %s",
                            self._versions.shard_id, self.writer_id, exc)

    def _release(self, writer_id: str) -> None:
        if not writer_id:
            return
        with self._lock:
            try:
                self._machine.apply(lambda s: leases.expire_writer(s, writer_id))
            except UpsertPlatformError as exc:
                log.warning("shard %s: releasing writer %s failed (its lease will expire):"
                            " %s", self._versions.shard_id, writer_id, exc)

    def close(self) -> None:
        """Stop heartbeating and release the registration."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._release(self.writer_id)

    def __enter__(self) -> WriterLease:
        self.register()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
