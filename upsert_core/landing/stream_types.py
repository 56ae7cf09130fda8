"""The column types a whole file would get, gathered from its chunks.

Validating a whole JSON Lines or CSV file types each new column from ALL its values
(``convert.file_type``): ints then a float make a float column, a column null in the
first lines is typed by its first value, a key column the shard already types keeps its
type if ANY value converts. A file validated chunk by chunk types a new column from the
first chunk that has a value for it, so its types may differ. :class:`StreamTypes`
gathers, chunk by chunk, exactly what ``file_type`` looks at (whether a value is
present, whether one converts to the key/order column's known type; for JSON
:class:`~upsert_core.landing.convert.JsonKinds`, for CSV text whether every value
converts to each candidate type, ``convert.text_fits``) and gives the schema the whole
file would leave (:meth:`StreamTypes.schema`).

Invariants:

- Fed each chunk's prepared columns (``validate_batch``: after the UTF-8 split and the
  ``--missing keep`` placeholders), in file order, :meth:`StreamTypes.schema` is what
  validating the whole file evolves the schema to, or raises where it would raise (a
  file-level problem; the caller reads the file whole for the exact message).
- :meth:`StreamTypes.align` gives each chunk the columns the whole read gives its rows
  (those of the chunks before, null and left out), in the whole read's order.
- Only JSON and text (CSV) columns are followed: a column of another kind, or one
  whose kind changes between chunks, makes :attr:`exact` False.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from upsert_core.landing.batch import Column, RawBatch, SourceKind
from upsert_core.landing.convert import (
    TEXT_CANDIDATES,
    JsonKinds,
    convert,
    infer_json,
    infer_text,
    text_fits,
)
from upsert_core.landing.schema import LogicalType, SourceSchema


@dataclass
class _Seen:
    kind: SourceKind | None = None  # of the first chunk that had the column
    present: bool = False
    converts: bool = False  # a key/order value converts to the type the shard gives it
    kinds: JsonKinds = field(default_factory=JsonKinds)
    fits: list[bool] = field(default_factory=lambda: [True] * len(TEXT_CANDIDATES))
    """Text: per candidate type, whether every value so far converts to it."""


class StreamNotExact(Exception):
    """Validating a file chunk by chunk did not give what validating it whole gives (a
    chunk typed a column otherwise, or raised a file-level problem): the caller discards
    what it made of the chunks and reads the file whole. Deliberately not an
    ``UpsertPlatformError``: it is no outcome, only a change of path."""


class StreamTypes:
    """What ``file_type`` would see of each column of one file (module docstring)."""

    def __init__(self, start: SourceSchema, file: str) -> None:
        self.start = start
        self.file = file
        self.exact = True
        self._seen: dict[str, _Seen] = {}
        self._order: dict[str, None] = {}

    def align(self, raw: RawBatch) -> RawBatch:
        """``raw`` (the next chunk) with the columns of the chunks before that it lacks,
        null and left out in each row, and its columns in the whole file's order of
        first appearance: what the whole read holds for these rows (a column first met
        in a later chunk is missing still; :meth:`schema` then differs if it matters)."""
        order = self._order
        for name in raw.columns:
            order.setdefault(name, None)
        n = raw.num_rows
        if not n or list(raw.columns) == list(order):
            return raw
        columns: dict[str, Column] = {}
        for name in order:
            col = raw.columns.get(name)
            columns[name] = [None] * n if col is None else col
        missing = raw.missing
        if missing:
            missing = {name: missing.get(name, np.ones(n, np.bool_)) for name in order}
        return replace(raw, columns=columns, missing=missing)

    def add(self, name: str, column: Column, kind: SourceKind) -> None:
        """The next chunk's values of column ``name`` (in the chunk's column order)."""
        seen = self._seen.setdefault(name, _Seen())
        text = kind is SourceKind.TEXT and isinstance(column, pa.Array)
        json = kind is SourceKind.JSON and isinstance(column, list)
        if not (text or json) or seen.kind not in (None, kind):
            self.exact = False
            return
        seen.kind = kind
        if not (pc.any(pc.is_valid(column)).as_py() if text
                else any(v is not None for v in column)):
            return
        seen.present = True
        current, role = self.start.type_of(name), self.start.role(name)
        if current is not None and role != "value" and not seen.converts:
            _, bad = convert(column, kind, current)
            seen.converts = bool(len(column) - _null_count(column) - int(bad.sum()))
        settled = current is not None and (role == "value" or seen.converts)
        # Only what :meth:`schema` reads is gathered: a value column the shard types
        # keeps that type whatever its values, and a key or order column keeps it once
        # one value converts; their kinds or candidates (a pass over every value) are
        # not needed then.
        if settled:
            return
        if json:
            seen.kinds = seen.kinds.merged(JsonKinds.of(column))
        else:
            # Only a column the whole file may still infer needs the candidates; one
            # already ruled out stays out (the whole file's answer is their AND).
            todo = [t for t, ok in zip(TEXT_CANDIDATES, seen.fits, strict=True) if ok]
            found = dict(zip(todo, text_fits(column, todo), strict=True)) if todo else {}
            seen.fits = [ok and found.get(t, False)
                         for t, ok in zip(TEXT_CANDIDATES, seen.fits, strict=True)]

    def schema(self) -> SourceSchema:
        """The schema the whole file leaves; raises ``IngestError`` where it would."""
        start = self.start
        types: list[tuple[str, LogicalType | None]] = []
        for name, seen in self._seen.items():
            current, role = start.type_of(name), start.role(name)
            if not seen.present or (current is not None and (role == "value" or seen.converts)):
                types.append((name, current))
            elif seen.kind is SourceKind.TEXT:
                types.append((name, infer_text(seen.fits)))
            else:
                types.append((name, infer_json(seen.kinds, start.label(name), self.file, role)))
        return start.evolve(types, self.file)


def _null_count(column: Column) -> int:
    if isinstance(column, list):
        return sum(v is None for v in column)
    return int(column.null_count)


__all__ = ["StreamNotExact", "StreamTypes"]
