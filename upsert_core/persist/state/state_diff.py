"""Incremental differences between two versions of a shard's state.

A :class:`StateDiff` turns the state at ``seqno_from`` into the state at ``seqno_to``.
It is a flat list of per-field changes, each an :class:`Insert`, :class:`Update` or
:class:`Delete` of one key of one field:

- scalar fields (``since``, ``upper``, ``walltime_ms``) have the single key ``None``
  and only ever change by :class:`Update`;
- map fields (``rollups``, ``writers``, ``leased_readers``, ``ingested_files``,
  ``config``) are keyed by their mapping keys;
- ``batches`` are keyed by ``(lower, upper)`` (batches tile the time line, so the key
  is unique); compacting adjacent batches is two deletes and one insert;
- ``errors`` are keyed by ``(ts, n)`` where ``n`` counts earlier error batches at the
  same ts, so several error batches committed at one ts stay distinct.

Invariants:

- ``StateDiff.from_states(old, new).apply(old) == new`` for well-formed states whose
  ``errors`` are in ts order (the order appends produce); ``apply`` rebuilds
  ``batches`` sorted by ``lower`` and ``errors`` sorted by ``(ts, n)``.
- Application is STRICT: the diff must start at the state's seqno and shard; an
  :class:`Update` or :class:`Delete` whose ``before`` is not the state's current value,
  or an :class:`Insert` of a key that already exists, raises
  :class:`~upsert_core.errors.InvalidStateDiff` naming the field and the key. A
  follower that applies diffs therefore either reproduces the leader's state exactly or
  fails loudly; it never silently diverges.
- A diff never changes ``shard_id``; ``seqno`` moves from ``seqno_from`` to
  ``seqno_to``.
- ``latest_rollup_key`` denormalises the key of the newest rollup in the target state
  (``None`` only when it has none), so a reader holding just the newest diff knows
  which rollup to start from.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from upsert_core.errors import InvalidStateDiff, InvalidUsage, InvariantViolation
from upsert_core.persist.state.state import ErrorBatch, HollowBatch, ShardState

SCALAR_FIELDS: tuple[str, ...] = ("since", "upper", "walltime_ms")
MAP_FIELDS: tuple[str, ...] = (
    "rollups",
    "writers",
    "leased_readers",
    "ingested_files",
    "config",
)
KEYED_SEQUENCE_FIELDS: tuple[str, ...] = ("batches", "errors")
ALL_FIELDS: tuple[str, ...] = SCALAR_FIELDS + MAP_FIELDS + KEYED_SEQUENCE_FIELDS

_REPR_LIMIT = 240


@dataclass(frozen=True, slots=True)
class Insert:
    """A key that did not exist now holds ``value``."""

    value: Any


@dataclass(frozen=True, slots=True)
class Update:
    """A key changed from ``before`` to ``after``."""

    before: Any
    after: Any


@dataclass(frozen=True, slots=True)
class Delete:
    """A key holding ``before`` was removed."""

    before: Any


ValDiff = Insert | Update | Delete


@dataclass(frozen=True, slots=True)
class FieldDiff:
    """One change of one key of one field of the state."""

    field: str
    key: Hashable
    change: ValDiff


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _REPR_LIMIT else text[: _REPR_LIMIT - 3] + "..."


def batches_by_key(batches: tuple[HollowBatch, ...]) -> dict[Hashable, HollowBatch]:
    """``batches`` keyed by ``(lower, upper)``; a duplicate key is an invariant violation."""
    out: dict[Hashable, HollowBatch] = {}
    for batch in batches:
        key = (batch.lower, batch.upper)
        if key in out:
            raise InvariantViolation(f"two batches share the range [{key[0]}, {key[1]})")
        out[key] = batch
    return out


def errors_by_key(errors: tuple[ErrorBatch, ...]) -> dict[Hashable, ErrorBatch]:
    """``errors`` keyed by ``(ts, n)``, ``n`` counting earlier error batches at that ts."""
    out: dict[Hashable, ErrorBatch] = {}
    seen: dict[int, int] = {}
    for err in errors:
        n = seen.get(err.ts, 0)
        seen[err.ts] = n + 1
        out[(err.ts, n)] = err
    return out


def _keyed(state: ShardState, name: str) -> dict[Hashable, Any]:
    if name in KEYED_SEQUENCE_FIELDS:
        return _keyed_sequence(name, getattr(state, name))
    mapping: Mapping[Hashable, Any] = getattr(state, name)
    return dict(mapping)


def _keyed_sequence(name: str, items: tuple[Any, ...]) -> dict[Hashable, Any]:
    """A keyed sequence field's items by key (keys may depend on position, as an error
    batch's does: rebuild them after every change)."""
    if name == "batches":
        return batches_by_key(items)
    if name == "errors":
        return errors_by_key(items)
    raise InvalidUsage(f"no keys for state field {name!r}")


def _diff_maps(
    name: str, old: Mapping[Hashable, Any], new: Mapping[Hashable, Any], out: list[FieldDiff]
) -> None:
    for key, before in old.items():
        if key not in new:
            out.append(FieldDiff(name, key, Delete(before)))
        elif new[key] != before:
            out.append(FieldDiff(name, key, Update(before, new[key])))
    for key, after in new.items():
        if key not in old:
            out.append(FieldDiff(name, key, Insert(after)))


