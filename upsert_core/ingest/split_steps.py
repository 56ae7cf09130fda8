"""The read step of :mod:`~upsert_core.ingest.tasks` for one file read as splits.

An engine that reads a file once, in parallel (the Spark engine's split path), runs:

1. :func:`read_split_step` once per split (``landing.splits``): read, validate and
   bucket the split's rows; it returns a :class:`SplitMeta` (plain data), the split's
   error rows and its rows per bucket, row numbers still local for JSON Lines.
2. :func:`gather_read` once, given every split's meta and error rows: the file's
   :class:`FileRead` (counts summed, error rows renumbered and written as the file's ONE
   error part) and the buckets that must run.
3. :func:`bucket_rows` once per bucket, given every split's meta and that bucket's
   rows: the bucket's rows in file order with their file row numbers, for the one
   bucket step every engine runs (:func:`~upsert_core.ingest.tasks.run_bucket`).

Steps 2 and 3 need every split's meta (its line count for the row numbers, its schema
for the check below), so an engine hands each of them all of them.

Invariants:

- The result equals reading the file whole (``tasks.read_file``) or it is not used: a
  split validates against the shard's schema on its own, so when the splits disagree on
  the schema they evolve (a JSON column typed differently, or null in some split), or
  any split meets a file-level problem (which the whole file may not have, e.g. a key
  column absent from one split's lines), steps 2 and 3 answer :class:`Fallback` and
  write nothing; the engine then reads the file whole. JSON Lines splits without rows
  do not vote (they have no columns); Parquet splits always do (each carries every
  typed column of the file, so a file without rows fixes its columns' types as whole).
  When every split with rows evolves the same schema, the whole file evolves it too
  (each column's type comes from the same rule on the union of its values), and
  every row converts as it would in the whole file (conversions are per value).
- A split that found the file changed makes the whole file ``changed`` (left pending).
- Error rows are written once, by step 2, with the file's row numbers; the engine runs
  step 2 exactly once per attempt (a retried Spark task may write the part again:
  the copy nobody commits is the writer's leaked blob, which GC removes).
- Rows reach a bucket step in file order (splits in order; positions ascending).
- The file's content digest (``FileRead.digest``, what the ledger records) is combined
  by step 2 from the block runs the splits digested as they read
  (``landing.splits``); when they do not tile the file (they always should) the read
  has no digest and the ledger reads the file at commit instead of trusting them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from upsert_core.errors import IngestError, UpsertPlatformError
from upsert_core.ingest.buckets import split_rows
from upsert_core.ingest.outcome import FileRead
from upsert_core.ingest.tasks import (
    FileTask,
    bucketed,
    file_error_read,
    record_errors,
)
from upsert_core.landing import SourceSchema, read_counter, validate_batch
from upsert_core.landing.digest import BlockRun, combine
from upsert_core.landing.splits import Split, line_offsets, read_split
from upsert_core.landing.validate import ERRORS_ARROW_SCHEMA
from upsert_core.persist.keys import writing_as
from upsert_core.persist.location import Blob
from upsert_core.persist.write.parts import VALUE_PREFIX


@dataclass
class SplitMeta:
    """What one split read, besides its rows (plain data, shipped as JSON)."""

    index: int
    count: int
    rows_read: int = 0
    good_rows: int = 0
    lines: int = 0
    absolute: bool = True
    schema_json: str | None = None
    file_error: str | None = None
    changed: str | None = None
    landing_bytes: int = 0
    buckets: list[int] = field(default_factory=list)
    where: str = ""  # which task read it (set by the engine, for its metrics)
    blocks_first: int = 0  # the first block the split digested (landing.splits)
    blocks: str = ""  # the digests of its blocks, hex (only step 2 needs them)
    blocks_covered: int = 0  # the file's bytes those blocks hold

    def block_run(self) -> BlockRun:
        return BlockRun(self.blocks_first, bytes.fromhex(self.blocks), self.blocks_covered)

    def without_blocks(self) -> SplitMeta:
        """This meta for the steps that do not combine the digest (smaller)."""
        return replace(self, blocks="")

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> SplitMeta:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class Fallback:
    """The splits cannot stand for the file: read it whole instead (module docstring)."""

    reason: str


def read_split_step(
    task: FileTask, split: Split
) -> tuple[SplitMeta, pa.Table, dict[int, pa.Table]]:
    """Step 1 for ``split``: its meta, its error rows (``ERRORS_ARROW_SCHEMA``, row
    numbers local unless ``meta.absolute``) and its rows per bucket (``ROWS_SCHEMA`` plus
    value columns). Never raises a platform error: it is in the meta."""
    url = task.file.url
    before = read_counter.bytes_read(url)
    meta = SplitMeta(split.index, split.count)
    errors = ERRORS_ARROW_SCHEMA.empty_table()
    groups: dict[int, pa.Table] = {}
    with writing_as(task.writer_id):
        try:
            got = read_split(task.file, split, track_missing=task.keeps)
            batch = validate_batch(
                got.raw, SourceSchema.from_json(task.schema_json), task.value_checks,
                task.missing_policy,
            )
        except UpsertPlatformError as exc:
            failed = file_error_read(task.file.name, exc)
            meta.file_error, meta.changed = failed.file_error, failed.changed
        else:
            meta.rows_read, meta.good_rows = batch.total_rows, len(batch)
            meta.lines, meta.absolute = got.lines, got.absolute
            meta.schema_json = batch.schema.to_json()
            meta.blocks_first, meta.blocks = got.blocks.first, got.blocks.to_hex()
            meta.blocks_covered = got.blocks.covered
            errors = pa.Table.from_batches([batch.errors_to_arrow()])
            rows = bucketed(batch, task.buckets, task.keeps)
            groups = split_rows(rows, np.asarray(rows.column("bucket").to_numpy(), np.int64))
            meta.buckets = sorted(groups)
    meta.landing_bytes = read_counter.bytes_read(url) - before
    return meta, errors, groups


def _check(task: FileTask, metas: Sequence[SplitMeta]) -> list[SplitMeta]:
    """The metas in split order; :class:`IngestError` unless there is exactly one per
    split (an engine that lost or repeated a split must not commit)."""
    ordered = sorted(metas, key=lambda m: m.index)
    count = ordered[0].count if ordered else 0
    if [m.index for m in ordered] != list(range(count)) or any(m.count != count for m in ordered):
        raise IngestError(
            f"{task.file.name}: the read got splits {[m.index for m in ordered]}"
            f" of {count}; re-run the ingest"
        )
    return ordered


def _verdict(task: FileTask, metas: list[SplitMeta]) -> FileRead | Fallback | str:
    """The file's changed read, a fallback, or the schema every split agrees on."""
    changed = next((m.changed for m in metas if m.changed), None)
    if changed is not None:
        return FileRead(changed=changed, landing_bytes=sum(m.landing_bytes for m in metas))
    failed = next((m for m in metas if m.file_error), None)
    if failed is not None:
        return Fallback(f"split {failed.index} of {failed.count}: {failed.file_error}")
    # A Parquet split (absolute) carries every typed column of the file, rows or not, so
    # it votes even without rows: a file without rows still fixes its columns' types.
    schemas = {m.schema_json for m in metas if (m.rows_read or m.absolute) and m.schema_json}
    if len(schemas) > 1:
        return Fallback(f"the {len(metas)} splits evolve the schema differently")
    return schemas.pop() if schemas else task.schema_json


