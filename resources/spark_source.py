"""``spark.read.format("upsert")``: a shard as a Spark DataFrame (a Spark 4 Python data
source), on a classic session or Spark Connect alike.

::

    from resources.spark_source import register, read_shard
    register(spark)
    df = spark.read.format("upsert").option("shard", "demo").load()        # newest snapshot
    df = spark.read.format("upsert").option("shard", "demo").option("asOf", 5).load()
    changes = (spark.read.format("upsert").option("shard", "demo")
               .option("read", "changes").option("since", 3).load())  # + __ts, __diff
    late = spark.read.format("upsert").option("shard", "demo").option("read", "late").load()
    df = read_shard(spark, "demo")   # stores resolved in THIS process (see below)

Options: ``shard`` (required); ``consensus`` / ``blob`` (store URLs; default: as
``upsertctl`` resolves them from ``UPSERT_CONSENSUS_URL`` / ``UPSERT_BLOB_URL`` /
``UPSERT_HOME``, in the process where Spark plans the read: the driver's environment at
JVM start in local mode, the server's under Spark Connect; :func:`read_shard` resolves
them here and passes them on); ``read``: ``snapshot`` (default), ``changes`` or ``late``
(the late collection, ``ingest.late``: ``file``, ``row``, ``key``, ``order``,
``stored_order``, as ``open_shard().late()`` gives it);
``asOf`` (snapshot time, default the newest readable); ``since`` / ``until`` (changes,
default the shard's since and upper); ``asOfTime`` / ``sinceTime`` / ``untilTime``
(instead of those: an ISO-8601 time, no zone meaning UTC, standing for the greatest ts
committed at or before it, or the first committed at or after it, else the upper; see
``persist.state.commit_times``); ``partitions`` (read tasks, default 4).

Invariants:

- The time is pinned when the read is planned (``asOf``, or ``since``/``until``; a
  commit time is resolved to its ts then, and a ts option with its time option is
  refused), so every task reads the same version: a DataFrame never mixes two. A time outside
  ``[since, upper)`` fails at ``load()`` with the shard's :class:`NotReadable` message.
  So is the schema: tasks decode with the columns Spark was told at planning, whatever
  columns later ingests add. A changes task refuses (``NotReadable``) when GC moved the
  shard's since onto ``since`` after planning: its updates at ``since`` would then hold
  history folded from before it, which the plan (and the other tasks) did not.
- Snapshots of a shard written by the ingest (it has N buckets): task ``i`` returns
  exactly the rows of the keys whose bucket ``b`` has ``b % partitions == i``, so at
  most N tasks have work. Through ``ShardTable.snapshot_of_buckets``: from typed,
  bucket-labelled parts a task reads only its buckets' parts (``persist.read.typed_read``;
  it opens every part's footer to find them),
  otherwise it filters the merged read by bucket. Either way the union of the tasks is
  the read, each key in one task.
- Changes, and snapshots of shards without buckets: keys are 16-byte digests,
  uniformly spread, so the key space is cut into ``partitions`` contiguous ranges by
  their first two bytes and task ``i`` returns exactly the rows of the keys in range
  ``i``. A task streams the consolidated read (sorted by key), skips batches before its
  range, decodes only its own rows, and stops after its range.
- Tasks use the S3 settings (``AWS_*``) of the process that planned the read, shipped
  inside the task (``resources.task_env``), as the Spark engine's tasks do: cluster
  executors do not inherit the driver's environment.
- The late collection is pinned at the upper the read was planned at (batches
  committed later are not read); task ``i`` reads the late parts of the buckets ``b``
  with ``b % partitions == i``, so each late row is in one task. A task refuses
  (``NotReadable``) when GC moved the shard's since after planning (the late rows
  before it are gone): the tasks never return less than the planned collection.
- Columns and types are the shard's (``inspect``'s ``columns``: the visible ones, a
  Debezium shard's stored order columns hidden, ``upsert_core.row_view``), mapped to
  Spark types; changes add the change's time and diff (bigint), ``__ts`` and ``__diff``
  unless the shard has a column of either name (``shard_table.change_columns``). The
  hidden columns are pinned with the schema at planning, and a changes task
  consolidates its rows as visible rows: every key lies in one task, whole.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from resources.task_env import apply_env, driver_env
from upsert_core.errors import ConfigError, NotReadable, ShardNotFound
from upsert_core.ingest.late import read_late, user_schema, user_table
from upsert_core.ingest.shard_config import ShardIngestConfig
from upsert_core.landing import SourceSchema
from upsert_core.persist.read.read import check_changes_readable, check_snapshot_readable
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.commit_times import as_of_ts, changes_ts
from upsert_core.persist.state.state import ShardState
from upsert_core.read_times import parse_ts_text, require_time, require_ts
from upsert_core.row_view import RowView
from upsert_core.shard_table import (
    BucketSelection,
    changes_schema,
    decode_changes_batch,
    decode_snapshot_batch,
    open_shard,
    snapshot_schema,
)
from upsert_core.stores import existing_shards_note, open_stores, resolve

FORMAT = "upsert"
SNAPSHOT, CHANGES, LATE = "snapshot", "changes", "late"
DEFAULT_PARTITIONS = 4
MAX_PARTITIONS = 65536
KEY_SPACE = 1 << 16  # ranges are cut on the first two bytes of the key digest


@dataclass(frozen=True)
class ReadPlan:
    """What every task reads: the stores, the shard, the kind of read and its pinned time."""

    consensus: str
    blob: str
    shard: str
    read: str
    as_of: int | None = None
    since: int | None = None
    until: int | None = None
    partitions: int = DEFAULT_PARTITIONS
    schema_json: str | None = None
    """The shard's source schema when the read was planned: with ``hidden``, the columns
    Spark was told."""
    hidden: tuple[str, ...] = ()
    """The stored columns the read hides (``upsert_core.row_view``)."""
    planned_since: int = 0
    """The shard's since when the read was planned (see :func:`read_range`)."""
    buckets: int | None = None
    """The shard's bucket count (None: not written by the ingest): tasks split by bucket."""
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    """The planning process's S3 settings (``resources.task_env``), applied by each task."""


