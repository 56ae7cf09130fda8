"""The shard summary every surface shows: ``upsertctl inspect`` (and ``--json``),
``open_shard(...).inspect()`` and the shard metadata of Dagster's assets.

:func:`shard_summary` is ``Shard.inspect()`` (the persist layer's state and storage
figures) plus what only the ingest records: ``live_rows``.

Invariants:

- ``live_rows`` is the number of live rows at the summary's ``upper`` when the shard's
  config records it for exactly that upper
  (:meth:`~upsert_core.ingest.shard_config.ShardIngestConfig.live_rows_at`), else None
  (JSON ``null``): never a number that may belong to another upper, and never estimated.
  It follows ``live_diffs`` in the summary.
- Cheap and read-only: a consensus read, no part is read (a count that is not recorded
  is not computed by reading the shard; ``snapshot`` counts rows).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from upsert_core.ingest.shard_config import recorded_live_rows

if TYPE_CHECKING:
    from upsert_core.persist.shard import Shard

LIVE_ROWS = "live_rows"


def shard_summary(shard: Shard) -> dict[str, object]:
    """``shard.inspect()`` with ``live_rows`` after ``live_diffs`` (module docstring)."""
    info = shard.inspect()
    upper = info["upper"]
    assert isinstance(upper, int)
    # SUBTLE: this state may be newer than the one inspect() described. The recorded
    # count is the count at the config's checkpoint.upper, so asking for ``upper``
    # either finds it for that very upper or says unknown (an ingest committed
    # in between: a rare None, never a wrong count).
    live = recorded_live_rows(shard.state().config, upper)
    out: dict[str, object] = {}
    for name, value in info.items():
        out[name] = value
        if name == "live_diffs":
            out[LIVE_ROWS] = live
    out.setdefault(LIVE_ROWS, live)
    return out
