"""The per-file and per-bucket steps of an ingest, shared by every engine.

An engine runs, for one landing file at timestamp ``ts``:

1. :func:`read_file` once: read and validate the file against the shard's schema
   and the request's value checks (``FileTask.value_checks``), write its row errors
   (value-check failures included) as an error part, and return the good rows tagged
   with their bucket (``ROWS_SCHEMA``) plus a :class:`FileRead` (metadata only).
2. :func:`run_bucket` once per bucket that has rows (or must be rebuilt): load the
   bucket's columnar state (checkpoint, else rehydration), drain the rows ``ToUpper``
   at ``ts`` with the feedback the append will confirm
   (:func:`~upsert_core.columnar.drain_to_upper`, whole columns, no object per key),
   write the output updates as batch parts and the new state as a checkpoint, and
   return a :class:`BucketResult`.

Both functions take plain data (:class:`FileTask`) and a Blob, catch every platform
error and report it as a message, so they run unchanged in the driver or in a Spark
task. Nothing is committed here: the driver does one compare-and-append per file.

Invariants:

- ``read_file`` raises nothing for a bad file: a file-level problem comes back as
  ``file_error`` (``"<file>: <problem>"``) with no rows and nothing written; a file
  that changed since it was listed comes back as ``changed`` the same way.
- ``run_bucket`` writes the checkpoint for ``upper = ts + 1``, i.e. the state as it is
  once the append commits; if the append does not commit, the driver deletes it.
- Global scope: a bucket whose drain found late rows (``columnar.late``) writes them as
  its late part (``ingest.late``), named in ``BucketResult.late`` for the commit.
- A bucket whose drain decided nothing (every row skipped) and whose state came from a
  current checkpoint keeps that checkpoint; nothing is rewritten.
- Incremental checkpoints (batch order scope only): a bucket's checkpoint is a *base*
  as of an earlier upper (``Base.as_of``) plus the shard's own changes since then
  (:mod:`~upsert_core.ingest.replay`). A step keeps the base while the updates since it
  (``Base.pending``) stay within ``REPLAY_FRACTION`` of its rows and ``MAX_REPLAY_BATCHES``
  batches, and otherwise writes a new one, so checkpoint writes follow the batch, not
  the table, and a cold load replays at most ``REPLAY_FRACTION`` of a base's updates. The
  global scope writes a current checkpoint whenever the bucket changed, as before.
- Part bases (batch order scope): a bucket drained from an empty state writes its
  output, all insertions, as one typed part, and that part is its checkpoint base
  (``checkpoint.is_part_base``): the state is stored once, and a later load reads its
  values and encodes only the rows a batch touches (``columnar.derived_rows``). A new
  base written later is a typed base (``ingest.typed_base``): the state as its values,
  in the same layout, so a batch-scope state is never stored as encoded rows.
- In a group (``ingest.group``), the steps of one bucket through the group's files run
  one after the other with a :class:`Carry`: the first loads the state as of the
  group's first file, each next one takes the state the one before it left (the state
  as of its ``ts``: no file between them had rows of the bucket) and the base its task
  records, so it does exactly what it would do as the step of a file on its own.
- With a :class:`StateCache`, a step takes the bucket's state from the cache instead of
  decoding the checkpoint when the cache holds it as of a committed upper (checked by
  commit nonce, see :mod:`~upsert_core.ingest.statecache`) and the referenced
  checkpoint still exists with the size it was written with; it puts the new state
  back afterwards. Results are identical with or without the cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from upsert_core.columnar import ColumnarState, DrainResult, drain_to_upper
from upsert_core.columnar.merge import fold
from upsert_core.errors import (
    IngestError,
    InvalidUpsertState,
    LandingFileChanged,
    NotReadable,
    UpsertPlatformError,
)
from upsert_core.ingest.base_cache import keep_base_copy
from upsert_core.ingest.buckets import bucket_of_keys
from upsert_core.ingest.checkpoint import (
    CheckpointUnusable,
    checkpoint_intact,
    load_checkpoint,
    new_state,
    write_checkpoint,
)
from upsert_core.ingest.first_drain import (
    FirstDrain,
    canonical_floats,
    drain_into_empty,
    has_values,
    rows_deferred,
    with_encoded_rows,
)
from upsert_core.ingest.late import late_table, write_late_part
from upsert_core.ingest.missing_values import fill_missing
from upsert_core.ingest.outcome import BucketResult, FileRead
from upsert_core.ingest.rehydrate import GLOBAL_REHYDRATION_WARNING, rehydrate_bucket
from upsert_core.ingest.replay import keep_part_copies, replay_bucket
from upsert_core.ingest.shard_config import hidden_columns
from upsert_core.ingest.statecache import CachedState, CacheKey, StateCache
from upsert_core.ingest.tombstones import load_tombstones, with_tombstones, write_tombstones
from upsert_core.ingest.typed_base import write_typed_base
from upsert_core.ingest.visible_counts import hidden_only_pairs
from upsert_core.landing import (
    LandingFile,
    RowError,
    SourceSchema,
    ValidatedBatch,
    ValueCheck,
    read_counter,
    validate_chunks,
    validate_file,
)
from upsert_core.landing.missing import (
    DEFAULT_PLACEHOLDER,
    MISSING_COLUMN,
    Missing,
    MissingPolicy,
    pack,
    parse_missing,
)
from upsert_core.landing.rows import decode_rows_to_table
from upsert_core.order_scope import OrderScope
from upsert_core.persist.keys import writing_as
from upsert_core.persist.location import Blob
from upsert_core.persist.state.codec_state import decode_state
from upsert_core.persist.state.state import BlobPart, Part, ShardState
from upsert_core.persist.write.consolidate import UPDATE_SCHEMA
from upsert_core.persist.write.parts import (
    DEFAULT_PART_ROWS,
    VALUE_PREFIX,
    delete_parts,
    insertions_table,
    store_insertions,
    write_error_batch,
    write_parts,
)

ROWS_SCHEMA = pa.schema(
    [
        ("bucket", pa.int32()),
        ("key", pa.binary()),
        ("row", pa.binary()),
        ("deleted", pa.bool_()),
        ("order", pa.int64()),
        ("position", pa.int64()),
    ]
)
"""Validated rows as exchanged between the read step and the bucket steps."""

ROWS_SCHEMA_ORDER_KEYS = ROWS_SCHEMA.set(
    ROWS_SCHEMA.get_field_index("order"), pa.field("order", pa.binary())
)
""":data:`ROWS_SCHEMA` of a shard whose order has several columns (``order_keys``)."""


def rows_schema(several_orders: bool, keep: bool = False) -> pa.Schema:
    """The exchanged rows' schema: ``order`` int64, or binary order keys; with ``keep``
    (``--missing keep``) a last column of per-row bitmaps of the values each row leaves
    out (``landing.missing``)."""
    schema = ROWS_SCHEMA_ORDER_KEYS if several_orders else ROWS_SCHEMA
    return schema.append(pa.field(MISSING_COLUMN, pa.binary())) if keep else schema

REPLAY_FRACTION = 0.35
"""A base is kept while the updates since it are at most this fraction of its rows.

