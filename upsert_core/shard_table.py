"""Reading a shard as typed Arrow tables: the Python API behind ``upsertctl snapshot``.

``open_shard(name)`` finds the shard exactly where ``upsertctl`` does
(:mod:`upsert_core.stores`: the arguments, else ``UPSERT_CONSENSUS_URL`` /
``UPSERT_BLOB_URL``, else the embedded defaults under ``UPSERT_HOME``) and returns a
:class:`ShardTable`, whose reads return the shard's own columns with their types (the
``columns`` of ``inspect``), ready for pandas (``to_pandas()``), DuckDB (query the Arrow
table) or Polars (``pl.from_arrow``).

The shard's columns are its :class:`~upsert_core.row_view.RowView`'s visible ones: a
Debezium shard's stored order columns are not among them (``upsert_core.row_view``).

Invariants:

- Reads follow the CLI's rules and raise the same typed errors (all derived from
  :class:`~upsert_core.errors.UpsertPlatformError`): a missing shard is
  :class:`~upsert_core.errors.ShardNotFound` (reading never creates one), a time outside
  ``[since, upper)`` is :class:`~upsert_core.errors.NotReadable` at the call.
- A snapshot holds one row per live key (a row with multiplicity ``n`` appears ``n``
  times, as ``upsertctl snapshot`` writes it); ``changes`` holds the consolidated updates
  with their time and multiplicity in ``__ts`` and ``__diff``, names that never collide
  with a row column (:func:`change_columns` adds leading ``_`` while one does).
- Times are integers: a float or bool ``as_of``/``since``/``until`` is
  :class:`~upsert_core.errors.InvalidUsage`, never rounded. ``as_of_time``,
  ``since_time`` and ``until_time`` (a ``datetime`` or ISO-8601 text, no zone: UTC)
  name them by commit time instead (``persist.state.commit_times``); a ts and its time
  together are :class:`~upsert_core.errors.InvalidUsage`, a time before the earliest
  readable commit :class:`~upsert_core.errors.NotReadable`.
- Rows are typed with the schema of the state the read started from: schemas only
  append columns, so it covers every row the read returns; a column a row predates is
  null. Every read returns the visible columns only (:attr:`ShardTable.schema`), and
  ``changes`` are consolidated as visible rows (``RowView.project_updates``).
- Snapshots come from the parts' value columns, bucket by bucket, when every part is
  typed and bucket-labelled (``persist.read.typed_read``: no merge, no decode); otherwise
  from the merged read (``persist.read.read``), decoded one batch ahead on a helper thread.
  Both give the same rows; their order is not part of the answer (bucket by bucket in
  the first case, key-digest order in the second).
- Streaming: :meth:`ShardTable.to_batches` holds about two buckets (typed: the one being
  consumed and the next) or a few record batches (merged) at a time, so a shard larger
  than memory can be read; the other reads collect it into one table. A decoding error
  surfaces at the batch it belongs to. A read that GC overtakes (a part of its
  superseded state deleted) resumes on the fresh state without repeating or losing a
  row, as ``Shard``'s reads do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa

from upsert_core.errors import CorruptData, ShardNotFound, UpsertPlatformError
from upsert_core.ingest.base_cache import BaseCache
from upsert_core.ingest.checkpoint import checkpoint_intact
from upsert_core.ingest.late import iter_late, late_records, read_late, user_table
from upsert_core.ingest.shard_config import ShardIngestConfig
from upsert_core.ingest.tasks import Base
from upsert_core.landing import SourceSchema
from upsert_core.landing.rows import decode_rows_to_table
from upsert_core.order_scope import OrderScope
from upsert_core.persist.read.read import check_snapshot_readable
from upsert_core.persist.read.typed_read import (
    BaseLoader,
    BucketBase,
    TypedSnapshot,
    open_typed_snapshot,
)
from upsert_core.persist.shard import READ_ATTEMPTS, Shard
from upsert_core.persist.state.commit_times import as_of_ts, changes_ts
from upsert_core.persist.state.state import ShardState
from upsert_core.persist.write.buckets import bucket_of_keys
from upsert_core.row_view import RowView
from upsert_core.shard_summary import shard_summary
from upsert_core.stores import existing_shards_note, open_stores, resolve

TS_COLUMN = "__ts"
DIFF_COLUMN = "__diff"
ERRORS_SCHEMA = pa.schema([("file", pa.string()), ("row", pa.int64()), ("reason", pa.string())])


def open_shard(
    name: str, consensus: str | None = None, blob: str | None = None
) -> ShardTable:
    """Open shard ``name`` for reading, resolving the stores as ``upsertctl`` does."""
    config = resolve(consensus, blob)
    try:
        # A read creates nothing, not even the embedded stores.
        consensus_store, blob_store = open_stores(config, create=False, shard=name)
        return ShardTable(Shard.open(consensus_store, blob_store, name, create=False))
    except ShardNotFound as exc:
        raise ShardNotFound(f"{exc}{existing_shards_note(config)}") from exc


class ShardTable:
    """Typed reads of one shard (see the module docstring)."""

    def __init__(self, shard: Shard) -> None:
        self.shard = shard

    @property
    def name(self) -> str:
        return self.shard.shard_id

    def source_schema(self) -> SourceSchema | None:
        """The shard's stored source schema (None before its first ingest committed one):
        the columns its rows store, hidden ones included (:meth:`row_view`)."""
        return ShardIngestConfig.read(self.shard.state().config).schema

    def row_view(self) -> RowView:
        """The stored schema and the columns reads hide (``upsert_core.row_view``)."""
        return RowView.of_config(self.shard.state().config)

    @property
    def schema(self) -> pa.Schema:
        """The Arrow schema of a snapshot: the shard's columns, in order."""
        return snapshot_schema(self.row_view())

    # --- reads --------------------------------------------------------------------------

    def to_batches(
        self, as_of: int | None = None, *, as_of_time: datetime | str | None = None
    ) -> pa.RecordBatchReader:
        """The snapshot as of ``as_of`` (default: the newest readable time), streamed;
        ``as_of_time`` (instead of ``as_of``) reads as of the greatest ts committed at or
        before that time (``persist.state.commit_times``)."""
        state = self.shard.state()
        as_of = as_of_ts(state, as_of, as_of_time)
        pinned = state.upper - 1 if as_of is None else as_of
        check_snapshot_readable(state, pinned)  # NotReadable now, at the call
        view = RowView.of_config(state.config)
        batches = self._snapshot(state, pinned, view, None)
        return pa.RecordBatchReader.from_batches(snapshot_schema(view), batches)

    def snapshot_of_buckets(
        self, as_of: int, view: RowView, selection: BucketSelection
    ) -> Iterator[pa.RecordBatch]:
        """The snapshot's rows of the keys ``selection`` keeps, typed with ``view``
        (e.g. the view a Spark read was planned with; its schema must cover the rows at
        ``as_of``): one Spark task's share. Raises NotReadable now, at the call."""
        state = self.shard.state()
        check_snapshot_readable(state, as_of)
        return self._snapshot(state, as_of, view, selection)

    def _snapshot(
        self, state: ShardState, as_of: int, view: RowView,
        selection: BucketSelection | None,
    ) -> Iterator[pa.RecordBatch]:
        # The typed read reads only the visible columns' values: hidden ones never load.
        fields = list(snapshot_schema(view))
        try:
            typed = open_typed_snapshot(self.shard.blob, state, as_of, fields,
                                        typed_bases(state), self._base_copies(state))
        except CorruptData:
            typed = None  # the merged read resumes after GC, or reports the damage
        if typed is not None and selection is not None and typed.buckets != selection.buckets:
            typed.close()  # labelled with another bucket count: select by key instead
            typed = None
        if typed is None:
            merged = self.shard.snapshot(as_of)
            if selection is not None:
                merged = _in_buckets(merged, selection.buckets, selection.mask)
            return self._decoded(view, merged)
        return self._typed(typed, state, as_of, fields, view, selection)

    def _base_copies(self, state: ShardState) -> BaseLoader | None:
        """This machine's decoded copies of the bases (``ingest.base_cache``, kept by
        the ingests that read them), each used only while its blob is still there as
        committed; None when there is no cache to use."""
        blob = self.shard.blob
        cache = BaseCache.for_blob(blob, state.shard_id)
        if cache is None:
            return None

        def load(bucket: int, base: BucketBase) -> pa.Table | None:
            if not checkpoint_intact(blob, base.key, base.size):
                return None
            return cache.get(bucket, base.key)

        return load

    def _decoded(
        self, view: RowView, batches: Iterator[pa.RecordBatch]
    ) -> Iterator[pa.RecordBatch]:
        """The merged read's batches decoded into typed rows."""
        # Each batch is decoded on a helper thread while the read merges the next
        # (numpy and Arrow release the GIL): 12-16% off a 1M-row snapshot here.
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="snapshot-decode")
        pending: Future[pa.Table] | None = None
        try:
            for batch in batches:
                future = pool.submit(decode_snapshot_batch, view, batch)
                if pending is not None:
                    yield from pending.result().to_batches()
                pending = future
            if pending is not None:
                yield from pending.result().to_batches()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    def _typed(
        self, typed: TypedSnapshot, state: ShardState, as_of: int, fields: list[pa.Field],
        view: RowView, selection: BucketSelection | None,
    ) -> Iterator[pa.RecordBatch]:
        """The typed read, bucket by bucket, resumed after GC removed a part under it.

        SUBTLE: GC deletes the parts of states older than its truncation point, so a
        long read of a superseded state can meet a missing part (:class:`CorruptData`).
        Buckets are yielded whole and share no key, so the read goes on from a fresh
        state with the buckets not yet yielded: typed if the fresh state still is (with
        the same bucket count), else through the merged read with the keys of the
        yielded (and unselected) buckets dropped. Compaction and GC never change what a
        readable time shows, so the answer is the same.
        """
        done: set[int] = set()
        restarts = 0
        current: TypedSnapshot | None = typed
        buckets = typed.buckets

        def unwanted(ids: list[int]) -> set[int]:
            return {b for b in ids if b in done or (selection and not selection.keeps(b))}

        try:
            while True:
                try:
                    if current is None:  # a restart: reopen on the fresh state
                        current = open_typed_snapshot(self.shard.blob, state, as_of, fields,
                                                      typed_bases(state),
                                                      self._base_copies(state))
                        if current is not None and current.buckets != buckets:
                            current.close()
                            current = None
                        if current is None:
                            break  # no longer typed alike: the merged read goes on
                    for bucket, tables in current.tables(skip=unwanted(current.bucket_ids)):
                        for table in tables:
                            yield from table.to_batches()
                        done.add(bucket)
                    return
                except CorruptData:
                    restarts += 1
                    if restarts >= READ_ATTEMPTS or self.shard.versions.head_seqno() == state.seqno:
                        raise
                    if current is not None:
                        current.close()
                        current = None
                    state = self.shard.state()
                    check_snapshot_readable(state, as_of)  # NotReadable if since passed as_of
        finally:
            if current is not None:
                current.close()

        def wanted(ids: np.ndarray) -> np.ndarray:
            keep = ~np.isin(ids, list(done))
            return keep if selection is None else keep & selection.mask(ids)

        merged = _in_buckets(self.shard.snapshot(as_of), buckets, wanted)
        yield from self._decoded(view, merged)

    def snapshot(
        self, as_of: int | None = None, *, as_of_time: datetime | str | None = None
    ) -> pa.Table:
        """The snapshot as of ``as_of`` or ``as_of_time`` (default: the newest readable
        time; see :meth:`to_batches`)."""
        return self.to_batches(as_of, as_of_time=as_of_time).read_all()

    def change_columns(self) -> tuple[str, str]:
        """The names :meth:`changes` gives the change's time and diff: ``("__ts",
        "__diff")``, or with more leading ``_`` when the shard has a column of either name
        (:func:`change_columns`)."""
        return change_columns(self.row_view())

    def changes(
        self, since: int | None = None, until: int | None = None, *,
        since_time: datetime | str | None = None, until_time: datetime | str | None = None,
    ) -> pa.Table:
        """Consolidated updates with ``since <= ts < until`` (defaults: the shard's since
        and upper): the row's columns plus the change's time and diff (int64), named
        ``__ts`` and ``__diff`` unless the shard has such a column (:meth:`change_columns`).
        ``since_time``/``until_time`` (instead of ``since``/``until``) stand for the first
        ts committed at or after that time, or the upper when none is
        (``persist.state.commit_times``). Rows that differ only in hidden columns are one row
        (``RowView.project_updates``), so a change that touched only those is none."""
        state = self.shard.state()
        since, until = changes_ts(state, since, until, since_time, until_time)
        lower = state.since if since is None else since
        batches = self.shard.changes(lower, until)
        view = self.row_view()
        tables = [decode_changes_batch(view, batch) for batch in batches]
        return pa.concat_tables(tables) if tables else changes_schema(view).empty_table()

    def errors(self) -> pa.Table:
        """The error collection: ``file``, ``row`` (from 1, in file order), ``reason``."""
        rows: list[dict[str, Any]] = [
            {"file": e["file"], "row": e["row"], "reason": e["reason"]}
            for e in self.shard.errors()
        ]
        return pa.Table.from_pylist(rows, schema=ERRORS_SCHEMA)

    def late(self) -> pa.Table:
        """The late collection (``--order-scope global``; CONTRACT.md, late rows): one row
        per late row of every batch from the shard's since on, by ts, then file order:
        ``file``, ``row`` (from 1), ``key`` (a struct of the key columns), ``order`` and
        ``stored_order`` (the order column's type, or a struct of the order columns when
        the order has several), typed as the shard's columns (``ingest.late``)."""
        state = self.shard.state()
        schema = ShardIngestConfig.read(state.config).schema
        return user_table(
            read_late(self.shard.blob, state, schema, fresh=self.shard.state), schema)

    def late_records(self) -> Iterator[dict[str, Any]]:
        """The late collection as ``upsertctl late`` prints it, as Python values:
        ``{"file", "row", "key": {column: value}, "order", "stored_order"}``, the orders
        a list in column order when the order has several columns."""
        state = self.shard.state()
        schema = ShardIngestConfig.read(state.config).schema
        return late_records(
            iter_late(self.shard.blob, state, schema, fresh=self.shard.state), schema)

    def inspect(self) -> dict[str, object]:
        """The summary ``upsertctl inspect`` prints, field for field
        (``upsert_core.shard_summary``): state and storage figures, ``live_rows`` (null
        when the shard does not record it for its upper), the ingest options (``key``,
        ``order``, ``deleted_col``, ``order_scope``, ``envelope``, ``missing``,
        ``unavailable`` (the placeholder with ``missing`` ``keep``, else null),
        ``buckets``) and
        ``columns`` as ``{name: type}`` in the platform's type names (``int64``,
        ``float64``, ``string``, ``bool``, ``timestamp``, ``date``, ``binary``)."""
        return shard_summary(self.shard)


