"""The shard's state: what one version of a shard's metadata holds.

A :class:`ShardState` is an immutable value. Every change to a shard produces a new
state with ``seqno + 1``; the sequence of states is stored as incremental diffs in
Consensus with periodic full rollups in Blob (``state_diff``, ``state_versions``).

Invariants of a well-formed state (checked by :func:`ShardState.check_invariants`):

- ``0 <= since <= upper``; reads need ``since <= ts < upper``. Since equals upper only
  while the shard is empty: ``gc --retain N`` requires ``N >= 1``, so it leaves at least
  ``upper - 1`` readable (a shard whose since reached its upper could never be read or
  rehydrated again; only older versions' ``gc --retain 0`` left one so).
- ``batches`` are ordered by ``lower`` and tile ``[0, upper)`` exactly: the first starts
  at 0, each starts where the previous ended, the last ends at ``upper``; an empty
  shard (upper 0) has no batches.
- Every batch's ``since`` is at most the shard's ``since`` (compaction may have advanced
  it up to the shard's since, never past).
- ``rollups`` maps a seqno at or below ``seqno`` to the blob key of the full state at
  that seqno; it always holds at least one rollup at or below the earliest live seqno
  (maintained by ``state_versions``).
- ``leased_readers`` hold seqnos: GC never truncates diffs at or above the smallest
  held seqno, and never deletes blobs a state at or above it references.
- ``ingested_files`` maps each ingested landing file name to the ts it was applied at;
  a name is in it iff its data (and its error rows) were committed.
- ``config`` entries whose name starts with :data:`BLOB_REF_PREFIX` hold blob keys
  (e.g. upsert state checkpoints) that the state references: GC keeps them exactly like
  batch parts.
- ``config`` entries ``blobref.late.<ts>.<b>`` (:data:`LATE_REF_PREFIX`) reference the
  late rows of the batch at ``ts`` (``ingest.late``): read only from ``since`` on, so
  advancing ``since`` past ``ts`` may drop them (``commit_times.with_since`` does).
- ``config`` entries ``commit_time.<lower>`` (:data:`COMMIT_TIME_PREFIX`) record when
  the batch starting at ``lower`` was committed (UTC milliseconds): each ``lower`` is
  in ``[0, upper)`` and the times never decrease as ``lower`` grows
  (``persist.state.commit_times`` writes and reads them).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from upsert_core.errors import ConfigError, InvariantViolation

BLOB_REF_PREFIX = "blobref."
"""Config entries named ``blobref.<anything>`` hold a blob key the state references."""

LATE_REF_PREFIX = f"{BLOB_REF_PREFIX}late."
"""Config entries ``blobref.late.<ts>.<bucket>``: a bucket's late part of the batch at
``ts`` (``ingest.late`` writes and reads them; :func:`late_ref_ts` parses the ts)."""

COMMIT_TIME_PREFIX = "commit_time."
"""Config entries ``commit_time.<lower>`` = ``<UTC ms>``: see ``persist.state.commit_times``."""

def late_ref_ts(name: str) -> tuple[int, int] | None:
    """``(ts, bucket)`` of a ``blobref.late.<ts>.<bucket>`` entry name (each written as
    ``str(n)``), None for any other name."""
    if not name.startswith(LATE_REF_PREFIX):
        return None
    ts, _, bucket = name[len(LATE_REF_PREFIX):].partition(".")
    parts = []
    for text in (ts, bucket):
        if not (text.isascii() and text.isdigit()) or str(int(text)) != text:
            return None
        parts.append(int(text))
    return parts[0], parts[1]


SHARD_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def validate_shard_name(name: str) -> str:
    """Return ``name`` if it is a safe shard name, else raise :class:`ConfigError`.

    Shard names become consensus keys and blob key prefixes, so they are restricted to
    ASCII letters, digits, ``_``, ``.`` and ``-``, start with a letter or digit, and
    never contain ``..`` (no path can escape the blob prefix).
    """
    if not SHARD_NAME_RE.match(name) or ".." in name:
        raise ConfigError(
            f"invalid shard name {name!r}: use 1-128 ASCII letters, digits, '_', '.', '-',"
            " starting with a letter or digit, without '..'"
        )
    return name


@dataclass(frozen=True, slots=True)
class BlobPart:
    """A batch part stored as its own blob (a Parquet file)."""

    key: str
    encoded_size_bytes: int
    num_updates: int


@dataclass(frozen=True, slots=True)
class InlinePart:
    """A small batch part kept inside the state itself (Parquet bytes)."""

    data: bytes
    num_updates: int

    @property
    def encoded_size_bytes(self) -> int:
        return len(self.data)


Part = BlobPart | InlinePart


@dataclass(frozen=True, slots=True)
class HollowBatch:
    """The metadata of a batch of updates with ``lower <= ts < upper``.

    ``since``: updates in the batch have had their times advanced to at least ``since``
    by compaction (0 for a freshly written batch). ``parts`` hold the updates; their
    union is the batch. ``num_updates`` is the sum over parts.
    """

    lower: int
    upper: int
    since: int
    parts: tuple[Part, ...]

    @property
    def num_updates(self) -> int:
        return sum(p.num_updates for p in self.parts)

    @property
    def encoded_size_bytes(self) -> int:
        return sum(p.encoded_size_bytes for p in self.parts)

    @property
    def is_empty(self) -> bool:
        return self.num_updates == 0


@dataclass(frozen=True, slots=True)
class RollupRef:
    """A full copy of the state at ``seqno``, stored in Blob at ``key``."""

    seqno: int
    key: str
    encoded_size_bytes: int


@dataclass(frozen=True, slots=True)
class WriterState:
    """A registered writer; expires when not heard from within ``lease_duration_ms``."""

    last_heartbeat_ms: int
    lease_duration_ms: int


@dataclass(frozen=True, slots=True)
class ReaderState:
    """A leased reader: it may read any ts >= ``since`` and holds ``seqno`` for GC."""

    since: int
    seqno: int
    last_heartbeat_ms: int
    lease_duration_ms: int


@dataclass(frozen=True, slots=True)
class ErrorBatch:
    """Row-level errors committed at ``ts``: a part of (file, row, reason) records."""

    ts: int
    part: Part
    num_errors: int


def _frozen(mapping: Mapping[str, object] | None = None) -> Mapping[str, object]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True, slots=True)
class ShardState:
    """One version of a shard's metadata. Immutable; derive new states with ``replace``.

    Mapping fields are read-only views; build new ones with ``dict(...)`` and pass them
    to :meth:`evolve`.
    """

    shard_id: str
    seqno: int
    since: int = 0
    upper: int = 0
    walltime_ms: int = 0
    batches: tuple[HollowBatch, ...] = ()
    rollups: Mapping[int, RollupRef] = field(default_factory=_frozen)  # type: ignore[arg-type]
    writers: Mapping[str, WriterState] = field(default_factory=_frozen)  # type: ignore[arg-type]
    leased_readers: Mapping[str, ReaderState] = field(default_factory=_frozen)  # type: ignore[arg-type]
    ingested_files: Mapping[str, int] = field(default_factory=_frozen)  # type: ignore[arg-type]
    errors: tuple[ErrorBatch, ...] = ()
    config: Mapping[str, str] = field(default_factory=_frozen)  # type: ignore[arg-type]

    def evolve(self, **changes: object) -> ShardState:
        """A copy with ``changes`` applied; mapping values are frozen."""
        for name in ("rollups", "writers", "leased_readers", "ingested_files", "config"):
            if name in changes:
                changes[name] = MappingProxyType(dict(changes[name]))  # type: ignore[call-overload]
        return replace(self, **changes)  # type: ignore[arg-type]

    # --- derived facts ------------------------------------------------------------

    def referenced_blob_keys(self) -> Iterator[str]:
        """Blob keys of batch parts, error parts and ``blobref.`` config entries this
        state references (not rollups)."""
        for batch in self.batches:
            for part in batch.parts:
                if isinstance(part, BlobPart):
                    yield part.key
        for err in self.errors:
            if isinstance(err.part, BlobPart):
                yield err.part.key
        for name, value in self.config.items():
            if name.startswith(BLOB_REF_PREFIX) and value:
                yield value

    def num_updates(self) -> int:
        return sum(b.num_updates for b in self.batches)

    def encoded_size_bytes(self) -> int:
        return sum(b.encoded_size_bytes for b in self.batches) + sum(
            e.part.encoded_size_bytes for e in self.errors
        )

    def num_errors(self) -> int:
        return sum(e.num_errors for e in self.errors)

    def commit_times(self) -> tuple[tuple[int, int], ...]:
        """The recorded ``(lower, commit time in UTC ms)`` entries, ordered by ``lower``
        (``persist.state.commit_times``); :class:`InvariantViolation` for a malformed one."""
        out: list[tuple[int, int]] = []
        for name, value in self.config.items():
            if not name.startswith(COMMIT_TIME_PREFIX):
                continue
            lower, ms = name[len(COMMIT_TIME_PREFIX):], value
            if not (lower.isascii() and lower.isdigit() and ms.isascii() and ms.isdigit()):
                raise InvariantViolation(
                    f"shard {self.shard_id}: malformed commit time entry {name!r}={ms!r}"
                )
            out.append((int(lower), int(ms)))
        out.sort()
        return tuple(out)

    def latest_rollup(self) -> RollupRef | None:
        if not self.rollups:
            return None
        return self.rollups[max(self.rollups)]

    def check_invariants(self) -> None:
        """Raise :class:`InvariantViolation` naming the first broken invariant."""
        sid = self.shard_id
        if not 0 <= self.since <= self.upper:
            raise InvariantViolation(
                f"shard {sid}: since {self.since} not within [0, upper {self.upper}]"
            )
        expected_lower = 0
        for batch in self.batches:
            if batch.lower != expected_lower or batch.upper <= batch.lower:
                raise InvariantViolation(
                    f"shard {sid}: batches do not tile [0, {self.upper}): batch "
                    f"[{batch.lower}, {batch.upper}) follows {expected_lower}"
                )
            if batch.since > max(self.since, batch.lower):
                raise InvariantViolation(
                    f"shard {sid}: batch [{batch.lower}, {batch.upper}) since {batch.since}"
                    f" is beyond the shard's since {self.since}"
                )
            expected_lower = batch.upper
        if expected_lower != self.upper:
            raise InvariantViolation(
                f"shard {sid}: batches end at {expected_lower}, upper is {self.upper}"
            )
        for seqno in self.rollups:
            if seqno > self.seqno:
                raise InvariantViolation(
                    f"shard {sid}: rollup at seqno {seqno} is newer than state {self.seqno}"
                )
        for name, ts in self.ingested_files.items():
            if not 0 <= ts < max(self.upper, 1):
                raise InvariantViolation(
                    f"shard {sid}: ingested file {name!r} at ts {ts} outside [0, {self.upper})"
                )
        previous: tuple[int, int] | None = None
        for lower, ms in self.commit_times():
            if lower >= self.upper:
                raise InvariantViolation(
                    f"shard {sid}: commit time recorded for ts {lower}, upper is {self.upper}"
                )
            if previous is not None and ms < previous[1]:
                raise InvariantViolation(
                    f"shard {sid}: commit time of ts {lower} ({ms} ms) is before that of"
                    f" ts {previous[0]} ({previous[1]} ms)"
                )
            previous = (lower, ms)


def initial_state(shard_id: str, walltime_ms: int = 0) -> ShardState:
    """The state of a freshly initialised shard (seqno 1, empty, upper 0)."""
    return ShardState(shard_id=validate_shard_name(shard_id), seqno=1, walltime_ms=walltime_ms)
