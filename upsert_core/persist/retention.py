"""A shard's stored retention: how many of its newest times stay readable.

``upsertctl retention --shard S --keep N`` (``Shard.set_retention``) stores it; GC
without an explicit ``--retain``, the ``rollup_gc`` asset and the maintenance an ingest
runs after its commits (``ingest.maintenance``) apply it, so history beyond it is folded
by compaction without anyone running ``gc --retain``.

Invariants:

- Stored in the shard's config as ``retention.keep`` = N (an integer >= 1, in ASCII
  digits); absent means every time stays readable (the default: nothing is folded).
  Changed only by compare-and-set, like every state change.
- A stored value that is not such an integer is :class:`CorruptData` naming it, never
  taken as "keep everything" or as another number.
- Retention is a floor: ``since`` never passes ``upper - N`` because of it (readers'
  leases and ``gc.retained_since`` may hold it lower still).
"""

from __future__ import annotations

from collections.abc import Callable

from upsert_core.errors import CorruptData, InvalidUsage
from upsert_core.persist.state import ShardState
from upsert_core.read_times import parse_ts_text

RETENTION_KEEP = "retention.keep"
"""Config key of the number of newest times kept readable."""


def check_keep(keep: object) -> int:
    """``keep`` as a retention (an integer >= 1), else :class:`InvalidUsage`."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise InvalidUsage(
            f"retention must be an integer >= 1 (times to keep readable), got {keep!r}"
        )
    return keep


def stored_retention(state: ShardState) -> int | None:
    """The retention ``state`` stores (None: keep all history)."""
    text = state.config.get(RETENTION_KEEP)
    if text is None:
        return None
    value = parse_ts_text(text)
    if value is None or value < 1:
        raise CorruptData(
            f"shard {state.shard_id}: stored retention {RETENTION_KEEP}={text!r} is not an"
            " integer >= 1; set it again with `upsertctl retention --keep N` (or --keep-all)"
        )
    return value


def with_retention(keep: int | None) -> Callable[[ShardState], ShardState | None]:
    """A transition storing ``keep`` (None: clear it); no change when it is stored."""
    if keep is not None:
        check_keep(keep)

    def store(state: ShardState) -> ShardState | None:
        config = dict(state.config)
        if keep is None:
            if RETENTION_KEEP not in config:
                return None
            del config[RETENTION_KEEP]
        else:
            if config.get(RETENTION_KEEP) == str(keep):
                return None
            config[RETENTION_KEEP] = str(keep)
        return state.evolve(config=config)

    return store