@dataclass(frozen=True)
class BucketSelection:
    """The keys of the buckets ``b`` (of the shard's ``buckets``) with
    ``b % count == index``: task ``index`` of ``count`` reading a snapshot in parallel."""

    buckets: int
    index: int
    count: int

    def keeps(self, bucket: int) -> bool:
        return bucket % self.count == self.index

    def mask(self, ids: np.ndarray) -> np.ndarray:
        return np.asarray(ids % self.count == self.index)


def _in_buckets(
    batches: Iterator[pa.RecordBatch], buckets: int,
    wanted: Callable[[np.ndarray], np.ndarray],
) -> Iterator[pa.RecordBatch]:
    """``batches`` with only the rows whose key's bucket (of ``buckets``) is wanted."""
    try:
        for batch in batches:
            keep = wanted(bucket_of_keys(batch.column("key"), buckets))
            if not keep.all():
                batch = batch.filter(pa.array(keep))
            if batch.num_rows:
                yield batch
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()


def typed_bases(state: ShardState) -> dict[int, BucketBase]:
    """The buckets' checkpoint bases a typed snapshot may read instead of the history
    before them (``persist.read.typed_read``): the part and typed bases of a batch-scope
    shard (``ingest.checkpoint``), each the bucket's rows as of its upper."""
    try:
        stored = ShardIngestConfig.read(state.config)
    except UpsertPlatformError:
        return {}  # the snapshot reports a malformed config, if it matters
    if stored.options is None or stored.options.order_scope is not OrderScope.BATCH:
        return {}
    out = {}
    for bucket, ref in stored.checkpoint_refs.items():
        if not ref.endswith(".parquet"):
            continue  # a columnar checkpoint holds encoded rows, not values
        base = Base.decode(stored.checkpoint_bases.get(bucket), state.upper)
        if base.size > 0 and base.rows > 0:
            out[bucket] = BucketBase(ref, base.as_of, base.rows, base.size)
    return out


