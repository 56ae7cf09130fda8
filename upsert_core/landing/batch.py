"""What a reader hands to validation: one file's columns before typing, and row errors.

Invariants:

- Every column of a :class:`RawBatch` has exactly ``num_rows`` entries, and
  ``positions[i]`` is the 1-based row number in the file of entry ``i``; positions are
  strictly increasing.
- A row that could not be parsed at all (a malformed JSON line, a CSV row with the
  wrong number of fields) is not in the columns; it is in ``errors`` with its row
  number, so every row of the file is accounted for exactly once.
- ``kind`` says how to interpret the values: ``typed`` columns are Arrow arrays whose
  Arrow type is the file's column type (Parquet); ``text`` columns are Arrow string
  arrays whose values still have to be parsed (CSV); ``json`` columns are lists of the
  Python values ``json.loads`` produced (JSON Lines). ``column_kinds`` overrides
  ``kind`` for single columns (a Debezium event's values of a logical type arrive as
  ``typed`` Arrow arrays among ``json`` columns; ``landing.debezium``).
- ``missing`` (``--missing keep`` only; ``landing.missing``): per column, the rows that
  leave it out (a JSON object without the field), or whose placeholder a reader already
  made null; such an entry is null in ``columns``. A column absent from ``columns`` is
  left out by every row. Empty when nothing is tracked.
- ``metadata`` is the file's own key-value metadata where its format has some (a
  Parquet footer's, e.g. the Avro schema ``parquet-avro`` writers record), else empty;
  every chunk of a file read in chunks carries the file's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa

Column: TypeAlias = pa.Array | list[object]


class SourceKind(StrEnum):
    TYPED = "typed"
    TEXT = "text"
    JSON = "json"


@dataclass(frozen=True)
class RowError:
    """A row of a batch file that is not applied, and why."""

    file: str
    row: int
    reason: str

    def to_dict(self) -> dict[str, object]:
        return {"file": self.file, "row": self.row, "reason": self.reason}


@dataclass
class RawBatch:
    """One file's rows, columns in order of first appearance, before typing."""

    file: str
    kind: SourceKind
    columns: dict[str, Column]
    positions: npt.NDArray[np.int64]
    errors: list[RowError] = field(default_factory=list)
    column_kinds: dict[str, SourceKind] = field(default_factory=dict)
    metadata: Mapping[bytes, bytes] = field(default_factory=dict)
    missing: dict[str, npt.NDArray[np.bool_]] = field(default_factory=dict)

    def kind_of(self, column: str) -> SourceKind:
        """How to interpret ``column``'s values (``column_kinds``, else ``kind``)."""
        return self.column_kinds.get(column, self.kind)

    @property
    def num_rows(self) -> int:
        return int(len(self.positions))

    @property
    def names(self) -> list[str]:
        return list(self.columns)


def is_utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (no lone surrogates: bytes that were not UTF-8,
    decoded with ``surrogateescape``, or an escaped lone surrogate in JSON)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