Why 0.35: a columnar base costs about 32 bytes per key to write (zstd; the 16-byte key
digests do not compress) and a cold load replays the pending updates, so this keeps
both bounded by the batch: on a 1M-key shard with 100k-row batches (~170k updates each)
a bucket writes a new base every third batch, ~11 MB per batch amortised plus the 6 MB
of parts (delta-rs MERGE rewrites ~18 MB), and a cold load replays at most two batches."""

MAX_REPLAY_BATCHES = 64
"""A base is kept for at most this many batches (each replay reads their parts)."""


@dataclass(frozen=True)
class Base:
    """Where a bucket's checkpoint stands: its blob is the state as of ``as_of``;
    ``pending`` updates of the bucket were committed since; the blob holds ``rows``
    keys in ``size`` bytes (``size`` -1: unknown). Stored in the shard's config as
    ``as_of:pending:rows:size`` (``checkpoint.base.<bucket>``)."""

    as_of: int
    pending: int = 0
    rows: int = 0
    size: int = -1

    def encode(self) -> str:
        return f"{self.as_of}:{self.pending}:{self.rows}:{self.size}"

    @classmethod
    def decode(cls, text: str | None, default_as_of: int) -> Base:
        """The stored base, or (absent or malformed) one current at ``default_as_of``
        with nothing pending and its size unknown."""
        try:
            as_of, pending, rows, size = (int(x) for x in (text or "").split(":"))
        except ValueError:
            return cls(default_as_of)
        if not 0 <= as_of <= default_as_of or pending < 0 or rows < 0:
            return cls(default_as_of)
        return cls(as_of, pending, rows, size)


@dataclass
class FileTask:
    """Everything the steps need for one file, as plain (picklable) data.

    ``writer_id`` is the driver's registered writer id: every blob the steps write
    names it (``keys.writing_as``), wherever they run. ``checkpoints`` maps bucket ->
    config value of its checkpoint ref (absent or "" = empty state);
    ``checkpoints_current`` says whether those refs are valid at ``ts`` (the shard's
    upper). The shard's state is needed only to rehydrate: in-process it
    is passed as an object, to Spark tasks as bytes (``encode_state``).
    """

    shard_id: str
    ts: int
    file: LandingFile
    schema_json: str
    order_scope: str
    buckets: int
    checkpoints: dict[int, str] = field(default_factory=dict)
    checkpoints_current: bool = True
    inline_threshold: int = 4096
    typed_parts: bool = True
    """Write typed parts (value columns; ``options.TYPED_PARTS_ENV``)."""
    values_only: bool = True
    """With ``typed_parts``: store each row once, as its values (part format 3)."""
    part_bases: bool = True
    """With ``values_only``: a bucket drained from an empty state may keep its part as
    its checkpoint base (batch scope; see the module docstring)."""
    shard_state: ShardState | None = None
    shard_state_bytes: bytes | None = None
    bases: dict[int, str] = field(default_factory=dict)
    tombstones: dict[int, str] = field(default_factory=dict)
    """Global scope: bucket -> its recorded tombstone set (``ingest.tombstones``; ""
    none; absent: never recorded)."""
    commit_nonce: str = ""
    history: dict[int, str] = field(default_factory=dict)
    writer_id: str | None = None
    value_checks: tuple[ValueCheck, ...] = ()
    envelope: str = "plain"
    """``plain`` or ``debezium``: how the file's rows are laid out (``landing.debezium``)."""
    missing: str = "null"
    """``null`` or ``keep``: what a value a row leaves out means (``landing.missing``)."""
    unavailable: str = DEFAULT_PLACEHOLDER
    """With ``missing`` ``keep``: the placeholder string that marks a value left out."""
    may_defer_rows: bool = True
    """False: validation encodes every row even where :attr:`defers_rows` would not
    (the retry after :class:`RowsNotDeferred`)."""

    @property
    def scope(self) -> OrderScope:
        return OrderScope(self.order_scope)

    @property
    def rows_schema(self) -> pa.Schema:
        """The schema of this file's exchanged rows (:func:`rows_schema`)."""
        return rows_schema(SourceSchema.from_json(self.schema_json).several_orders, self.keeps)

    @property
    def keeps(self) -> bool:
        """Whether a value a row leaves out keeps the key's previous one."""
        return parse_missing(self.missing) is Missing.KEEP

    @property
    def defers_rows(self) -> bool:
        """Whether validation leaves the rows unencoded (``ingest.first_drain``): the
        shard's first file in the batch scope, every bucket starting empty, stored as
        values only (no ``--missing keep``, whose fill reads encoded rows)."""
        return (
            self.may_defer_rows and self.ts == 0 and self.scope is OrderScope.BATCH
            and self.typed_parts
            and self.values_only and self.part_bases and not self.keeps
        )

    @property
    def missing_policy(self) -> MissingPolicy | None:
        """What validation marks as left out (None: ``--missing null``, nothing)."""
        return MissingPolicy(self.unavailable) if self.keeps else None

    def forced_buckets(self) -> list[int]:
        """Buckets to run even without rows: all of them when checkpoints are stale."""
        return [] if self.checkpoints_current else list(range(self.buckets))

    def base(self, bucket: int) -> Base:
        """Bucket ``bucket``'s checkpoint base (current at ``ts`` if none is recorded)."""
        return Base.decode(self.bases.get(bucket), self.ts)

    def load_shard_state(self) -> ShardState:
        if self.shard_state is not None:
            return self.shard_state
        if self.shard_state_bytes is None:
            raise IngestError(f"{self.file.name}: no shard state shipped for rehydration")
        self.shard_state = decode_state(self.shard_state_bytes)
        return self.shard_state