def snapshot_schema(view: RowView) -> pa.Schema:
    """The Arrow schema of a snapshot of a shard read through ``view``: its visible
    columns."""
    return view.arrow_schema


def change_columns(view: RowView) -> tuple[str, str]:
    """The names of a changes read's time and diff columns for a shard read through
    ``view``.

    ``(TS_COLUMN, DIFF_COLUMN)`` (``__ts``, ``__diff``) unless the shard has a column of
    either name, in any case (every column of a file is a value column, so it may): then
    both names take one more leading ``_`` until neither is a column of the shard, case
    ignored. They never collide with a row column, even where names are resolved without
    case (Spark, DuckDB), so every value of a row stays readable by name. (A hidden
    column is not a column of a read, so it takes no name.)"""
    # Compared case-insensitively: Spark and DuckDB resolve names without case.
    taken = {name.casefold() for name in view.names}
    ts, diff = TS_COLUMN, DIFF_COLUMN
    while ts.casefold() in taken or diff.casefold() in taken:
        ts, diff = "_" + ts, "_" + diff
    return ts, diff


def changes_schema(view: RowView) -> pa.Schema:
    """The Arrow schema of a shard's changes: the snapshot's columns, then the change's
    time and diff (int64) named by :func:`change_columns`."""
    ts, diff = change_columns(view)
    return snapshot_schema(view).append(pa.field(ts, pa.int64())).append(
        pa.field(diff, pa.int64())
    )