@dataclass(frozen=True)
class KeyRange(InputPartition):  # type: ignore[misc]
    """Task ``index`` of ``count``: keys ``lo <= key < hi`` (``hi`` None: to the end of
    the key space), or, for a shard with buckets, its share of the buckets."""

    index: int
    lo: bytes
    hi: bytes | None
    count: int = 1


def key_ranges(count: int) -> list[KeyRange]:
    """``count`` contiguous ranges covering the whole key space."""
    bounds = [KEY_SPACE * i // count for i in range(count + 1)]
    return [
        KeyRange(i, b"" if i == 0 else bounds[i].to_bytes(2, "big"),
                 None if i == count - 1 else bounds[i + 1].to_bytes(2, "big"), count)
        for i in range(count)
    ]


def _int_option(options: Mapping[str, str], name: str) -> int | None:
    text = options.get(name)
    if text is None:
        return None
    value = parse_ts_text(str(text))  # "2.5", "True", "1_0": refused, never rounded
    if value is None:
        raise ConfigError(f"option {name!r} must be an integer, got {text!r}")
    return value


def plan_read(options: Mapping[str, str]) -> ReadPlan:
    """Resolve the options against the shard: stores, read kind and a pinned time."""
    lowered = {k.lower(): v for k, v in options.items()}
    shard_name = lowered.get("shard")
    if not shard_name:
        raise ConfigError('the upsert data source needs .option("shard", NAME)')
    read = (lowered.get("read") or SNAPSHOT).lower()
    if read not in (SNAPSHOT, CHANGES, LATE):
        raise ConfigError(
            f"option 'read' must be {SNAPSHOT!r}, {CHANGES!r} or {LATE!r}, got {read!r}")
    given = _int_option(lowered, "partitions")  # "" or "0" is refused, not the default
    partitions = DEFAULT_PARTITIONS if given is None else given
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ConfigError(f"option 'partitions' must be 1..{MAX_PARTITIONS}, got {partitions}")
    config = resolve(lowered.get("consensus"), lowered.get("blob"))
    try:
        consensus, blob = open_stores(config, create=False, shard=shard_name)  # creates nothing
        state = Shard.open(consensus, blob, shard_name, create=False).state()
    except ShardNotFound as exc:  # name the stores and the shards there, as upsertctl does
        raise ShardNotFound(f"{exc}{existing_shards_note(config)}") from None
    plan = ReadPlan(consensus=config.consensus_url, blob=config.blob_url, shard=shard_name,
                    read=read, partitions=partitions,
                    schema_json=_schema_json(state), hidden=_hidden(state),
                    planned_since=state.since,
                    buckets=_buckets(state), env=tuple(sorted(driver_env().items())))
    if read == LATE:
        return ReadPlan(**{**plan.__dict__, "until": state.upper})
    if read == SNAPSHOT:
        as_of = as_of_ts(state, _int_option(lowered, "asof"), lowered.get("asoftime"),
                         ("asOf", "asOfTime"))
        as_of = state.upper - 1 if as_of is None else as_of
        check_snapshot_readable(state, as_of)
        return ReadPlan(**{**plan.__dict__, "as_of": as_of})
    since, until = changes_ts(
        state, _int_option(lowered, "since"), _int_option(lowered, "until"),
        lowered.get("sincetime"), lowered.get("untiltime"),
        ("since", "until", "sinceTime", "untilTime"),
    )
    since = state.since if since is None else since
    until = state.upper if until is None else until
    check_changes_readable(state, since, until)
    return ReadPlan(**{**plan.__dict__, "since": since, "until": until})


def _buckets(state: ShardState) -> int | None:
    options = ShardIngestConfig.read(state.config).options
    return None if options is None else options.buckets


def _schema_json(state: ShardState) -> str | None:
    schema = ShardIngestConfig.read(state.config).schema
    return None if schema is None else schema.to_json()


def _hidden(state: ShardState) -> tuple[str, ...]:
    return RowView.of_config(state.config).hidden


def source_schema_of(plan: ReadPlan) -> SourceSchema | None:
    """The source schema pinned in the plan. Schemas only append columns, so it covers
    every row at the plan's times (all before the upper it was planned at)."""
    return None if plan.schema_json is None else SourceSchema.from_json(plan.schema_json)


def view_of(plan: ReadPlan) -> RowView:
    """The row view pinned in the plan: its schema and the columns it hides."""
    return RowView(source_schema_of(plan), plan.hidden)


def arrow_schema_of(plan: ReadPlan) -> pa.Schema:
    if plan.read == LATE:
        return user_schema(source_schema_of(plan))
    view = view_of(plan)
    return snapshot_schema(view) if plan.read == SNAPSHOT else changes_schema(view)


class UpsertDataSource(DataSource):  # type: ignore[misc]
    """The ``upsert`` format (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        self._plan = plan_read(self.options)
        return from_arrow_schema(arrow_schema_of(self._plan))

    def reader(self, schema: StructType) -> DataSourceReader:
        plan = getattr(self, "_plan", None) or plan_read(self.options)
        return UpsertReader(plan)


class UpsertReader(DataSourceReader):  # type: ignore[misc]
    """Reads one key range per task, at the time pinned in the plan."""

    def __init__(self, plan: ReadPlan) -> None:
        self.plan = plan

    def partitions(self) -> list[KeyRange]:
        return key_ranges(self.plan.partitions)

    def read(self, partition: KeyRange) -> Iterator[pa.RecordBatch]:
        yield from read_range(self.plan, partition)


def _in_range(keys: pa.Array, lo: bytes, hi: bytes | None) -> pa.Array:
    mask = pc.greater_equal(keys, pa.scalar(lo, pa.binary()))
    if hi is not None:
        mask = pc.and_(mask, pc.less(keys, pa.scalar(hi, pa.binary())))
    return mask


def read_range(plan: ReadPlan, part: KeyRange) -> Iterator[pa.RecordBatch]:
    """The typed rows of the keys in ``part`` (see the module docstring)."""
    apply_env(dict(plan.env))
    table = open_shard(plan.shard, plan.consensus, plan.blob)
    # SUBTLE: decode with the schema Spark was told at planning, not the current one: a
    # column added since would make every batch fail Spark's schema check.
    schema = source_schema_of(plan)
    if plan.read == LATE:
        yield from _late_of(plan, part, table.shard, schema)
        return
    view = view_of(plan)
    if plan.read == SNAPSHOT and plan.buckets is not None:
        assert plan.as_of is not None
        selection = BucketSelection(plan.buckets, part.index, part.count)
        yield from table.snapshot_of_buckets(plan.as_of, view, selection)
        return
    if plan.read == SNAPSHOT:
        batches = table.shard.snapshot(plan.as_of)
        decode = decode_snapshot_batch
    else:
        assert plan.since is not None
        batches = table.shard.changes(plan.since, plan.until)
        decode = decode_changes_batch
    try:
        if plan.read == CHANGES:
            _check_same_changes(plan, table.shard.state())
        for batch in batches:
            if not batch.num_rows:
                continue
            keys = batch.column("key")
            if part.hi is not None and keys[0].as_py() >= part.hi:
                break  # sorted by key: nothing of this range follows
            if keys[len(keys) - 1].as_py() < part.lo:
                continue
            # SUBTLE: a batch holds all updates of each key it covers and the range
            # keeps or drops a key whole, so ``mine`` consolidates on its own.
            mine = batch.filter(_in_range(keys, part.lo, part.hi))
            if mine.num_rows:
                yield from decode(view, mine).to_batches()
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()


def _late_of(
    plan: ReadPlan, part: KeyRange, shard: Shard, schema: SourceSchema | None
) -> Iterator[pa.RecordBatch]:
    """Task ``part.index``'s share of the late collection: its buckets' late parts of
    the batches before the planned upper. Refused when GC moved the shard's since after
    planning: the late rows of the batches now before it are gone, and returning the
    rest would silently lose rows (and disagree with the tasks that ran before)."""

    def pinned() -> ShardState:
        """The shard's state, refused once since moved past the planned one (also when
        GC deletes a late part under the read: ``ingest.late.iter_late``)."""
        state = shard.state()
        if state.since > plan.planned_since:
            raise NotReadable(
                f"shard {plan.shard}: since moved from {plan.planned_since} to"
                f" {state.since} after the read of the late collection was planned;"
                " read again"
            )
        return state

    late = read_late(shard.blob, pinned(), schema, until=plan.until,
                     buckets=lambda b: b % part.count == part.index, fresh=pinned)
    yield from user_table(late, schema).to_batches()


def _check_same_changes(plan: ReadPlan, state: ShardState) -> None:
    """Refuse a changes task whose answer would differ from the planned one.

    ``changes`` reports updates from before the shard's since AT since, so the updates
    at ``plan.since`` hold all earlier history exactly when the shard's since equals it.
    Each task starts its own read, possibly after GC moved since (the state read here,
    after the task's read started, has a since at least the read's: since only grows);
    a task must not fold history in that the plan (and the other tasks) did not.
    """
    folded_when_planned = plan.planned_since == plan.since
    if not folded_when_planned and state.since >= (plan.since or 0):
        raise NotReadable(
            f"shard {plan.shard}: since moved from {plan.planned_since} to {state.since}"
            f" after the read of changes from {plan.since} was planned; read again"
        )


_registered: weakref.WeakSet[Any] = weakref.WeakSet()


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("upsert")`` available in ``spark`` (idempotent: a
    session registers it once, so Spark does not log "replaced a previously registered
    data source" on every ``read_shard``)."""
    try:
        if spark in _registered:
            return
    except TypeError:  # a session that cannot be weakly referenced: register each time
        spark.dataSource.register(UpsertDataSource)
        return
    spark.dataSource.register(UpsertDataSource)
    _registered.add(spark)