@dataclass(frozen=True, slots=True)
class StateDiff:
    """The changes that turn the state at ``seqno_from`` into the state at ``seqno_to``."""

    shard_id: str
    seqno_from: int
    seqno_to: int
    latest_rollup_key: str | None
    changes: tuple[FieldDiff, ...]

    @classmethod
    def from_states(cls, old: ShardState, new: ShardState) -> StateDiff:
        """The diff from ``old`` to ``new`` (two versions of the same shard)."""
        if old.shard_id != new.shard_id:
            raise InvalidUsage(
                f"cannot diff states of different shards {old.shard_id!r} and {new.shard_id!r}"
            )
        changes: list[FieldDiff] = []
        for name in SCALAR_FIELDS:
            before, after = getattr(old, name), getattr(new, name)
            if before != after:
                changes.append(FieldDiff(name, None, Update(before, after)))
        for name in MAP_FIELDS + KEYED_SEQUENCE_FIELDS:
            _diff_maps(name, _keyed(old, name), _keyed(new, name), changes)
        latest = new.latest_rollup()
        return cls(
            shard_id=new.shard_id,
            seqno_from=old.seqno,
            seqno_to=new.seqno,
            latest_rollup_key=None if latest is None else latest.key,
            changes=tuple(changes),
        )

    def _fail(self, name: str, key: Hashable, problem: str) -> InvalidStateDiff:
        return InvalidStateDiff(
            f"state diff {self.seqno_from}->{self.seqno_to} of shard {self.shard_id!r} does"
            f" not apply: field {name!r} key {key!r}: {problem}"
        )

    def apply(self, state: ShardState) -> ShardState:
        """The state this diff leads to from ``state``; strict (see the module docstring)."""
        return apply_all(state, [self])

    def _check_base(self, shard_id: str, seqno: int) -> None:
        if shard_id != self.shard_id:
            raise InvalidStateDiff(
                f"state diff of shard {self.shard_id!r} applied to shard {shard_id!r}"
            )
        if seqno != self.seqno_from:
            raise InvalidStateDiff(
                f"state diff {self.seqno_from}->{self.seqno_to} of shard {self.shard_id!r}"
                f" applied to the state at seqno {seqno}"
            )

    def _apply_into(
        self, state: ShardState, scalars: dict[str, Any], keyed: dict[str, dict[Hashable, Any]]
    ) -> None:
        """Apply the changes to ``scalars`` and ``keyed`` (the fields changed so far, each
        copied from ``state`` when first touched), strictly."""
        for change in self.changes:
            name, key, op = change.field, change.key, change.change
            if name in SCALAR_FIELDS:
                if not isinstance(op, Update):
                    raise self._fail(name, key, f"a scalar field cannot {type(op).__name__}")
                if scalars[name] != op.before:
                    raise self._fail(
                        name, key, f"update expected {op.before!r}, found {scalars[name]!r}"
                    )
                scalars[name] = op.after
                continue
            if name not in keyed:
                if name not in MAP_FIELDS and name not in KEYED_SEQUENCE_FIELDS:
                    raise self._fail(name, key, "unknown field")
                keyed[name] = _keyed(state, name)
            values = keyed[name]
            if isinstance(op, Insert):
                if key in values:
                    raise self._fail(
                        name, key, f"insert of an existing key (holds {_short(values[key])})"
                    )
                values[key] = op.value
            else:
                if key not in values:
                    raise self._fail(
                        name,
                        key,
                        f"{type(op).__name__.lower()} expected {_short(op.before)}, found"
                        " no such key",
                    )
                if values[key] != op.before:
                    raise self._fail(
                        name,
                        key,
                        f"{type(op).__name__.lower()} expected {_short(op.before)}, found"
                        f" {_short(values[key])}",
                    )
                if isinstance(op, Update):
                    values[key] = op.after
                else:
                    del values[key]


def apply_all(state: ShardState, diffs: Sequence[StateDiff]) -> ShardState:
    """``state`` with ``diffs`` applied one after the other, each as strictly as
    :meth:`StateDiff.apply` (the same errors, at the same diff), but each changed field
    copied once for the whole chain rather than once per diff: fetching a state applies
    every diff since its rollup, and a field as large as the config (a ledger record per
    ingested file) made that grow with the shard's history times the chain."""
    if not diffs:
        return state
    scalars: dict[str, Any] = {name: getattr(state, name) for name in SCALAR_FIELDS}
    keyed: dict[str, dict[Hashable, Any]] = {}
    seqno = state.seqno
    for diff in diffs:
        diff._check_base(state.shard_id, seqno)
        diff._apply_into(state, scalars, keyed)
        seqno = diff.seqno_to
        for name in KEYED_SEQUENCE_FIELDS:
            if name in keyed:  # the next diff's keys are those of the state after this one
                values = keyed[name]
                keyed[name] = _keyed_sequence(
                    name, tuple(values[k] for k in sorted(values))  # type: ignore[type-var]
                )
    updates: dict[str, object] = dict(scalars)
    updates["seqno"] = seqno
    for name, values in keyed.items():
        if name in KEYED_SEQUENCE_FIELDS:
            updates[name] = tuple(values[k] for k in sorted(values))  # type: ignore[type-var]
        else:
            updates[name] = values
    return state.evolve(**updates)
