"""Verify what a typed part's footer promises (``persist.write.parts``), since reads trust it.

The typed snapshot (``persist.read.typed_read``) reads a part's value columns instead of
decoding its ``row``, treats differently bucket-labelled parts as sharing no key, and
reads a lone part whose footer says ``consolidated`` without consolidating it. A writer
bug in any of these would silently give wrong snapshots, so the checks verify, for each
part (:func:`verify_typed_parts`; the full check ``verify.compare_state`` on every part
of the shard, the batch check ``verify.check_new_batch`` on the parts a run committed):

- bucket label ``b/N``: ``N`` is the shard's bucket count (``ingest.buckets``) and every
  key lies in bucket ``b`` (``persist.write.buckets.bucket_of_keys``);
- value columns (``v:<column>``): each names a column of the shard's source schema, once,
  with its type ``ARROW_TYPES[type]``; row for row, its values equal those
  ``landing.rows.decode_rows_to_table`` decodes from ``row`` with the shard's schema
  (nulls in the same rows; floats compared bit for bit, so canonical NaNs are equal and
  ``-0.0`` differs from ``0.0``); and every schema column the part does NOT store is
  null in every decoded row (a typed read gives null for it). Schemas only append
  columns, so the current schema decodes a row of any age the way its writer did;
- ``consolidated``: what ``parts.is_consolidated`` computes from a sorted part (no two
  rows share ``(key, row)``, no ``diff`` is 0) over the whole part, across row-group
  boundaries, together with the ``(key, row)`` order it assumes: ``(key, row)``
  strictly increases from row to row, so an unsorted part cannot hide a duplicate.

A part with none of these (a plain part: from ``Shard.append``, an older release, or a
compaction run merged plain) is not read. A typed part of a shard without ingest options
cannot be verified and is a problem. Each problem names the shard, the part (blob key,
or the batch of an inline part) and what is wrong, with at most :data:`MAX_EXAMPLES`
example keys (hex).

Cost: one pass per typed part, one row group at a time (memory bounded by a row group,
never a part), reading only the columns the part's claims need; ``row`` is decoded once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from upsert_core.errors import CodecError, CorruptData
from upsert_core.ingest.buckets import bucket_of_keys
from upsert_core.ingest.shard_config import ShardOptions
from upsert_core.landing import ARROW_TYPES, decode_rows_to_table
from upsert_core.persist.location import Blob
from upsert_core.persist.state.state import HollowBatch, InlinePart, Part
from upsert_core.persist.write.parts import KEY_BYTES, VALUE_PREFIX, OpenPart

MAX_EXAMPLES = 5
"""Example keys listed per problem."""

BoolArray = npt.NDArray[np.bool_]


@dataclass
class TypedVerification:
    """The outcome: ``problems`` is empty iff every typed part keeps its promises."""

    problems: list[str] = field(default_factory=list)
    parts: int = 0
    """Parts looked at (non-empty ones)."""
    typed_parts: int = 0
    """Parts with a bucket label, value columns or a consolidated flag, verified."""


@dataclass
class _Bad:
    """Rows found to break one promise, counted over the row groups, with examples."""

    count: int = 0
    keys: list[str] = field(default_factory=list)

    def add(self, mask: BoolArray, keys: pa.ChunkedArray | pa.Array | None) -> None:
        rows = np.flatnonzero(mask)
        self.count += len(rows)
        room = MAX_EXAMPLES - len(self.keys)
        if keys is not None and room > 0 and len(rows):
            picked = keys.take(pa.array(rows[:room], pa.int64())).to_pylist()
            self.keys.extend(k.hex() for k in picked)

    def text(self, what: str) -> str:
        """``"<count> row(s) <what> (e.g. keys ...)"``."""
        shown = f" (e.g. keys {', '.join(self.keys)})" if self.keys else ""
        return f"{self.count} row(s) {what}{shown}"


def _mask(array: pa.Array | pa.ChunkedArray) -> BoolArray:
    """A boolean Arrow array (no nulls) as numpy."""
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=bool)


def _differing(stored: pa.Array, decoded: pa.Array) -> BoolArray:
    """Rows where ``stored`` and ``decoded`` (same type) differ: in nullness, or in value
    (floats by their bits, so equal NaNs are equal and ``-0.0`` is not ``0.0``)."""
    if pa.types.is_float64(stored.type):
        stored, decoded = stored.view(pa.int64()), decoded.view(pa.int64())
    equal = pc.fill_null(pc.equal(stored, decoded), False)
    both_null = pc.and_(stored.is_null(), decoded.is_null())
    return ~_mask(pc.or_(equal, both_null))


def _strictly_increasing(keys: pa.Array, rows: pa.Array) -> BoolArray:
    """For each adjacent pair ``(i-1, i)``: whether ``(key, row)`` strictly increases."""
    n = len(keys)
    k1, k0, r1, r0 = keys.slice(1), keys.slice(0, n - 1), rows.slice(1), rows.slice(0, n - 1)
    key_gt, key_eq = _mask(pc.greater(k1, k0)), _mask(pc.equal(k1, k0))
    return key_gt | (key_eq & _mask(pc.greater(r1, r0)))


class _PartCheck:
    """One typed part's promises, verified row group by row group."""

    def __init__(self, opened: OpenPart, where: str, options: ShardOptions | None) -> None:
        self.opened, self.where, self.options = opened, where, options
        self.problems: list[str] = []
        layout = opened.layout
        self.bucket = layout.bucket
        self.consolidated = layout.consolidated
        self.compare: list[tuple[str, pa.DataType]] = []
        """Value columns to compare with the decoded rows: (column, type)."""
        self.absent: list[str] = []
        """Schema columns the part does not store (their decoded values must be null)."""
        self.bad_values: dict[str, _Bad] = {}
        self.bad_buckets = _Bad()
        self.bad_lengths = 0
        self.bad_order = _Bad()
        self.zero_diffs = _Bad()
        self.decode_error: str | None = None
        self._previous: pa.Table | None = None
        if self.bucket is not None:
            self._check_label()
        if layout.values:
            self._check_value_columns()

    @property
    def typed(self) -> bool:
        layout = self.opened.layout
        return bool(layout.values) or layout.bucket is not None or layout.consolidated

    def _problem(self, text: str) -> None:
        self.problems.append(f"{self.where}: {text}")

    def _check_label(self) -> None:
        assert self.bucket is not None
        b, n = self.bucket
        if self.options is None:
            self._problem(f"is labelled bucket {b}/{n}, but the shard has no ingest options"
                          " (no bucket count) to verify it against")
            self.bucket = None
        elif n != self.options.buckets:
            self._problem(f"is labelled bucket {b}/{n}, but the shard has"
                          f" {self.options.buckets} buckets")
            self.bucket = None  # its keys are not checked against a foreign map

    def _check_value_columns(self) -> None:
        if self.options is None:
            self._problem("has value columns, but the shard has no ingest options (no"
                          " schema) to verify them against")
            return
        schema = self.options.schema
        types = {name: ARROW_TYPES[typ] for name, typ in schema.columns}
        seen: set[str] = set()
        for value in self.opened.layout.values:
            name = value.name
            if name in seen:
                self._problem(f"has value column {name!r} more than once")
                continue
            seen.add(name)
            expected = types.get(name)
            if expected is None:
                self._problem(f"has value column {name!r}, which is not a column of the"
                              f" shard's schema {list(schema.names)}")
            elif value.type != expected:
                self._problem(f"value column {name!r} is {value.type}, the shard's schema"
                              f" says {expected}")
            else:
                self.compare.append((name, expected))
        self.absent = [name for name in schema.names if name not in seen]

    def columns(self) -> list[str]:
        """The stored columns the remaining checks need."""
        needs_values = bool(self.compare or self.absent)
        wanted = []
        if self.bucket is not None or self.consolidated or needs_values:
            wanted.append("key")  # also names example keys
        if needs_values or self.consolidated:
            wanted.append("row")
        if self.consolidated:
            wanted.append("diff")
        wanted += [VALUE_PREFIX + name for name, _ in self.compare]
        return wanted

    def group(self, table: pa.Table) -> None:
        keys = table.column("key") if "key" in table.column_names else None
        if keys is not None and self.bucket is not None:
            self._group_buckets(keys)
        if self.compare or self.absent:
            self._group_values(table, keys)
        if self.consolidated:
            self._group_consolidated(table)

    def _group_buckets(self, keys: pa.ChunkedArray) -> None:
        assert self.bucket is not None
        if not len(keys):
            return
        lengths = pc.binary_length(keys)
        wrong = _mask(pc.not_equal(lengths, KEY_BYTES))
        if wrong.any():
            self.bad_lengths += int(wrong.sum())
            keys = keys.filter(pa.array(~wrong))
        b, n = self.bucket
        self.bad_buckets.add(bucket_of_keys(keys, n) != b, keys)

    def _group_values(self, table: pa.Table, keys: pa.ChunkedArray | None) -> None:
        if self.decode_error is not None or self.options is None or not table.num_rows:
            return
        try:
            decoded = decode_rows_to_table(self.options.schema, table.column("row"))
        except CodecError as exc:
            self.decode_error = str(exc)
            return
        for name, _ in self.compare:
            stored = table.column(VALUE_PREFIX + name).combine_chunks()
            differing = _differing(stored, decoded.column(name).combine_chunks())
            if differing.any():
                self.bad_values.setdefault(name, _Bad()).add(differing, keys)
        for name in self.absent:
            present = ~_mask(decoded.column(name).is_null())
            if present.any():
                self.bad_values.setdefault(name, _Bad()).add(present, keys)

    def _group_consolidated(self, table: pa.Table) -> None:
        # The previous group's last row leads this group's window, so the boundary
        # between the two is checked too (and that row is not counted twice).
        window = table.select(["key", "row", "diff"])
        carried = self._previous is not None and window.num_rows > 0
        if carried:
            window = pa.concat_tables([self._previous, window])
        if not window.num_rows:
            return
        self._previous = window.slice(window.num_rows - 1)
        keys = window.column("key").combine_chunks()
        zero = _mask(pc.equal(window.column("diff"), 0))
        if carried:
            zero[0] = False
        self.zero_diffs.add(zero, keys)
        if window.num_rows > 1:
            rows = window.column("row").combine_chunks()
            order = ~_strictly_increasing(keys, rows)
            self.bad_order.add(np.concatenate([[False], order]), keys)

    def finish(self) -> list[str]:
        if self.bad_lengths:
            self._problem(f"is labelled bucket {self.bucket_text}, but {self.bad_lengths}"
                          f" key(s) are not {KEY_BYTES} bytes")
        if self.bad_buckets.count:
            self._problem(f"is labelled bucket {self.bucket_text}, but"
                          f" {self.bad_buckets.text('have keys of other buckets')}")
        if self.decode_error is not None:
            self._problem(f"has value columns, but its rows do not decode with the shard's"
                          f" schema: {self.decode_error}")
        for name, bad in self.bad_values.items():
            if name in self.absent:
                self._problem(f"has no value column {name!r} (a typed read gives null), but"
                              f" {bad.text('hold a value for it')}")
            else:
                self._problem(f"value column {name!r} differs from the decoded row:"
                              f" {bad.text('differ')}")
        if self.bad_order.count:
            self._problem("says consolidated, but " + self.bad_order.text(
                "repeat the previous row's (key, row) or sort before it"))
        if self.zero_diffs.count:
            self._problem(f"says consolidated, but {self.zero_diffs.text('have diff 0')}")
        return self.problems

    @property
    def bucket_text(self) -> str:
        label = self.opened.layout.bucket
        return "?" if label is None else f"{label[0]}/{label[1]}"


