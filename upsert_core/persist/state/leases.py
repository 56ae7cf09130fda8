"""Writer and reader leases: who is writing a shard and what readers hold back from GC.

Every function here is a pure transition ``ShardState -> ShardState | None`` (``None``:
nothing to change), meant for :meth:`Machine.apply`; the clock is an argument, so the
transitions are deterministic and may be re-run on a fresher state after a lost race.

Invariants:

- A writer is registered under an id with a heartbeat time and a lease duration; it is
  expired (removed) by :func:`expire_leases` once ``now > last_heartbeat + duration``.
  A writer's registration is what fences it: an append or compaction from a writer
  that is not registered is refused (``persist.write.writers``), so GC may delete the
  unreferenced blobs of a writer it has removed.
- A leased reader holds a ``since`` (the earliest time it may still read) and a
  ``seqno`` (the oldest state version it may still be reading). While the lease lives:
  compaction never advances updates past the reader's since, ``gc --retain`` never
  moves the shard's since past it, and GC never truncates diffs at or above its seqno
  nor deletes blobs a state at or above it references.
- A reader's since and seqno only move forward (:func:`downgrade_reader_since`,
  :func:`heartbeat_reader`); its since starts at the shard's since and its seqno at the
  seqno current when it registered.
- A lease that is gone (expired or released) is never silently re-created by a
  heartbeat: the holder gets :class:`LeaseExpired` and must register again, because
  GC may already have removed what it was reading.
"""

from __future__ import annotations

from upsert_core.errors import InvalidUsage, LeaseExpired
from upsert_core.persist.state.state import ReaderState, ShardState, WriterState

DEFAULT_LEASE_DURATION_MS = 15 * 60 * 1000
"""How long a lease lives without a heartbeat (15 minutes)."""


def _check_duration(lease_duration_ms: int) -> None:
    if lease_duration_ms <= 0:
        raise InvalidUsage(f"lease duration must be > 0 ms, got {lease_duration_ms}")


def _expired(last_heartbeat_ms: int, lease_duration_ms: int, now_ms: int) -> bool:
    return now_ms > last_heartbeat_ms + lease_duration_ms


# --- writers ------------------------------------------------------------------------


def register_writer(
    state: ShardState,
    writer_id: str,
    now_ms: int,
    lease_duration_ms: int = DEFAULT_LEASE_DURATION_MS,
) -> ShardState:
    """Register (or re-register) ``writer_id`` with a fresh heartbeat."""
    _check_duration(lease_duration_ms)
    writer = WriterState(last_heartbeat_ms=now_ms, lease_duration_ms=lease_duration_ms)
    return state.evolve(writers={**state.writers, writer_id: writer})


def heartbeat_writer(state: ShardState, writer_id: str, now_ms: int) -> ShardState:
    """Refresh ``writer_id``'s heartbeat; :class:`LeaseExpired` if it is not registered."""
    writer = state.writers.get(writer_id)
    if writer is None:
        raise LeaseExpired(
            f"shard {state.shard_id}: writer {writer_id!r} is not registered (its lease"
            " expired or it never registered); register it again"
        )
    fresh = WriterState(
        last_heartbeat_ms=max(writer.last_heartbeat_ms, now_ms),
        lease_duration_ms=writer.lease_duration_ms,
    )
    return state.evolve(writers={**state.writers, writer_id: fresh})


def expire_writer(state: ShardState, writer_id: str) -> ShardState | None:
    """Remove ``writer_id`` (no change if it is not registered)."""
    if writer_id not in state.writers:
        return None
    return state.evolve(writers={k: v for k, v in state.writers.items() if k != writer_id})


# --- readers ------------------------------------------------------------------------


