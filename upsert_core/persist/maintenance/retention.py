"""A shard's stored retention: how many of its newest times stay readable, or for how long.

``upsertctl retention --shard S --keep N`` (``Shard.set_retention``) or ``--keep-for 7d``
(``Shard.set_retention_for``) stores it; GC
without an explicit ``--retain``, the ``rollup_gc`` asset and the maintenance an ingest
runs after its commits (``ingest.maintenance``) apply it, so history beyond it is folded
by compaction without anyone running ``gc --retain``.

Invariants:

- Stored in the shard's config as ``retention.keep`` = N (an integer >= 1, in ASCII
  digits) or ``retention.keep_for_s`` = S (seconds, an integer >= 1), never both;
  absent means every time stays readable (the default: nothing is folded). Changed
  only by compare-and-set, like every state change.
- A stored value that is not such an integer is :class:`CorruptData` naming it, never
  taken as "keep everything" or as another number.
- A duration keeps readable every ts an as-of-time read within it needs: the ts
  committed in the last S seconds and the last ts committed before them (the answer
  for ``now - S``), so it resolves to a count (:func:`retention_keep`) from the commit
  times (``persist.state.commit_times``) at the moment it is applied; ts without a recorded
  time were committed before every recorded one. At least the newest ts stays.
  Resolve it against the very state a transition changes (``ingest.maintenance``),
  never an earlier read: a commit in between would move the window's start.
- Retention is a floor: ``since`` never passes ``upper - N`` because of it (readers'
  leases and ``gc.retained_since`` may hold it lower still).
"""

from __future__ import annotations

from collections.abc import Callable

from upsert_core.errors import CorruptData, InvalidUsage
from upsert_core.persist.state.commit_times import readable_steps
from upsert_core.persist.state.state import ShardState
from upsert_core.read_times import parse_ts_text

RETENTION_KEEP = "retention.keep"
"""Config key of the number of newest times kept readable."""
RETENTION_KEEP_FOR = "retention.keep_for_s"
"""Config key of the seconds of commit history kept readable."""

def check_keep(keep: object) -> int:
    """``keep`` as a retention (an integer >= 1), else :class:`InvalidUsage`."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise InvalidUsage(
            f"retention must be an integer >= 1 (times to keep readable), got {keep!r}"
        )
    return keep


def _stored_int(state: ShardState, name: str) -> int | None:
    text = state.config.get(name)
    if text is None:
        return None
    value = parse_ts_text(text)
    if value is None or value < 1:
        raise CorruptData(
            f"shard {state.shard_id}: stored retention {name}={text!r} is not an"
            " integer >= 1; set it again with `upsertctl retention --keep N`"
            " (or --keep-for DURATION, or --keep-all)"
        )
    return value


def stored_retention(state: ShardState) -> int | None:
    """The number of newest times ``state`` stores to keep (None: none stored)."""
    return _stored_int(state, RETENTION_KEEP)


def stored_keep_for(state: ShardState) -> int | None:
    """The seconds of commit history ``state`` stores to keep (None: none stored)."""
    return _stored_int(state, RETENTION_KEEP_FOR)


def retention_keep(state: ShardState, now_ms: int) -> int | None:
    """How many newest times the stored retention keeps readable at ``now_ms`` (None:
    all history): the stored count, or the duration resolved from commit times (see the
    module docstring)."""
    keep = stored_retention(state)
    seconds = stored_keep_for(state)
    if keep is not None or seconds is None:
        return keep
    cutoff = now_ms - seconds * 1000
    older = [step for step in readable_steps(state) if step.ms <= cutoff]
    if not older:
        # Nothing readable was committed before the window: keep what is readable.
        return max(1, state.upper - state.since)
    # The as-of answer for the cutoff is the last ts of the last step before it.
    return max(1, state.upper - max(older[-1].upper - 1, state.since))


def _store(keep: int | None, keep_for: int | None) -> Callable[[ShardState], ShardState | None]:
    wanted = {RETENTION_KEEP: keep, RETENTION_KEEP_FOR: keep_for}

    def store(state: ShardState) -> ShardState | None:
        config = dict(state.config)
        for name, value in wanted.items():
            if value is None:
                config.pop(name, None)
            else:
                config[name] = str(value)
        return None if config == state.config else state.evolve(config=config)

    return store


def with_retention(keep: int | None) -> Callable[[ShardState], ShardState | None]:
    """A transition storing ``keep`` newest times (None: clear the retention); no change
    when it is stored."""
    if keep is not None:
        check_keep(keep)
    return _store(keep, None)


def with_retention_for(seconds: int) -> Callable[[ShardState], ShardState | None]:
    """A transition storing a retention of ``seconds`` of commit history."""
    check_keep(seconds)
    return _store(None, seconds)