# --- step 1: read and validate one file ---------------------------------------------------


def read_file(
    task: FileTask, blob: Blob, *, write_errors: bool = True
) -> tuple[FileRead, pa.Table]:
    """Read, validate and bucket one file; write its error part. Never raises a
    platform error: problems come back in ``FileRead.file_error``.

    ``write_errors=False`` skips writing the error part (``error_batch`` stays None):
    for engines where several tasks read the same file and one of them records it."""
    with writing_as(task.writer_id):
        before = read_counter.bytes_read(task.file.url)
        read, rows = _read_file(task, blob, write_errors=write_errors)
        read.landing_bytes = read_counter.bytes_read(task.file.url) - before
        read.digest = task.file.known_digest()  # the reader digested what it read
        return read, rows


def file_error_read(name: str, exc: UpsertPlatformError) -> FileRead:
    """The :class:`FileRead` of a file that failed as a whole with ``exc``."""
    if isinstance(exc, LandingFileChanged):
        return FileRead(changed=str(exc))
    message = str(exc)
    if not message.startswith((f"{name}:", f"{name!r}:")):  # a bad name is shown quoted
        message = f"{name}: {message}"
    return FileRead(file_error=message)


def record_errors(
    task: FileTask, blob: Blob, read: FileRead, errors: pa.RecordBatch, write_errors: bool
) -> bool:
    """Write the file's error rows as its error part (if any and ``write_errors``);
    False (with ``read.file_error`` set) if they cannot be written."""
    try:
        if errors.num_rows and write_errors:
            eb = write_error_batch(
                blob, task.shard_id, task.ts, errors, inline_threshold=task.inline_threshold,
            )
            read.error_batch = eb
            read.bytes_written += eb.part.encoded_size_bytes
            if isinstance(eb.part, BlobPart):
                read.new_blobs.append(eb.part.key)
    except UpsertPlatformError as exc:
        read.file_error = f"{task.file.name}: cannot write its error rows: {exc}"
        return False
    return True


