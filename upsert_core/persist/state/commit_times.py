"""When each ts was committed, and the ts a wall-clock time stands for.

Storage. The state's ``config`` holds one entry ``commit_time.<lower>`` = ``<UTC ms>``
per committed batch (:data:`~upsert_core.persist.state.state.COMMIT_TIME_PREFIX`): every ts of
the batch ``[lower, upper)`` was committed at that time. The entries form a step
function over ts: an entry covers the ts from its ``lower`` up to the next entry's
``lower`` (the last one: up to the shard's upper). Config entries are plain strings
that every version of the state codec reads, diffs and rolls up, so old readers carry
them along and a commit adds one small entry to its state diff; an old shard simply has
no entries for the ts it committed before times were recorded.

Invariants:

- Every compare-and-append (``append.py``: the ingest's commits and ``Shard.append``)
  records its batch's ``lower`` with ``max(now, the last recorded time)``: commit times
  never decrease within a shard, even when a clock goes backwards
  (``ShardState.check_invariants`` checks it).
- Compaction and GC never rewrite the entries (they change ``batches``, not
  ``config``); an entry is dropped only when every ts it covers is below ``since``
  (:func:`pruned_config`, run by commits and by GC's since transition), so the state
  keeps one entry per readable batch and at most one more, the one covering ``since``.
- Resolution (:func:`resolve_as_of_time`, :func:`resolve_since_time`,
  :func:`resolve_until_time`) reads only the entries that cover a readable ts. A time
  before the earliest readable commit, or before the first recorded one when the ts
  below it are readable but have no time, is :class:`NotReadable` naming the readable
  time range. ``as_of_time`` is the greatest ts committed at or before the time;
  ``since_time``/``until_time`` the first readable ts committed at or after it, else
  ``upper``. Times are compared exactly (query times in microseconds, commit times in
  milliseconds), never rounded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from upsert_core.errors import InvalidUsage, NotReadable
from upsert_core.persist.state.state import COMMIT_TIME_PREFIX, ShardState, late_ref_ts
from upsert_core.read_times import require_time


def commit_time_key(lower: int) -> str:
    return f"{COMMIT_TIME_PREFIX}{lower}"


def format_time_ms(ms: int | None) -> str | None:
    """``ms`` (UTC milliseconds) as ISO-8601 with a ``+00:00`` zone; None stays None."""
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _format_us(us: int) -> str:
    return datetime.fromtimestamp(us // 1_000_000, UTC).replace(
        microsecond=us % 1_000_000
    ).isoformat()


@dataclass(frozen=True, slots=True)
class Step:
    """The ts ``[lower, upper)``, all committed at ``ms`` (UTC milliseconds)."""

    lower: int
    upper: int
    ms: int


def _steps(state: ShardState) -> list[Step]:
    entries = state.commit_times()
    out: list[Step] = []
    for i, (lower, ms) in enumerate(entries):
        upper = entries[i + 1][0] if i + 1 < len(entries) else state.upper
        if upper > lower:
            out.append(Step(lower, upper, ms))
    return out


def readable_steps(state: ShardState) -> list[Step]:
    """The recorded steps that cover a readable ts (``since <= ts < upper``)."""
    return [s for s in _steps(state) if s.upper > state.since and s.lower < state.upper]


def last_commit_ms(state: ShardState) -> int | None:
    """The newest recorded commit time (None: the shard recorded none)."""
    entries = state.commit_times()
    return entries[-1][1] if entries else None


def since_commit_ms(state: ShardState) -> int | None:
    """When ts ``since`` was committed (None: not recorded, or nothing is readable)."""
    steps = readable_steps(state)
    if not steps or steps[0].lower > state.since:
        return None
    return steps[0].ms


def record_commit(state: ShardState, config: Mapping[str, str], lower: int,
                  now_ms: int) -> dict[str, str]:
    """``config`` (the committing state's config) with the batch at ``lower`` recorded
    at ``max(now_ms, the last recorded time)`` and the entries wholly below ``since``
    dropped."""
    last = last_commit_ms(state)
    ms = max(now_ms, 0) if last is None else max(now_ms, last)
    out = dict(config)
    out[commit_time_key(lower)] = str(ms)
    return pruned_config(out, state.since)


def pruned_config(config: Mapping[str, str], since: int) -> dict[str, str]:
    """``config`` without the commit time entries whose ts all lie below ``since``: an
    entry goes when the next entry starts at or below ``since``."""
    lowers = sorted(
        int(name[len(COMMIT_TIME_PREFIX):]) for name in config
        if name.startswith(COMMIT_TIME_PREFIX)
    )
    out = dict(config)
    for lower, following in zip(lowers, lowers[1:], strict=False):
        if following <= since:
            del out[commit_time_key(lower)]
    return out


def with_since(state: ShardState, since: int) -> ShardState:
    """``state`` with ``since`` moved to ``since`` and the commit times below it dropped,
    and the late parts of batches before it (``persist.state.state``: nothing reads them)."""
    config = pruned_config(state.config, since)
    for name in list(config):
        late = late_ref_ts(name)
        if late is not None and late[0] < since:
            del config[name]
    return state.evolve(since=since, config=config)


# --- resolution -------------------------------------------------------------------------


def readable_range(state: ShardState) -> str:
    """The readable time range, for messages."""
    steps = readable_steps(state)
    if not steps:
        return (
            f"no commit time is recorded for its readable ts [{state.since}, {state.upper})"
        )
    first, last = steps[0], steps[-1]
    text = (
        f"readable commit times are {format_time_ms(first.ms)} to {format_time_ms(last.ms)}"
    )
    if first.lower > state.since:
        text += (
            f" (ts {state.since} to {first.lower - 1} were committed before the shard"
            " recorded times)"
        )
    return text


def _readable_steps_from(state: ShardState, us: int, option: str) -> list[Step]:
    steps = readable_steps(state)
    if not steps or us < steps[0].ms * 1000:
        raise NotReadable(
            f"shard {state.shard_id}: cannot resolve {option} {_format_us(us)}:"
            f" {readable_range(state)}"
        )
    return steps


def resolve_as_of_time(state: ShardState, us: int) -> int:
    """The greatest ts committed at or before ``us`` (UTC microseconds)."""
    steps = _readable_steps_from(state, us, "as-of time")
    chosen = [s for s in steps if s.ms * 1000 <= us][-1]
    return chosen.upper - 1


def resolve_since_time(state: ShardState, us: int, option: str = "since time") -> int:
    """The first readable ts committed at or after ``us``, else ``upper`` (also when
    nothing was ever committed: an empty read, as ``since 0`` is)."""
    if state.upper == 0:
        return 0
    steps = _readable_steps_from(state, us, option)
    for step in steps:
        if step.ms * 1000 >= us:
            return max(step.lower, state.since)
    return state.upper


def resolve_until_time(state: ShardState, us: int) -> int:
    """As :func:`resolve_since_time`: the first readable ts committed at or after ``us``."""
    return resolve_since_time(state, us, "until time")


# --- a read's times, given as ts or as wall-clock times ---------------------------------


def _one_of(names: tuple[str, str], ts: int | None, time: object | None) -> None:
    if ts is not None and time is not None:
        raise InvalidUsage(f"give {names[0]} or {names[1]}, not both")


def as_of_ts(
    state: ShardState, as_of: int | None, as_of_time: object | None,
    names: tuple[str, str] = ("as_of", "as_of_time"),
) -> int | None:
    """The ts a read names by ``as_of`` or by ``as_of_time`` (a ``datetime`` or ISO-8601
    text, no zone: UTC); None when neither is given. Both is :class:`InvalidUsage`."""
    _one_of(names, as_of, as_of_time)
    if as_of_time is None:
        return as_of
    return resolve_as_of_time(state, require_time(as_of_time, names[1]))


def changes_ts(
    state: ShardState, since: int | None, until: int | None,
    since_time: object | None, until_time: object | None,
    names: tuple[str, str, str, str] = ("since", "until", "since_time", "until_time"),
) -> tuple[int | None, int | None]:
    """The ``(since, until)`` ts a changes read names by ts or by time (as
    :func:`as_of_ts`); None where neither is given."""
    _one_of((names[0], names[2]), since, since_time)
    _one_of((names[1], names[3]), until, until_time)
    if since_time is not None:
        since = resolve_since_time(state, require_time(since_time, names[2]))
    if until_time is not None:
        until = resolve_until_time(state, require_time(until_time, names[3]))
    return since, until