def decode_snapshot_batch(view: RowView, batch: pa.RecordBatch) -> pa.Table:
    """One batch of a consolidated snapshot read (``key``, ``row``, ``ts``, ``diff``) as
    typed rows of the visible columns, a row of multiplicity ``n`` repeated ``n``
    times."""
    table = view.visible_table(_decode(view.stored, batch, repeat=True))
    return table.cast(snapshot_schema(view))


def decode_changes_batch(
    view: RowView, batch: pa.RecordBatch | pa.Table
) -> pa.Table:
    """One batch of a consolidated changes read (holding all updates of each key it
    covers, as every read's batches do) as typed rows of the visible columns, consolidated
    as such (``RowView.project_updates``), plus the change's time and diff
    (:func:`change_columns`)."""
    ts, diff = change_columns(view)
    updates = view.project_updates(batch)
    table = _decode(view.visible, updates, repeat=False)
    table = table.append_column(ts, updates.column("ts").cast(pa.int64()))
    table = table.append_column(diff, updates.column("diff").cast(pa.int64()))
    return table.cast(changes_schema(view))


def _decode(
    schema: SourceSchema | None, batch: pa.RecordBatch | pa.Table, *, repeat: bool
) -> pa.Table:
    """The batch's rows decoded into typed columns; with ``repeat`` a row of multiplicity
    ``n > 1`` appears ``n`` times (and rows with ``n <= 0`` not at all)."""
    rows = batch.column("row")
    if schema is None:
        if len(rows):
            raise CorruptData("the shard has rows but no stored source schema")
        return pa.table({})
    if repeat:
        diffs = batch.column("diff").to_numpy(zero_copy_only=False)
        if (diffs != 1).any():
            indices = np.repeat(np.arange(len(diffs)), np.maximum(diffs, 0))
            rows = rows.take(pa.array(indices))
    return decode_rows_to_table(schema, rows)