def bucketed(batch: ValidatedBatch, buckets: int, keep: bool = False) -> pa.Table:
    """The good rows of ``batch`` with their buckets (:func:`rows_schema`; ``keep``: with
    the values each leaves out), followed by their typed values as ``v:<column>``
    columns when validation kept them (see :func:`part_values`)."""
    good = batch.to_arrow()
    columns = [
        pa.array(bucket_of_keys(good.column("key"), buckets), pa.int32()),
        good.column("key").cast(pa.binary()),
        good.column("row"),
        good.column("deleted"),
        good.column("order"),
        good.column("position"),
    ]
    if keep:
        marks = batch.missing if batch.missing is not None else np.zeros(
            (len(batch), len(batch.schema.names)), np.bool_)
        columns.append(pack(marks))
    rows = pa.table(columns, schema=rows_schema(batch.schema.several_orders, keep))
    if batch.values is None:
        return rows
    for name, column in zip(batch.values.column_names, batch.values.columns, strict=True):
        rows = rows.append_column(VALUE_PREFIX + name, column)
    return rows


def part_values(
    row_schema: SourceSchema, rows: pa.Table, updates: pa.Table, sources: np.ndarray
) -> pa.Table:
    """The value columns of a drain's output ``updates`` (``row_schema``'s columns and
    types): row ``i`` holds the values row ``i`` of ``updates`` encodes.

    An insertion's values are taken from the file's validated values (``rows``' value
    columns, ``sources[i]`` its row in ``rows``) instead of decoding its encoded row,
    with floats made canonical as the codec stores them (``-0.0`` as ``0.0``, every NaN
    as the one quiet NaN), so both give equal values. Retractions (``sources[i]`` -1)
    and rows without kept values are decoded."""
    names = [VALUE_PREFIX + name for name in row_schema.names]
    if not has_values(rows, row_schema):
        return decode_rows_to_table(row_schema, updates.column("row"))
    inserted = np.flatnonzero(sources >= 0)
    taken = rows.select(names).take(pa.array(sources[inserted], pa.int64()))
    taken = taken.rename_columns(list(row_schema.names))
    taken = pa.table(
        [canonical_floats(col) for col in taken.columns], names=list(row_schema.names)
    )
    if len(inserted) == len(sources):
        return taken
    retracted = np.flatnonzero(sources < 0)
    decoded = decode_rows_to_table(
        row_schema, updates.column("row").take(pa.array(retracted, pa.int64()))
    )
    merged = pa.concat_tables([taken, decoded])
    at = np.empty(len(sources), np.int64)
    at[np.concatenate([inserted, retracted])] = np.arange(len(sources))
    return merged.take(pa.array(at, pa.int64())).combine_chunks()