def register_reader(
    state: ShardState,
    reader_id: str,
    now_ms: int,
    lease_duration_ms: int = DEFAULT_LEASE_DURATION_MS,
) -> ShardState:
    """Lease ``reader_id`` at the shard's since, holding the current seqno.

    The hold is ``state.seqno``: the registration itself commits ``state.seqno + 1``,
    which the reader then reads, so everything it can see is at or above its hold.
    """
    _check_duration(lease_duration_ms)
    if reader_id in state.leased_readers:
        raise InvalidUsage(f"shard {state.shard_id}: reader {reader_id!r} is already leased")
    reader = ReaderState(
        since=state.since,
        seqno=state.seqno,
        last_heartbeat_ms=now_ms,
        lease_duration_ms=lease_duration_ms,
    )
    return state.evolve(leased_readers={**state.leased_readers, reader_id: reader})


def _reader(state: ShardState, reader_id: str) -> ReaderState:
    reader = state.leased_readers.get(reader_id)
    if reader is None:
        raise LeaseExpired(
            f"shard {state.shard_id}: reader {reader_id!r} holds no lease (it expired or"
            " was released); GC may have removed what it read, so register a new reader"
        )
    return reader


def heartbeat_reader(
    state: ShardState, reader_id: str, now_ms: int, *, hold_seqno: int | None = None
) -> ShardState:
    """Refresh the reader's heartbeat, and advance its hold to ``hold_seqno`` if given.

    A hold never moves backwards (a smaller ``hold_seqno`` is ignored) and never past
    the current seqno.
    """
    reader = _reader(state, reader_id)
    seqno = reader.seqno
    if hold_seqno is not None:
        seqno = min(max(seqno, hold_seqno), state.seqno)
    fresh = ReaderState(
        since=reader.since,
        seqno=seqno,
        last_heartbeat_ms=max(reader.last_heartbeat_ms, now_ms),
        lease_duration_ms=reader.lease_duration_ms,
    )
    return state.evolve(leased_readers={**state.leased_readers, reader_id: fresh})


def downgrade_reader_since(state: ShardState, reader_id: str, since: int) -> ShardState | None:
    """Let the reader give up reads before ``since`` (only forward, at most the upper)."""
    reader = _reader(state, reader_id)
    if since > state.upper:
        raise InvalidUsage(
            f"shard {state.shard_id}: cannot downgrade reader {reader_id!r} to since {since}"
            f" beyond the upper {state.upper}"
        )
    if since <= reader.since:
        return None
    fresh = ReaderState(
        since=since,
        seqno=reader.seqno,
        last_heartbeat_ms=reader.last_heartbeat_ms,
        lease_duration_ms=reader.lease_duration_ms,
    )
    return state.evolve(leased_readers={**state.leased_readers, reader_id: fresh})


def release_reader(state: ShardState, reader_id: str) -> ShardState | None:
    """Drop the reader's lease (no change if it is already gone)."""
    if reader_id not in state.leased_readers:
        return None
    return state.evolve(
        leased_readers={k: v for k, v in state.leased_readers.items() if k != reader_id}
    )


# --- expiry and the facts GC needs ------------------------------------------------------


def expire_leases(state: ShardState, now_ms: int) -> ShardState | None:
    """Remove every writer and reader whose lease ran out by ``now_ms`` (None: none did)."""
    writers = {
        k: w
        for k, w in state.writers.items()
        if not _expired(w.last_heartbeat_ms, w.lease_duration_ms, now_ms)
    }
    readers = {
        k: r
        for k, r in state.leased_readers.items()
        if not _expired(r.last_heartbeat_ms, r.lease_duration_ms, now_ms)
    }
    if len(writers) == len(state.writers) and len(readers) == len(state.leased_readers):
        return None
    return state.evolve(writers=writers, leased_readers=readers)


def min_held_seqno(state: ShardState) -> int:
    """The smallest seqno a leased reader holds, or the current seqno if none does."""
    return min([state.seqno, *(r.seqno for r in state.leased_readers.values())])


def min_reader_since(state: ShardState) -> int | None:
    """The smallest since of any leased reader (``None`` when there are none)."""
    sinces = [r.since for r in state.leased_readers.values()]
    return min(sinces) if sinces else None
