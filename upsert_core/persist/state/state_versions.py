"""A shard's state as a durable, truncatable log: diffs in Consensus, rollups in Blob.

Design. The consensus key of a shard (its id) holds one entry per state version:

- seqno 1 holds the diff from the empty state (seqno 0, all fields empty) to the
  initial state, so the first entry alone is a full copy of state 1;
- seqno ``n > 1`` holds the encoded :class:`StateDiff` from state ``n-1`` to state
  ``n``; every diff also names the newest rollup of its target state
  (``latest_rollup_key``);
- rollups (full copies of the state at some seqno) are blobs at
  ``{shard}/rollup/{seqno:020d}-{uuid}`` and are recorded in ``state.rollups``. The
  initial state's rollup is written before the first compare-and-set and lists itself
  (self-referential, see ``codec_state``); later rollups of state ``s`` are recorded
  by a later version (``> s``) that adds ``rollups[s]``.

Reading the current state: read the head, take its ``latest_rollup_key``, fetch that
rollup (state ``r``) and apply the diffs ``r+1 ..``. If the rollup vanished or the diffs
after it were truncated (a GC race: the head we read is no longer current), read the
head again; give up after a bounded number of attempts with a clear error.

Invariants (checked by :func:`check_invariants`):

- The shard is initialised iff Consensus holds at least one version of it.
- ``earliest`` (the smallest seqno in Consensus) exists and the seqnos are contiguous
  from ``earliest`` to ``current``; ``current.seqno`` is the head's seqno.
- There is a rollup at exactly ``earliest`` recorded in the live states' rollups and
  present in Blob (the state at ``earliest`` must be rebuildable without the truncated
  diffs below it). :meth:`StateVersions.truncate` keeps this: it only truncates to a
  seqno that has a recorded, existing rollup, never past the newest version, and never
  past a leased reader's seqno.
- Every rollup recorded in ``current`` exists in Blob, except rollups older than
  ``earliest`` that GC is about to remove. Hence a missing rollup named by a state we
  believed current proves that state is no longer current.
- Diffs are applied strictly: a diff that does not apply raises ``InvalidStateDiff``
  and is never retried around.
- A compare-and-set reported as not committed is not, and never will be, in the log:
  an indeterminate outcome is settled only by seeing its seqno taken, else raised as
  :class:`IndeterminateError`. Every cleanup that deletes blobs after "not committed"
  relies on this (``Machine`` rollups, ``gc.rollup_current``, ``maybe_init_shard``,
  the callers of ``append.delete_uncommitted``; ``compact`` re-checks it).
"""

from __future__ import annotations

import functools
import logging
import random
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from upsert_core.errors import (
    CorruptData,
    DeterminateError,
    IndeterminateError,
    InvalidUsage,
    InvariantViolation,
    LocationError,
    LocationUnreachable,
    ShardError,
    ShardNotFound,
)
from upsert_core.persist.keys import consensus_key, parse_rollup_seqno, rollup_key
from upsert_core.persist.location import (
    Blob,
    CasCommitted,
    CasMismatch,
    CasResult,
    Consensus,
    VersionedData,
)
from upsert_core.persist.state.codec_state import (
    decode_diff,
    decode_rollup,
    encode_diff,
    encode_rollup,
)
from upsert_core.persist.state.state import (
    RollupRef,
    ShardState,
    initial_state,
    validate_shard_name,
)
from upsert_core.persist.state.state_diff import Insert, StateDiff, Update, apply_all

log = logging.getLogger(__name__)

T = TypeVar("T")

SCAN_PAGE = 1000
"""How many consensus versions one scan call asks for."""


@dataclass(frozen=True, slots=True)
class StateMismatch:
    """A compare-and-set lost: ``current`` is a fresh current state of the shard."""

    current: ShardState


def _now_ms() -> int:
    return int(time.time() * 1000)


def empty_state(shard_id: str) -> ShardState:
    """The state before the first version (seqno 0); the first diff starts here."""
    return ShardState(shard_id=shard_id, seqno=0)