def _read_file(task: FileTask, blob: Blob, *, write_errors: bool) -> tuple[FileRead, pa.Table]:
    try:
        schema = SourceSchema.from_json(task.schema_json)
        batch = validate_file(task.file, schema, task.value_checks, task.envelope,
                              task.missing_policy, encode_rows=not task.defers_rows)
    except UpsertPlatformError as exc:
        return file_error_read(task.file.name, exc), task.rows_schema.empty_table()
    read = FileRead(
        schema_json=batch.schema.to_json(), rows_read=batch.total_rows, good_rows=len(batch),
        skipped=batch.skipped,
    )
    if not record_errors(task, blob, read, batch.errors_to_arrow(), write_errors):
        return read, task.rows_schema.empty_table()
    return read, bucketed(batch, task.buckets, task.keeps)


class RowsNotDeferred(Exception):
    """A chunk of a file read with :attr:`FileTask.defers_rows` came back encoded (its
    values did not certainly encode), or with other columns than the chunks before it
    (which the spill would drop, values included), so its chunks would not be of one
    kind: the caller discards what its sink received and reads the file again with
    ``may_defer_rows=False``. Nothing was written when it is raised."""


def read_file_streamed(
    task: FileTask, blob: Blob, sink: Callable[[pa.Table], None], *,
    write_errors: bool = True,
) -> FileRead:
    """:func:`read_file` for a file read in chunks (``landing.chunks``; Parquet): each
    chunk is validated against the schema the one before left, and its bucketed rows
    (``ROWS_SCHEMA``) go to ``sink`` in file order; the error rows of all chunks make
    one error part. A file-level problem in any chunk comes back in ``file_error`` as
    for :func:`read_file`, and the caller discards what ``sink`` received. With
    ``task.defers_rows`` every chunk's rows are deferred, with the same columns, or
    :class:`RowsNotDeferred` is raised."""
    with writing_as(task.writer_id):
        before = read_counter.bytes_read(task.file.url)
        read = _read_file_streamed(task, blob, sink, write_errors=write_errors)
        read.landing_bytes = read_counter.bytes_read(task.file.url) - before
        read.digest = task.file.known_digest()  # None for a local Parquet file
        return read


def _read_file_streamed(
    task: FileTask, blob: Blob, sink: Callable[[pa.Table], None], *, write_errors: bool
) -> FileRead:
    name = task.file.name
    errors: list[RowError] = []
    rows_read = good = skipped = 0
    deferred: pa.Schema | None = None
    try:
        schema = SourceSchema.from_json(task.schema_json)
        for batch in validate_chunks(task.file, schema, task.value_checks, task.envelope,
                                     task.missing_policy, encode_rows=not task.defers_rows):
            schema = batch.schema
            errors.extend(batch.errors)
            rows_read += batch.total_rows
            good += len(batch)
            skipped += batch.skipped
            if not len(batch):
                continue
            if task.defers_rows and not batch.rows_deferred:
                raise RowsNotDeferred(name)
            rows = bucketed(batch, task.buckets, task.keeps)
            if task.defers_rows:
                # SUBTLE: chunks whose columns differ (a Debezium chunk of deletes only
                # has no value columns yet) reach the drain with the base columns only
                # (ingest.spill), and deferred rows are nothing without their values.
                deferred = deferred or rows.schema
                if rows.schema != deferred:
                    raise RowsNotDeferred(name)
            sink(rows)
    except UpsertPlatformError as exc:
        return file_error_read(name, exc)
    read = FileRead(schema_json=schema.to_json(), rows_read=rows_read, good_rows=good,
                    skipped=skipped)
    error_rows = ValidatedBatch(name, schema, errors=errors).errors_to_arrow()
    record_errors(task, blob, read, error_rows, write_errors)
    return read


# --- step 2: one bucket -------------------------------------------------------------------


def cache_key(task: FileTask, bucket: int) -> CacheKey:
    """The key of bucket ``bucket``'s state in a :class:`StateCache`."""
    return (task.shard_id, bucket, task.buckets, task.order_scope)


def _intact(blob: Blob, ref: str, base: Base) -> bool:
    """Whether checkpoint ``ref`` still exists (with the recorded size, when known)."""
    return not ref or checkpoint_intact(blob, ref, base.size)


def _current_base(task: FileTask, bucket: int) -> Base:
    """The base bucket ``bucket``'s recorded checkpoint stands on at ``task.ts`` (global
    scope: always current, as it is never replayed; see the module docstring)."""
    base = task.base(bucket)
    if task.scope is not OrderScope.BATCH and base.as_of != task.ts:
        base = Base(task.ts, 0, base.rows, base.size)
    return base


