"""Applies state transitions to a shard with compare-and-set and retries.

A transition is a pure function ``fn(state) -> new state | None`` (``None``: nothing to
change). :meth:`Machine.apply` calls it on the newest state it knows, stamps the result
(``seqno + 1``, a non-decreasing ``walltime_ms``), checks the result's invariants and
compare-and-sets it; if another writer got there first it calls ``fn`` again on the
fresh state. ``fn`` may therefore run several times and must not have side effects
that cannot be repeated.

Invariants:

- Every committed state is ``fn`` applied to the state current at commit time: a
  transition is never applied to a stale state, so racing writers each land exactly
  once (or get :class:`~upsert_core.errors.ConcurrentModification` after
  ``max_retries`` lost races).
- A ``None`` (no change) answer is only trusted on a state known to be current: on the
  cached state it is confirmed by reading the head's seqno, and otherwise ``fn`` runs
  again on a fresh state. Likewise a platform error raised by ``fn`` on the cached
  state is only raised after ``fn`` raised it on a fresh state too. So after ``apply``
  returns, :meth:`Machine.cached_state` was current during the call.
- Every ``rollup_every`` seqnos after the newest rollup, the machine writes a rollup of
  the state it just committed and records it by a follow-up transition; a rollup that
  ends up unrecorded (someone recorded a newer one) is deleted again.
- Committed states are canonical: ``errors`` sorted by ts (stably), the order in
  which ``state_diff`` rebuilds them, so a writer's state equals a reader's.
- The cached state is only ever a state that was current at some point; it saves the
  fetch (head + rollup + diffs) when no one else wrote in between.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from upsert_core.errors import ConcurrentModification, InvalidUsage, UpsertPlatformError
from upsert_core.persist.location import CasCommitted
from upsert_core.persist.state.state import ShardState
from upsert_core.persist.state.state_versions import StateVersions

log = logging.getLogger(__name__)

Transition = Callable[[ShardState], ShardState | None]

DEFAULT_ROLLUP_EVERY = 16
DEFAULT_MAX_RETRIES = 100


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)


class Machine:
    """Compare-and-set state transitions on one shard (see the module docstring)."""

    def __init__(
        self,
        versions: StateVersions,
        *,
        rollup_every: int = DEFAULT_ROLLUP_EVERY,
        max_retries: int = DEFAULT_MAX_RETRIES,
        clock_ms: Callable[[], int] = _wall_clock_ms,
    ) -> None:
        if rollup_every < 1:
            raise InvalidUsage(f"rollup_every must be >= 1, got {rollup_every}")
        self.versions = versions
        self.rollup_every = rollup_every
        self.max_retries = max_retries
        self._clock_ms = clock_ms
        self._cached: ShardState | None = None

    @property
    def shard_id(self) -> str:
        return self.versions.shard_id

    def state(self) -> ShardState:
        """A freshly fetched current state (raises ShardNotFound if uninitialised)."""
        state = self.versions.fetch_current_state()
        self._cached = state
        return state

    def cached_state(self) -> ShardState:
        """The newest state this machine knows, fetching only if it knows none."""
        return self._cached if self._cached is not None else self.state()

    def apply(self, fn: Transition, *, max_retries: int | None = None) -> ShardState:
        """Apply ``fn`` and return the state it committed (or the current state if
        ``fn`` asked for no change). Raises ConcurrentModification after
        ``max_retries`` lost races; exceptions raised by ``fn`` propagate."""
        retries = self.max_retries if max_retries is None else max_retries
        committed = self._apply(fn, retries)
        if committed is not None:
            self._maybe_rollup(committed, retries)
            return committed
        return self.cached_state()

    def _stamp(self, current: ShardState, new: ShardState) -> ShardState:
        if new.shard_id != current.shard_id:
            raise InvalidUsage(
                f"transition on shard {current.shard_id!r} returned shard {new.shard_id!r}"
            )
        stamped = new.evolve(
            seqno=current.seqno + 1,
            walltime_ms=max(current.walltime_ms, self._clock_ms()),
            # Canonical order (stable by ts): the order a reader rebuilds from diffs.
            errors=tuple(sorted(new.errors, key=lambda e: e.ts)),
        )
        stamped.check_invariants()
        return stamped

    def _apply(self, fn: Transition, retries: int) -> ShardState | None:
        """Commit ``fn``'s result; ``None`` if ``fn`` asked for no change."""
        fresh = self._cached is None
        state = self.cached_state()
        lost = 0
        while True:
            try:
                new = fn(state)
            except UpsertPlatformError:
                if fresh:
                    raise
                # SUBTLE: ``fn`` may reject a stale cached state (e.g. an upper it
                # expected has moved on there but not here); only a fresh state counts.
                state, fresh = self.state(), True
                continue
            if new is None:
                if fresh:
                    return None
                # SUBTLE: the cache may be stale and ``fn`` might want a change on the
                # real current state; a head read tells whether anyone else wrote.
                if self.versions.head_seqno() == state.seqno:
                    return None
                state, fresh = self.state(), True
                continue
            stamped = self._stamp(state, new)
            result = self.versions.try_compare_and_set_current(state, stamped)
            if isinstance(result, CasCommitted):
                self._cached = stamped
                return stamped
            lost += 1
            if lost > retries:
                raise ConcurrentModification(
                    f"shard {self.shard_id!r}: gave up after losing {lost} compare-and-set"
                    " races to other writers; retry later"
                )
            state, fresh = result.current, True
            self._cached = state
            if lost >= 2:
                time.sleep(random.uniform(0, min(0.02, 0.0005 * 2**lost)))

    def _maybe_rollup(self, state: ShardState, retries: int) -> None:
        """Roll up ``state`` if it is ``rollup_every`` seqnos past the newest rollup.

        Never raises a platform error: the caller's transition has already committed,
        and failing now would make the caller retry (and apply it twice). A failed
        rollup is simply attempted again after the next commit.
        """
        latest = state.latest_rollup()
        if state.seqno - (0 if latest is None else latest.seqno) < self.rollup_every:
            return
        try:
            ref = self.versions.write_rollup(state)
        except UpsertPlatformError as exc:
            log.warning("shard %s: rollup of seqno %d failed: %s", self.shard_id, state.seqno, exc)
            return

        def record(current: ShardState) -> ShardState | None:
            newest = current.latest_rollup()
            if newest is not None and newest.seqno >= ref.seqno:
                return None  # someone recorded this or a newer rollup already
            return current.evolve(rollups={**current.rollups, ref.seqno: ref})

        try:
            recorded = self._apply(record, retries)
        except ConcurrentModification:
            recorded = None
        except UpsertPlatformError as exc:
            # SUBTLE: we cannot tell whether the rollup was recorded; leave the blob (an
            # unrecorded rollup is a leak that GC's leaked-blob detection removes).
            log.warning("shard %s: recording rollup %s failed: %s", self.shard_id, ref.key, exc)
            return
        if recorded is None or recorded.rollups.get(ref.seqno) != ref:
            # The record transition definitely did not commit our ref: no state
            # references this blob, so delete it.
            try:
                self.versions.delete_rollup(ref.key)
            except UpsertPlatformError as exc:
                log.warning("shard %s: deleting unrecorded rollup %s failed: %s",
                            self.shard_id, ref.key, exc)