def _offsets(metas: list[SplitMeta]) -> list[int]:
    """What to add to each split's row numbers (0 for absolute ones)."""
    lines = line_offsets([m.lines for m in metas])
    return [0 if m.absolute else off for m, off in zip(metas, lines, strict=True)]


def _renumbered(table: pa.Table, column: str, offset: int) -> pa.Table:
    if not offset or not table.num_rows:
        return table
    at = table.schema.get_field_index(column)
    shifted = pc.add(table.column(column), pa.scalar(offset, pa.int64()))
    return table.set_column(at, table.schema.field(at), shifted)


def gather_read(
    task: FileTask, metas: Sequence[SplitMeta], errors: Sequence[pa.Table], blob: Blob
) -> tuple[FileRead, list[int]] | Fallback:
    """Step 2 (module docstring): the file's read and the buckets that must run
    (``errors[i]`` belongs to ``metas[i]``). Raises :class:`IngestError` for a missing or
    repeated split."""
    by_index = {m.index: e for m, e in zip(metas, errors, strict=True)}
    ordered = _check(task, metas)
    verdict = _verdict(task, ordered)
    if isinstance(verdict, Fallback):
        return verdict
    if isinstance(verdict, FileRead):
        return verdict, []
    read = FileRead(
        schema_json=verdict,
        rows_read=sum(m.rows_read for m in ordered),
        good_rows=sum(m.good_rows for m in ordered),
        landing_bytes=sum(m.landing_bytes for m in ordered),
        digest=combine([m.block_run() for m in ordered], task.file.size,
                       task.file.digest_kind()),
    )
    numbered = [
        _renumbered(by_index[m.index], "row", off)
        for m, off in zip(ordered, _offsets(ordered), strict=True)
    ]
    all_errors = pa.concat_tables(numbered).combine_chunks()
    batch = (all_errors.to_batches()[0] if all_errors.num_rows
             else pa.RecordBatch.from_pylist([], schema=ERRORS_ARROW_SCHEMA))
    with writing_as(task.writer_id):
        if not record_errors(task, blob, read, batch, True):
            return read, []
    wanted = {b for m in ordered for b in m.buckets} | set(task.forced_buckets())
    return read, sorted(wanted)


def bucket_rows(
    task: FileTask, metas: Sequence[SplitMeta], pieces: Sequence[pa.Table]
) -> tuple[pa.Table, str] | Fallback | None:
    """Step 3 (module docstring): one bucket's rows from every split (``pieces[i]`` of
    ``metas[i]``, possibly empty) in file order with file row numbers, and the schema
    they were encoded with; ``None`` when the file is not to be applied (changed)."""
    by_index = {m.index: p for m, p in zip(metas, pieces, strict=True)}
    ordered = _check(task, metas)
    verdict = _verdict(task, ordered)
    if isinstance(verdict, FileRead):
        return None
    if isinstance(verdict, Fallback):
        return verdict
    tables = [
        _renumbered(by_index[m.index], "position", off)
        for m, off in zip(ordered, _offsets(ordered), strict=True)
        if by_index[m.index].num_rows
    ]
    if not tables:
        return task.rows_schema.empty_table(), verdict
    if len({t.schema for t in tables}) > 1:
        # Splits kept their typed values differently (one's rows were encoded one by
        # one): keep none, the bucket step decodes them (the same values).
        tables = [t.select([n for n in t.column_names if not n.startswith(VALUE_PREFIX)])
                  for t in tables]
    rows = pa.concat_tables(tables).combine_chunks()
    positions = rows.column("position").to_numpy()
    if len(positions) > 1 and not bool(np.all(positions[1:] > positions[:-1])):
        rows = rows.take(pc.sort_indices(rows, [("position", "ascending")]))
    return rows, verdict


__all__ = ["Fallback", "SplitMeta", "bucket_rows", "gather_read", "read_split_step"]