def _load_state(
    task: FileTask, bucket: int, blob: Blob, result: BucketResult, cache: StateCache | None
) -> tuple[ColumnarState, Base]:
    """The bucket's state at ``task.ts`` and the base its checkpoint stands on."""
    ref = task.checkpoints.get(bucket) or ""
    why: str
    if task.ts == 0:
        result.loaded = "new"
        return new_state(task.scope), Base(0)
    if task.checkpoints_current:
        replayable = task.scope is OrderScope.BATCH
        base = _current_base(task, bucket)
        entry = None
        if cache is not None:
            entry = cache.take(cache_key(task, bucket), task.ts, task.history,
                               exact=not replayable)
        try:
            if entry is not None and entry.checkpoint == ref and _intact(blob, ref, base):
                state, lower, result.loaded = entry.state, entry.upper, "cache"
            else:
                # A local copy of the base (ingest.base_cache) only while the blob it
                # copies is still there as committed, as for a cached state above.
                state = new_state(task.scope) if not ref else load_checkpoint(
                    blob, ref, task.shard_id, bucket, task.buckets, task.scope,
                    local_cache=_intact(blob, ref, base),
                )
                lower, result.loaded = base.as_of, "checkpoint" if ref else "new"
            if lower < task.ts:
                state, _ = replay_bucket(
                    blob, task.load_shard_state(), state, bucket, task.buckets, lower, task.ts
                )
                result.loaded += "+replay"
            return state, base
        except (CheckpointUnusable, NotReadable, InvalidUpsertState) as exc:
            why = str(exc)
    else:
        why = f"no checkpoint is known to be current at upper {task.ts}"
    shard_state = task.load_shard_state()
    state = rehydrate_bucket(
        blob, shard_state, bucket, task.buckets, task.scope,
        SourceSchema.from_json(task.schema_json),
    )
    result.rehydrated, result.loaded = why, "rehydrated"
    if task.scope is OrderScope.GLOBAL:
        recorded = task.tombstones.get(bucket)
        if recorded is None:  # last written before tombstones were recorded
            result.warnings.append(GLOBAL_REHYDRATION_WARNING.format(bucket=bucket))
        else:
            dead = load_tombstones(blob, recorded, task.shard_id, bucket, task.buckets)
            state = with_tombstones(state, dead)
            result.loaded += "+tombstones"
    return state, Base(task.ts)


def load_bucket_state(
    task: FileTask, bucket: int, blob: Blob
) -> tuple[ColumnarState, BucketResult]:
    """Bucket ``bucket``'s state at ``task.ts`` exactly as its bucket step would load it
    (checkpoint and replay, or a rebuild from the shard with its recorded tombstones),
    with what the loading reports (``loaded``, ``rehydrated``, ``warnings``). Raises
    the platform errors the loading raises (say :class:`TombstonesLost`): the caller,
    unlike a bucket step, has no failure to report them in."""
    result = BucketResult(bucket=bucket)
    state, _ = _load_state(task, bucket, blob, result, None)
    return state, result


@dataclass
class Carry:
    """How the bucket steps of one bucket through the files of a group
    (``ingest.group``), run one after the other in one task, get their state: the first
    step loads it as of ``first`` (the group's first file: its ``ts`` is the shard's
    committed upper, so checkpoint, cache, replay and rehydration work as for any
    file); every step leaves its new state in ``state`` for the next one, which is
    its state as of its own ``ts`` (no file between them had rows of the bucket).
    A step that fails leaves ``state`` as it was."""

    first: FileTask
    state: ColumnarState | None = None


def run_bucket(
    task: FileTask,
    bucket: int,
    rows: pa.Table,
    blob: Blob,
    cache: StateCache | None = None,
    row_schema_json: str | None = None,
    carry: Carry | None = None,
) -> BucketResult:
    """Drain one bucket's rows at ``task.ts``; see the module docstring. Never raises a
    platform error: it comes back in ``BucketResult.failure``.

    ``row_schema_json`` is the schema the file's rows were encoded with
    (``FileRead.schema_json``: the shard's, plus any columns the file added; default
    the task's): the written parts carry the rows decoded with it as value columns.
    ``carry``: the step is one of a group's (see :class:`Carry`)."""
    result = BucketResult(bucket=bucket)
    try:
        with writing_as(task.writer_id):
            row_schema = SourceSchema.from_json(row_schema_json or task.schema_json)
            _run_bucket(task, bucket, rows, blob, result, cache, row_schema, carry)
    except UpsertPlatformError as exc:
        result.failure = f"{type(exc).__name__}: bucket {bucket}: {exc}"
    return result