class StateVersions:
    """Reads and writes the versions of one shard's state (see the module docstring)."""

    def __init__(
        self,
        consensus: Consensus,
        blob: Blob,
        shard_id: str,
        *,
        fetch_attempts: int = 10,
        location_attempts: int = 5,
    ) -> None:
        self.consensus = consensus
        self.blob = blob
        self.shard_id = validate_shard_name(shard_id)
        self._key = consensus_key(shard_id)
        self.fetch_attempts = fetch_attempts
        self.location_attempts = location_attempts

    # --- location calls with bounded retries --------------------------------------

    def _retry(self, what: str, op: Callable[[], T], *, idempotent: bool) -> T:
        """Run ``op``, retrying determinate failures (and any failure if idempotent)."""
        attempt = 0
        while True:
            try:
                return op()
            except LocationError as exc:
                # A store that already waited out its own reconnect window is down:
                # retrying here would only multiply that window.
                if isinstance(exc, LocationUnreachable):
                    raise
                attempt += 1
                retryable = isinstance(exc, DeterminateError) or idempotent
                if not retryable or attempt >= self.location_attempts:
                    raise
                log.debug("shard %s: %s failed (%s), retrying", self.shard_id, what, exc)
                time.sleep(random.uniform(0, 0.002 * 2**attempt))

    def head(self) -> VersionedData | None:
        """The newest consensus entry of the shard, or ``None`` if uninitialised."""
        return self._retry("head", lambda: self.consensus.head(self._key), idempotent=True)

    def head_seqno(self) -> int | None:
        """The seqno of the current state, or ``None`` if uninitialised."""
        head = self.head()
        return None if head is None else head.seqno

    def _scan_from(self, seqno: int) -> list[VersionedData]:
        """Every consensus entry with seqno >= ``seqno``, in order (paged)."""
        out: list[VersionedData] = []
        start = seqno
        while True:
            page = self._retry(
                "scan", functools.partial(self.consensus.scan, self._key, start, SCAN_PAGE),
                idempotent=True,
            )
            out.extend(page)
            if len(page) < SCAN_PAGE:
                return out
            start = page[-1].seqno + 1

    def live_diffs(self) -> list[VersionedData]:
        """Every live consensus entry of the shard, oldest first."""
        return self._scan_from(0)

    def _get_rollup(self, key: str) -> ShardState | None:
        data = self._retry("rollup get", lambda: self.blob.get(key), idempotent=True)
        if data is None:
            return None
        state = decode_rollup(data, key)
        if state.shard_id != self.shard_id or parse_rollup_seqno(key) != state.seqno:
            raise CorruptData(
                f"rollup {key!r} holds shard {state.shard_id!r} at seqno {state.seqno}, which"
                f" does not match its key (shard {self.shard_id!r})"
            )
        return state

    def delete_rollup(self, key: str) -> None:
        """Delete a rollup blob (idempotent)."""
        self._retry("rollup delete", lambda: self.blob.delete(key), idempotent=True)

    # --- reading --------------------------------------------------------------------

    @staticmethod
    def _apply_entries(state: ShardState, entries: list[VersionedData]) -> ShardState:
        diffs = []
        for entry in entries:
            diff = decode_diff(entry.data)
            if diff.seqno_to != entry.seqno:
                raise CorruptData(
                    f"consensus entry {entry.seqno} of shard {state.shard_id!r} holds the diff"
                    f" {diff.seqno_from}->{diff.seqno_to}"
                )
            diffs.append(diff)
        return apply_all(state, diffs)  # each changed field copied once for the chain

    def fetch_current_state(self) -> ShardState:
        """The current state: newest rollup plus the diffs after it.

        Raises ShardNotFound for an uninitialised shard, and InvariantViolation if the
        rollup the head names keeps vanishing (more than ``fetch_attempts`` times).
        """
        missing: list[str] = []
        for _ in range(self.fetch_attempts):
            head = self.head()
            if head is None:
                raise ShardNotFound(f"shard {self.shard_id!r} has not been initialised")
            diff = decode_diff(head.data)
            key = diff.latest_rollup_key
            if key is None:
                raise InvariantViolation(
                    f"shard {self.shard_id!r}: version {head.seqno} names no rollup"
                )
            state = self._get_rollup(key)
            if state is None:
                # SUBTLE: GC removed this rollup after we read the head, so the head is no
                # longer current (the current state's rollups always exist). Re-read it.
                missing.append(key)
                continue
            if state.seqno == head.seqno:
                return state
            entries = self._scan_from(state.seqno + 1)
            if not entries or entries[0].seqno != state.seqno + 1:
                # SUBTLE: the diffs after the rollup were truncated after we read the head
                # (GC moved on to a newer rollup). Re-read the head.
                missing.append(f"diffs after {key}")
                continue
            return self._apply_entries(state, entries)
        raise InvariantViolation(
            f"shard {self.shard_id!r}: could not read a consistent current state after"
            f" {self.fetch_attempts} attempts; missing: {', '.join(missing[-3:])}. If this"
            " persists, check that Consensus and Blob belong together (same deployment)."
        )

    def earliest_live_seqno(self) -> int | None:
        """The smallest seqno still in Consensus, or ``None`` if uninitialised."""
        page = self._retry(
            "scan", lambda: self.consensus.scan(self._key, 0, 1), idempotent=True
        )
        return page[0].seqno if page else None

    def _find_rollup_ref(
        self, seqno: int, entries: list[VersionedData]
    ) -> RollupRef | None:
        """The rollup recorded at ``seqno`` by the current state or by a live diff."""
        try:
            current = self.fetch_current_state()
        except InvariantViolation:
            current = None
        if current is not None and seqno in current.rollups:
            return current.rollups[seqno]
        for entry in entries:
            for change in decode_diff(entry.data).changes:
                if change.field == "rollups" and change.key == seqno:
                    op = change.change
                    if isinstance(op, Insert):
                        ref: RollupRef = op.value
                        return ref
                    if isinstance(op, Update):
                        ref = op.after
                        return ref
        return None

    def fetch_all_live_states(self) -> Iterator[ShardState]:
        """Every live state, oldest (``earliest``) to current.

        Raises ShardNotFound (eagerly) for an uninitialised shard. States are built
        lazily, one diff at a time.
        """
        for _ in range(self.fetch_attempts):
            entries = self.live_diffs()
            if not entries:
                raise ShardNotFound(f"shard {self.shard_id!r} has not been initialised")
            earliest = entries[0].seqno
            if earliest == 1:
                return self._iter_states(empty_state(self.shard_id), entries)
            ref = self._find_rollup_ref(earliest, entries)
            state = None if ref is None else self._get_rollup(ref.key)
            if state is None:
                # SUBTLE: GC truncated past ``earliest`` and deleted its rollup after our
                # scan; scan again.
                continue
            return self._iter_states(state, entries[1:])
        raise InvariantViolation(
            f"shard {self.shard_id!r}: no readable rollup at the earliest live seqno after"
            f" {self.fetch_attempts} attempts"
        )

    def _iter_states(
        self, state: ShardState, entries: list[VersionedData]
    ) -> Iterator[ShardState]:
        if state.seqno > 0:
            yield state
        for entry in entries:
            state = self._apply_entries(state, [entry])
            yield state

    # --- writing --------------------------------------------------------------------

    def write_rollup(self, state: ShardState) -> RollupRef:
        """Write a rollup of ``state`` to Blob (only; the caller records it by a CaS)."""
        if state.shard_id != self.shard_id:
            raise InvalidUsage(f"state of shard {state.shard_id!r} given to {self.shard_id!r}")
        if state.seqno in state.rollups:
            raise InvalidUsage(
                f"shard {self.shard_id!r}: state {state.seqno} already lists a rollup at its"
                " own seqno"
            )
        key = rollup_key(self.shard_id, state.seqno)
        data = encode_rollup(state)
        self._retry("rollup set", lambda: self.blob.set(key, data), idempotent=True)
        return RollupRef(seqno=state.seqno, key=key, encoded_size_bytes=len(data))

    def _cas(
        self, expected_seqno: int | None, old: ShardState, new: ShardState
    ) -> tuple[bool, CasResult | None]:
        """Write the diff ``old -> new`` at ``new.seqno`` iff the head is ``expected_seqno``.

        Returns (committed, the raw result when there was one). ``False`` means the
        diff is not, and never will be, at ``new.seqno``. Raises IndeterminateError when
        that cannot be established (see :meth:`_resolve_indeterminate`).
        """
        data = encode_diff(StateDiff.from_states(old, new), nonce=uuid.uuid4().hex)
        entry = VersionedData(new.seqno, data)
        try:
            result = self._retry(
                "compare_and_set",
                lambda: self.consensus.compare_and_set(self._key, expected_seqno, entry),
                idempotent=False,
            )
        except IndeterminateError as exc:
            return self._resolve_indeterminate(expected_seqno, entry, exc)
        return isinstance(result, CasCommitted), result

    def _resolve_indeterminate(
        self, expected_seqno: int | None, entry: VersionedData, exc: IndeterminateError
    ) -> tuple[bool, CasResult | None]:
        """Settle a compare-and-set of ``entry`` that failed indeterminately.

        SUBTLE: the write may have happened, may not, or may still be in flight, and a
        read may not show it yet (a lagging replica). So "nothing at our seqno" proves
        nothing; only a TAKEN seqno settles it: a version there never changes, and the
        nonce makes our bytes unique, so equal bytes mean we won and other bytes mean
        we lost for good. Until the seqno is seen taken, offer the identical bytes
        again with the same expectation (as the reference retries its initial
        compare-and-set): of the two attempts at most one can land, and which one does
        not matter. If it stays unknown, raise IndeterminateError: callers then leave
        their new blobs to GC's leaked-blob sweep instead of guessing.
        """
        for attempt in range(self.location_attempts):
            try:
                found = self._retry(
                    "scan", lambda: self.consensus.scan(self._key, entry.seqno, 1),
                    idempotent=True,
                )
                if found and found[0].seqno == entry.seqno:
                    return found[0].data == entry.data, None
                if found:
                    break  # truncated past our seqno already: we cannot tell
                result = self._retry(
                    "compare_and_set",
                    lambda: self.consensus.compare_and_set(self._key, expected_seqno, entry),
                    idempotent=False,
                )
            except IndeterminateError as again:
                exc = again
                time.sleep(random.uniform(0, 0.002 * 2**attempt))
                continue
            except LocationError as failed:
                # A determinate failure of THIS call says nothing about the first one.
                raise IndeterminateError(
                    f"shard {self.shard_id!r}: compare_and_set of seqno {entry.seqno} timed"
                    f" out ({exc}) and checking its outcome failed: {failed}"
                ) from failed
            if isinstance(result, CasCommitted):
                return True, result
            # A mismatch: the head is past ``expected_seqno``, so our seqno is taken.
            if result.current is not None and result.current.seqno == entry.seqno:
                return result.current.data == entry.data, result
            # Otherwise the next scan reads what holds it.
        raise IndeterminateError(
            f"shard {self.shard_id!r}: compare_and_set of seqno {entry.seqno} timed out and"
            f" its outcome could not be established ({exc}); any blobs it would reference"
            " are left for GC"
        ) from exc

    def try_compare_and_set_current(
        self, expected: ShardState, new: ShardState
    ) -> CasCommitted | StateMismatch:
        """Make ``new`` current iff ``expected`` is current. ``new.seqno`` must be
        ``expected.seqno + 1``. On a lost race returns the fresh current state."""
        for state in (expected, new):
            if state.shard_id != self.shard_id:
                raise InvalidUsage(
                    f"state of shard {state.shard_id!r} given to shard {self.shard_id!r}"
                )
        if new.seqno != expected.seqno + 1:
            raise InvalidUsage(
                f"shard {self.shard_id!r}: new seqno {new.seqno} must be expected seqno"
                f" {expected.seqno} + 1"
            )
        committed, result = self._cas(expected.seqno, expected, new)
        if committed:
            return CasCommitted()
        if (
            isinstance(result, CasMismatch)
            and result.current is not None
            and result.current.seqno == new.seqno
        ):
            # Cheap path: only one version landed before ours; it is a diff from
            # ``expected``, so apply it instead of refetching.
            try:
                return StateMismatch(self._apply_entries(expected, [result.current]))
            except ShardError:
                pass  # fall back to a full fetch, which reports real problems
        return StateMismatch(self.fetch_current_state())

    def maybe_init_shard(
        self, config: Mapping[str, str] | None = None, *, walltime_ms: int | None = None
    ) -> ShardState:
        """The current state, creating the shard (with ``config``) if uninitialised.

        Writes the initial rollup first and then compare-and-sets seqno 1. If another
        process initialised the shard first, deletes our rollup and returns theirs.
        """
        if self.head() is not None:
            return self.fetch_current_state()
        base = initial_state(self.shard_id, _now_ms() if walltime_ms is None else walltime_ms)
        base = base.evolve(config=dict(config or {}))
        key = rollup_key(self.shard_id, 1)
        # The state lists its own rollup, whose size is that of the encoding, which
        # leaves the own entry out (so it does not depend on itself).
        data = encode_rollup(base.evolve(rollups={1: RollupRef(1, key, 0)}))
        state = base.evolve(rollups={1: RollupRef(1, key, len(data))})
        self._retry("rollup set", lambda: self.blob.set(key, data), idempotent=True)
        committed, _ = self._cas(None, empty_state(self.shard_id), state)
        if committed:
            return state
        current = self.fetch_current_state()
        # SUBTLE: after an indeterminate CaS the winner may be ourselves; only delete our
        # rollup if the winning state does not reference it.
        if all(ref.key != key for ref in current.rollups.values()):
            self.delete_rollup(key)
        return current

    def truncate(self, seqno: int) -> int:
        """Delete the diffs below ``seqno``; returns how many were deleted.

        ``seqno`` must have a rollup recorded in the current state that exists in Blob
        (it becomes the rollup at ``earliest``), must not exceed the current seqno and
        must not exceed any leased reader's seqno.
        """
        current = self.fetch_current_state()
        if seqno > current.seqno:
            raise InvalidUsage(
                f"shard {self.shard_id!r}: cannot truncate below {seqno}, beyond the current"
                f" seqno {current.seqno}"
            )
        ref = current.rollups.get(seqno)
        if ref is None:
            raise InvalidUsage(
                f"shard {self.shard_id!r}: cannot truncate below {seqno}: no rollup is recorded"
                f" at {seqno} (rollups at {sorted(current.rollups)}), so the state there could"
                " not be rebuilt"
            )
        if self._retry("rollup get", lambda: self.blob.get(ref.key), idempotent=True) is None:
            raise InvariantViolation(
                f"shard {self.shard_id!r}: rollup {ref.key!r} recorded in the current state is"
                " missing from Blob"
            )
        held = [r.seqno for r in current.leased_readers.values()]
        if held and seqno > min(held):
            raise InvalidUsage(
                f"shard {self.shard_id!r}: cannot truncate below {seqno}: a leased reader"
                f" holds seqno {min(held)}"
            )
        earliest = self.earliest_live_seqno()
        if earliest is None or seqno <= earliest:
            return 0
        return self._retry(
            "truncate", lambda: self.consensus.truncate(self._key, seqno), idempotent=True
        )