def read_shard(
    spark: SparkSession,
    shard: str,
    *,
    as_of: int | None = None,
    consensus: str | None = None,
    blob: str | None = None,
    partitions: int | None = None,
    changes: bool = False,
    since: int | None = None,
    until: int | None = None,
    late: bool = False,
    as_of_time: datetime | str | None = None,
    since_time: datetime | str | None = None,
    until_time: datetime | str | None = None,
) -> DataFrame:
    """The shard as a DataFrame, its stores resolved in THIS process as ``upsertctl``
    would (so the read needs no environment on the Spark side). ``as_of_time``,
    ``since_time`` and ``until_time`` (a ``datetime`` or ISO-8601 text, no zone: UTC)
    name the times by commit time, as the options ``asOfTime`` and friends do.
    ``late=True`` reads the late collection (option ``read`` ``late``) instead."""
    if late and changes:
        raise ConfigError("read_shard: give changes=True or late=True, not both")
    for name, value in (("as_of", as_of), ("since", since), ("until", until)):
        if value is not None:
            require_ts(value, name)  # 2.5 or True is refused here, not rounded by a task
    times: dict[str, str | None] = {}
    for name, option, moment in (("as_of_time", "asOfTime", as_of_time),
                                 ("since_time", "sinceTime", since_time),
                                 ("until_time", "untilTime", until_time)):
        # As exact UTC text, so the planning process reads the same instant.
        times[option] = None if moment is None else _utc_text(require_time(moment, name))
    config = resolve(consensus, blob)
    options: dict[str, Any] = {"shard": shard, "consensus": config.consensus_url,
                               "blob": config.blob_url,
                               "read": LATE if late else CHANGES if changes else SNAPSHOT,
                               "asOf": as_of, "since": since, "until": until,
                               "partitions": partitions, **times}
    # Planned here first, so a wrong shard name or an unreadable time is this process's
    # one-line error (ShardNotFound, NotReadable, ...), not a Python data source
    # traceback from Spark; the data source plans again, pinning the time it reads.
    plan_read({key: str(value) for key, value in options.items() if value is not None})
    register(spark)
    reader = spark.read.format(FORMAT)
    for key, value in options.items():
        if value is not None:
            reader = reader.option(key, str(value))
    return reader.load()


def _utc_text(us: int) -> str:
    """UTC microseconds since the epoch as ISO-8601 text with its zone."""
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)).isoformat()