def _carried_state(
    task: FileTask, bucket: int, blob: Blob, result: BucketResult, cache: StateCache | None,
    carry: Carry,
) -> tuple[ColumnarState, Base]:
    """The bucket's state at ``task.ts`` in a group (:class:`Carry`), and its base: the
    one ``task`` records (the group's chain of results, ``ingest.group``), or for a
    state rebuilt from the shard a base current at ``task.ts``, as :func:`_load_state`
    gives for a file of its own."""
    if carry.state is not None:
        result.loaded = "carried"
        return carry.state, _current_base(task, bucket)
    state, base = _load_state(carry.first, bucket, blob, result, cache)
    if carry.first.ts == task.ts:
        return state, base
    return state, Base(task.ts) if result.rehydrated is not None else _current_base(task, bucket)


def _live_rows_of(state: ColumnarState) -> int:
    """Keys of ``state`` with a row (tombstones are not rows)."""
    if state.orders is None:
        return len(state)
    return int(len(state) - fold(state).rows.null_count)


def _keeps_base(task: FileTask, base: Base, pending: int, result: BucketResult) -> bool:
    """Whether the bucket may keep its base (the updates since it get replayed)."""
    return (
        task.scope is OrderScope.BATCH
        and result.rehydrated is None
        and pending <= REPLAY_FRACTION * base.rows
        and task.ts + 1 - base.as_of <= MAX_REPLAY_BATCHES
    )


def _part_base(parts: list[Part], rows: int) -> BlobPart | None:
    """The one blob part holding all ``rows`` of a bucket's state, if there is one."""
    if len(parts) == 1 and isinstance(parts[0], BlobPart) and parts[0].num_updates == rows:
        return parts[0]
    return None


def _record_late(
    task: FileTask, bucket: int, rows: pa.Table, drained: DrainResult, blob: Blob,
    result: BucketResult, row_schema: SourceSchema,
) -> None:
    """Write the bucket's late rows of the file as its late part (``ingest.late``),
    committed with the batch."""
    table = late_table(row_schema, task.file.name, rows, drained.late, drained.late_stored)
    key, size = write_late_part(blob, task.shard_id, task.ts, bucket, task.buckets, table)
    result.late, result.late_rows = key, table.num_rows
    result.new_blobs.append(key)
    result.bytes_written += size


