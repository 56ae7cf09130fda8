"""The shard summary every surface shows: ``upsertctl inspect``,
``open_shard(...).inspect()`` and the shard metadata of Dagster's assets.

:func:`shard_summary` is ``Shard.inspect()`` (the persist layer's state and storage
figures) plus what only the ingest records: ``live_rows``, ``rewritten_files`` and the
shard's ingest options (``key``, ``order``, ``deleted_col``, ``order_scope``, ``envelope``,
``buckets``) with its ``columns``.

Invariants:

- One source: the CLI and the Python API print this dict as it is (JSON), so both
  show the same names with the same values; neither adds a field of its own.
- ``live_rows`` is the number of live rows at the summary's ``upper`` when the shard's
  config records it for exactly that upper
  (:meth:`~upsert_core.ingest.shard_config.ShardIngestConfig.live_rows_at`), else None
  (JSON ``null``): never a number that may belong to another upper, and never estimated.
  It follows ``live_diffs`` in the summary.
- The option fields are always present: None (``null``) before the shard's first
  ingest committed its options, and ``columns`` is then ``{}``. ``columns`` maps each
  column, in schema order, to its type in the platform's type names (``int64``,
  ``float64``, ``string``, ``bool``, ``timestamp``, ``date``, ``binary``): the columns
  reads show (``upsert_core.row_view``), so a Debezium shard lists ``after``'s columns,
  not its stored order field(s).
- ``order`` is the order column's name, or the list of its columns, in comparison
  order, when the order has several (``--order a,b``): also when it is not a column of
  the shard (a Debezium shard's ``source.lsn``).
- ``rewritten_files`` (after ``ingested_files``) lists the names the last ingest found
  rewritten under an ingested name (``ingest.ledger``), ``[]`` when none.
- Cheap and read-only: a consensus read, no part is read (a count that is not recorded
  is not computed by reading the shard; ``snapshot`` counts rows).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from upsert_core.ingest.ledger import rewritten_files
from upsert_core.ingest.shard_config import ShardIngestConfig, recorded_live_rows
from upsert_core.row_view import RowView

if TYPE_CHECKING:
    from upsert_core.persist.shard import Shard

LIVE_ROWS = "live_rows"
REWRITTEN_FILES = "rewritten_files"
OPTION_FIELDS = ("key", "order", "deleted_col", "order_scope", "envelope", "missing",
                 "unavailable", "buckets", "columns")


def shard_summary(shard: Shard) -> dict[str, object]:
    """``shard.inspect()`` with ``live_rows`` after ``live_diffs``, then the shard's
    ingest options and columns (module docstring)."""
    info = shard.inspect()
    upper = info["upper"]
    assert isinstance(upper, int)
    # SUBTLE: this state may be newer than the one inspect() described. The recorded
    # count is the count at the config's checkpoint.upper, so asking for ``upper``
    # either finds it for that very upper or says unknown (an ingest committed
    # in between: a rare None, never a wrong count).
    config = shard.state().config
    live = recorded_live_rows(config, upper)
    out: dict[str, object] = {}
    rewritten = rewritten_files(config)
    for name, value in info.items():
        out[name] = value
        if name == "live_diffs":
            out[LIVE_ROWS] = live
        elif name == "ingested_files":
            out[REWRITTEN_FILES] = rewritten
    out.setdefault(LIVE_ROWS, live)
    out.setdefault(REWRITTEN_FILES, rewritten)
    out.update(_options(config))
    return out


def _options(config: Mapping[str, str]) -> dict[str, object]:
    """The option fields of the summary (all None, and no columns, before any ingest)."""
    options = ShardIngestConfig.read(config).options
    if options is None:
        return {name: ({} if name == "columns" else None) for name in OPTION_FIELDS}
    schema = options.schema
    return {
        "key": list(schema.key),
        "order": list(schema.order) if schema.several_orders else schema.order,
        "deleted_col": schema.deleted,
        "order_scope": options.order_scope.value,
        "envelope": options.envelope.value,
        "missing": options.missing.value,
        "unavailable": options.unavailable if options.missing.value == "keep" else None,
        "buckets": options.buckets,
        "columns": {name: str(typ) for name, typ in RowView.of(options).columns},
    }