def verify_typed_part(
    blob: Blob, shard_id: str, part: Part, options: ShardOptions | None, *,
    where: str | None = None, skip_unopenable: bool = False,
) -> tuple[bool, list[str]]:
    """Verify one part (module docstring): ``(whether it is typed, problems)``.

    ``where`` names the part in problems (default: ``OpenPart.where``). A part that does
    not open (missing, not Parquet, wrong schema or row count) is a problem, or skipped
    with ``skip_unopenable`` (when the caller's storage check reports it already); one
    whose row groups fail to decode is always a problem.
    """
    try:
        opened = OpenPart(blob, part, shard=shard_id)
    except CorruptData as exc:
        return False, [] if skip_unopenable else [f"{where or shard_id}: cannot be verified: {exc}"]
    try:
        check = _PartCheck(opened, where or opened.where, options)
        if not check.typed:
            return False, []
        columns = check.columns()
        try:
            if columns:
                for index in range(opened.num_row_groups):
                    check.group(opened.read_row_group(index, columns=columns))
        except CorruptData as exc:
            return True, [*check.problems, f"{check.where}: cannot be verified: {exc}"]
        return True, check.finish()
    finally:
        opened.close()


def _name(shard_id: str, batch: HollowBatch, part: Part) -> str:
    if isinstance(part, InlinePart):
        return f"shard {shard_id}: inline part of batch [{batch.lower}, {batch.upper})"
    return f"shard {shard_id}: part {part.key}"


def verify_typed_parts(
    blob: Blob, shard_id: str, batches: Iterable[HollowBatch], options: ShardOptions | None,
    *, skip_unopenable: bool = False,
) -> TypedVerification:
    """Verify every non-empty part of ``batches``, one at a time (module docstring)."""
    result = TypedVerification()
    for batch in batches:
        for part in batch.parts:
            if not part.num_updates:
                continue
            result.parts += 1
            typed, problems = verify_typed_part(
                blob, shard_id, part, options, where=_name(shard_id, batch, part),
                skip_unopenable=skip_unopenable,
            )
            result.typed_parts += typed
            result.problems.extend(problems)
    return result