def _run_bucket(
    task: FileTask,
    bucket: int,
    rows: pa.Table,
    blob: Blob,
    result: BucketResult,
    cache: StateCache | None,
    row_schema: SourceSchema,
    carry: Carry | None = None,
) -> None:
    ts = task.ts
    if carry is None:
        state, base = _load_state(task, bucket, blob, result, cache)
    else:
        state, base = _carried_state(task, bucket, blob, result, cache, carry)
    # Batch scope, from an empty state: the output is every row the state will hold,
    # all insertions, so a format-3 part of it can be the bucket's checkpoint base.
    whole_state = (
        task.scope is OrderScope.BATCH and len(state) == 0 and task.typed_parts
        and task.values_only and task.part_bases and result.rehydrated is None
    )
    first: FirstDrain | None = None
    first_table: pa.Table | None = None
    if rows_deferred(rows) and whole_state and not task.keeps and has_values(rows, row_schema):
        # Validation left the rows unencoded and nothing here compares one: the
        # insertions and the state come from the values (ingest.first_drain).
        first = drain_into_empty(rows, row_schema)
    else:
        # Deferred rows may come in their chunks (engine._run_spilled): the drain and
        # the steps below take one chunk per column.
        rows = with_encoded_rows(rows, row_schema).combine_chunks()
    if task.keeps:
        # --missing keep: each row made whole from the key's earlier one (this batch's
        # or the state's) before the drain, which then sees complete rows only.
        rows = fill_missing(state, rows, row_schema)
    # SUBTLE: the drain's state includes the feedback of this very output before the
    # append commits. That is safe because the state only leaves this step as a
    # checkpoint (or a cache entry), which is used only once the very
    # compare-and-append that commits this output has committed.
    if first is not None:
        drained = DrainResult(UPDATE_SCHEMA.empty_table(), first.state, first.winners,
                              first.winners, len(first.keys), 0)
        updates = len(first.keys)
    else:
        drained = drain_to_upper(state, rows, ts)
        updates = drained.updates.num_rows
    state, table = drained.state, drained.updates
    result.state_keys = len(state)
    result.inserts = drained.inserts
    result.retractions = drained.retractions
    ref = task.checkpoints.get(bucket) or ""
    try:
        if len(drained.late):
            _record_late(task, bucket, rows, drained, blob, result, row_schema)
        if first is not None and updates:
            first_table = insertions_table(
                first.keys, ts, first.values, bucket=(bucket, task.buckets)
            )
            result.parts = [store_insertions(
                blob, task.shard_id, first_table, inline_threshold=task.inline_threshold,
            )]
        elif table.num_rows:
            # Typed, bucket-labelled parts: a snapshot reads their value columns bucket
            # by bucket, with neither a merge nor a decode (persist.read.typed_read).
            values = (
                part_values(row_schema, rows, table, drained.sources)
                if task.typed_parts else None
            )
            if drained.retractions:
                # The counts are of the changes reads show (ingest.visible_counts): a
                # Debezium update that changes only the hidden order is none.
                same = hidden_only_pairs(
                    table, row_schema, hidden_columns(row_schema, task.envelope), values)
                result.inserts -= same
                result.retractions -= same
            result.parts = list(write_parts(
                blob, task.shard_id, table, inline_threshold=task.inline_threshold,
                presorted=True,  # drain_to_upper emits (key, row) order
                values=values, bucket=(bucket, task.buckets),
                values_only=task.typed_parts and task.values_only,
                # A part that may become the bucket's base stays whole (see below).
                part_rows=table.num_rows if whole_state else DEFAULT_PART_ROWS,
            ))
        if task.scope is OrderScope.BATCH and task.typed_parts and task.values_only and (
            not whole_state
        ):
            # The next process replays these parts: it maps this machine's copies.
            keep_part_copies(blob, task.shard_id, result.parts, table, (bucket, task.buckets))
        for part in result.parts:
            result.bytes_written += part.encoded_size_bytes
            if isinstance(part, BlobPart):
                result.new_blobs.append(part.key)
        pending = base.pending + updates
        if task.scope is OrderScope.GLOBAL and (
            drained.applied or result.rehydrated is not None or bucket not in task.tombstones
        ):
            key, size = write_tombstones(
                blob, task.shard_id, bucket, task.buckets, ts + 1, state
            )
            result.tombstones = key
            if key:
                result.new_blobs.append(key)
                result.bytes_written += size
        if result.rehydrated is not None:
            # A bucket rebuilt from the shard knows its live rows exactly (the ingest's
            # running count may not: see pipeline._live_rows_after).
            result.live_after = _live_rows_of(state)
        if not drained.applied and result.rehydrated is None:
            result.checkpoint, new_base = ref, base
        elif _keeps_base(task, base, pending, result):
            result.checkpoint = ref
            new_base = Base(base.as_of, pending, base.rows, base.size)
        elif len(state) == 0:
            result.checkpoint, new_base = "", Base(ts + 1)
        elif whole_state and (part_base := _part_base(result.parts, len(state))):
            # The state is stored once: its part is its base (checkpoint.is_part_base).
            result.checkpoint = part_base.key
            if first_table is not None:  # the next process maps this machine's copy
                keep_base_copy(blob, task.shard_id, bucket, part_base.key, first_table)
            new_base = Base(ts + 1, 0, len(state), part_base.encoded_size_bytes)
        elif task.scope is OrderScope.BATCH and task.typed_parts and task.values_only \
                and task.part_bases:
            # The state as its rows' values, like the parts (ingest.typed_base).
            key, size = write_typed_base(
                blob, task.shard_id, bucket, task.buckets, ts + 1, state, row_schema
            )
            result.checkpoint = key
            result.new_blobs.append(key)
            result.bytes_written += size
            new_base = Base(ts + 1, 0, len(state), size)
        else:
            key, size = write_checkpoint(
                blob, task.shard_id, bucket, task.buckets, task.scope, ts + 1, state
            )
            result.checkpoint = key
            result.new_blobs.append(key)
            result.bytes_written += size
            new_base = Base(ts + 1, 0, len(state), size)
        result.base = new_base.encode()
    except BaseException:
        # Nothing written by a failed step is referenced anywhere yet: remove it all
        # (whatever failed: a platform error becomes the bucket's failure, anything
        # else propagates, and neither may leave the step's blobs behind).
        delete_parts(blob, result.parts)
        for key in result.new_blobs:
            blob.delete(key)
        result.parts, result.new_blobs = [], []
        raise
    if carry is not None:
        carry.state = state
    if cache is not None and task.commit_nonce:
        cache.put(
            cache_key(task, bucket),
            CachedState(state, ts + 1, task.commit_nonce, result.checkpoint or ""),
        )