def check_invariants(versions: StateVersions) -> list[str]:
    """Every broken invariant of the shard's stored versions (empty when all hold).

    Meant for a quiescent shard (tests, ``check`` commands): with concurrent writers
    or GC a transient problem may be reported.
    """
    sid = versions.shard_id
    entries = versions.live_diffs()
    if not entries:
        return [f"shard {sid!r}: not initialised (no versions in Consensus)"]
    problems: list[str] = []
    earliest, head = entries[0].seqno, entries[-1].seqno
    for prev, cur in zip(entries, entries[1:], strict=False):
        if cur.seqno != prev.seqno + 1:
            problems.append(f"shard {sid!r}: seqnos jump from {prev.seqno} to {cur.seqno}")
    try:
        states = list(versions.fetch_all_live_states())
    except ShardError as exc:
        return [*problems, f"shard {sid!r}: live states cannot be rebuilt: {exc}"]
    if [s.seqno for s in states] != [e.seqno for e in entries]:
        problems.append(f"shard {sid!r}: live states do not match the live diffs")
    for state, entry in zip(states, entries, strict=False):
        latest = state.latest_rollup()
        named = decode_diff(entry.data).latest_rollup_key
        if (None if latest is None else latest.key) != named:
            problems.append(
                f"shard {sid!r}: version {entry.seqno} names rollup {named!r}, its state's"
                f" newest is {latest!r}"
            )
    refs = [s.rollups[earliest] for s in states if earliest in s.rollups]
    if not refs:
        problems.append(f"shard {sid!r}: no live state records a rollup at earliest {earliest}")
    elif versions.blob.get(refs[-1].key) is None:
        problems.append(f"shard {sid!r}: the rollup at earliest {earliest} is missing from Blob")
    current = states[-1] if states else None
    try:
        fetched = versions.fetch_current_state()
    except ShardError as exc:
        problems.append(f"shard {sid!r}: current state cannot be fetched: {exc}")
        fetched = None
    if fetched is not None and current is not None:
        if fetched != current or fetched.seqno != head:
            problems.append(
                f"shard {sid!r}: fetched current seqno {fetched.seqno} differs from the live"
                f" states' newest {current.seqno} / head {head}"
            )
        for ref_seqno, ref in sorted(fetched.rollups.items()):
            if ref_seqno >= earliest and versions.blob.get(ref.key) is None:
                problems.append(
                    f"shard {sid!r}: rollup {ref.key!r} of the current state is missing"
                )
        try:
            fetched.check_invariants()
        except InvariantViolation as exc:
            problems.append(str(exc))
    return problems


def assert_invariants(versions: StateVersions) -> None:
    """Raise InvariantViolation listing every problem :func:`check_invariants` finds."""
    problems = check_invariants(versions)
    if problems:
        raise InvariantViolation("; ".join(problems))
