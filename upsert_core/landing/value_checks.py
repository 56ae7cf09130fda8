"""Value checks declared per source (ranges, allowed values, regexes, not-null), run
with pandera's Polars backend on each batch as it is validated.

The contract's own row checks (:mod:`~upsert_core.landing.validate`) are about whether
a value *can* be stored: they are the conversion itself. Value checks are about whether
a stored value is *acceptable*: ``amount`` between 0 and 1,000,000, ``status`` one of a
few words. That is what pandera is built for, so these checks are pandera ``Check``\\ s
(``in_range``, ``ge``, ``le``, ``isin``, ``str_matches``, ``nullable=False``) in a
``pandera.polars.DataFrameSchema``, validated lazily on the batch's converted columns
(``pl.from_arrow``: zero-copy), and each failure case's row index mapped back to the
row's number in its file.

Declared as a mapping column -> checks (``sources.yaml``'s ``checks:``, or
:func:`parse_value_checks` for library users)::

    amount: {min: 0, max: 1000000}     # in_range(0, 1000000); min or max alone: ge / le
    status: {isin: [new, paid, shipped]}
    email: {regex: '^[^@]+@[^@]+$'}    # matched from the start (pandera's str_matches)
    v: {not_null: true}

Invariants:

- A row failing a value check is one :class:`RowError` (``file``, 1-based row number,
  reason ``value check <column> <check> failed``; several failures of one row are one
  error with the reasons joined by ``; ``) and is not applied. Only rows that passed
  the contract's own checks are value-checked, so no row is reported twice; deletes
  (delete marker true) are not value-checked either: their values are never stored,
  and a tombstone usually carries nulls.
- No checks: nothing is computed and pandera is never imported (it costs ~0.9 s to
  import). The pandera schema is built once per distinct tuple of checks per process
  (cached), so a Spark worker builds it once, not once per file.
- Checks are per request (``IngestRequest.value_checks``), not stored in the shard:
  they filter what goes in, they do not shape the shard's contents the way key and
  order columns do, and a tightened range applies to files ingested from then on.
- Nulls pass every check but ``not_null`` (pandera's ``nullable=True`` otherwise). A
  column the shard knows but this file leaves out reads as null (CONTRACT.md), so it
  passes all checks but ``not_null``, which fails every row of the file.
- With ``--missing keep`` (``landing.missing``) a value a row leaves out (absent, or the
  placeholder) is not a value the file brings: the key keeps its earlier one, which
  was checked when it was written, so ``not_null`` does not judge it (null reaches the
  shard there only when the key has no earlier row: the check cannot see the state).
- A check on a column neither the shard's schema nor the file has, on the delete
  marker, or whose kind does not fit the column's type (a range on a string column, a
  regex on an integer column, ``isin`` values of another type) is a file-level
  :class:`ConfigError` ``"<file>: value check ...: ..."``: the ingest stops at that file
  with nothing of it applied, so a typo in a column name is loud, not a silent no-op.
- Malformed declarations (unknown check kinds, a min above its max, a regex that does
  not compile, non-numeric bounds, an empty ``isin``) are a :class:`ConfigError` when
  the :class:`ValueCheck` is made, before anything is read.
"""

from __future__ import annotations

import math
import os
import re
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from upsert_core.errors import ConfigError
from upsert_core.landing.schema import LogicalType, SourceSchema

Scalar = str | int | float | bool


class CheckKind(StrEnum):
    IN_RANGE = "in_range"  # min and/or max, inclusive
    ISIN = "isin"
    REGEX = "regex"
    NOT_NULL = "not_null"


SPEC_KEYS = ("min", "max", "isin", "regex", "not_null")
"""The keys a column's entry may have in a declaration."""

_NUMERIC = (LogicalType.INT64, LogicalType.FLOAT64)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class ValueCheck:
    """One check on one column; hashable and picklable (it travels in ``FileTask``)."""

    column: str
    kind: CheckKind
    min: int | float | None = None
    max: int | float | None = None
    values: tuple[Scalar, ...] = ()
    pattern: str | None = None

    def __post_init__(self) -> None:
        what = f"value check on column {self.column!r}"
        if not isinstance(self.column, str) or not self.column:
            raise ConfigError("a value check needs a column name")
        object.__setattr__(self, "kind", CheckKind(self.kind))
        if self.kind is CheckKind.IN_RANGE:
            for bound in (self.min, self.max):
                if bound is not None and (not _is_number(bound) or not math.isfinite(bound)):
                    raise ConfigError(f"{what}: min and max must be finite numbers, got {bound!r}")
            if self.min is None and self.max is None:
                raise ConfigError(f"{what}: a range needs min or max")
            if self.min is not None and self.max is not None and self.min > self.max:
                raise ConfigError(f"{what}: min {self.min} is greater than max {self.max}")
        elif self.kind is CheckKind.ISIN:
            if not self.values or not all(isinstance(v, str | int | float) for v in self.values):
                raise ConfigError(f"{what}: isin needs a non-empty list of strings or numbers")
        elif self.kind is CheckKind.REGEX:
            if not isinstance(self.pattern, str):
                raise ConfigError(f"{what}: regex must be a string")
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ConfigError(
                    f"{what}: regex {self.pattern!r} does not compile: {exc}"
                ) from exc

    def describe(self) -> str:
        """The check as it appears in error reasons, e.g. ``in_range(0, 1000)``."""
        if self.kind is CheckKind.IN_RANGE:
            if self.min is not None and self.max is not None:
                return f"in_range({self.min}, {self.max})"
            return f"min({self.min})" if self.min is not None else f"max({self.max})"
        if self.kind is CheckKind.ISIN:
            return f"isin({list(self.values)!r})"
        if self.kind is CheckKind.REGEX:
            return f"regex({self.pattern!r})"
        return "not_null"

    def reason(self) -> str:
        return f"value check {self.column} {self.describe()} failed"

    def fits(self, typ: LogicalType) -> bool:
        """Whether the check can apply to a column of type ``typ``."""
        if self.kind is CheckKind.NOT_NULL:
            return True
        if self.kind is CheckKind.IN_RANGE:
            return typ in _NUMERIC
        if self.kind is CheckKind.REGEX:
            return typ is LogicalType.STRING
        if typ is LogicalType.STRING:
            return all(isinstance(v, str) for v in self.values)
        if typ is LogicalType.INT64:
            return all(isinstance(v, int) and not isinstance(v, bool) for v in self.values)
        if typ is LogicalType.FLOAT64:
            return all(_is_number(v) for v in self.values)
        return False


def parse_value_checks(spec: object, where: str = "checks") -> tuple[ValueCheck, ...]:
    """The checks a ``column -> {min, max, isin, regex, not_null}`` mapping declares, in
    declaration order; a :class:`ConfigError` naming ``where`` and the column otherwise."""
    if spec is None:
        return ()
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: checks must be a mapping of column -> checks")
    out: list[ValueCheck] = []
    for column, entry in spec.items():
        at = f"{where}: column {column!r}"
        if not isinstance(column, str) or not column:
            raise ConfigError(f"{at}: a column name must be a non-empty string")
        if not isinstance(entry, Mapping) or not entry:
            raise ConfigError(f"{at}: expected a mapping with some of {list(SPEC_KEYS)}")
        unknown = sorted(str(k) for k in entry if k not in SPEC_KEYS)
        if unknown:
            raise ConfigError(
                f"{at}: unknown check kind(s) {unknown} (known: {list(SPEC_KEYS)})"
            )
        try:
            if "min" in entry or "max" in entry:
                out.append(ValueCheck(column, CheckKind.IN_RANGE, min=entry.get("min"),
                                      max=entry.get("max")))
            if "isin" in entry:
                values = entry["isin"]
                if not isinstance(values, list | tuple):
                    raise ConfigError(f"value check on column {column!r}: isin must be a list")
                out.append(ValueCheck(column, CheckKind.ISIN, values=tuple(values)))
            if "regex" in entry:
                out.append(ValueCheck(column, CheckKind.REGEX, pattern=entry["regex"]))
            if "not_null" in entry:
                flag = entry["not_null"]
                if not isinstance(flag, bool):
                    raise ConfigError(
                        f"value check on column {column!r}: not_null must be true or false"
                    )
                if flag:
                    out.append(ValueCheck(column, CheckKind.NOT_NULL))
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from exc
    return tuple(out)


# --- running them -------------------------------------------------------------------------

_IMPORT_LOCK = threading.Lock()
_SPARK_ENV = ("SPARK_LOCAL_IP", "PYARROW_IGNORE_TIMEZONE")


def _import_pandera() -> tuple[Any, Any]:
    """``(pandera.polars, polars)``, imported without pandera's pyspark side effects.

    SUBTLE: ``import pandera`` (any submodule) runs ``external_config``, which, when
    pyspark is installed, sets ``SPARK_LOCAL_IP=127.0.0.1`` and
    ``PYARROW_IGNORE_TIMEZONE=1`` in ``os.environ`` and imports ``pyspark.pandas``
    (~0.3 s). A driver that later starts a Spark session for a multi-host cluster must
    not inherit a loopback ``SPARK_LOCAL_IP``, and upsert_core never imports pyspark.
    So the first import hides pyspark (a ``None`` entry in ``sys.modules`` makes the
    import fail, which pandera expects and ignores) and restores both variables.
    Only the Polars API is used, which needs neither.
    """
    with _IMPORT_LOCK:
        if "pandera.polars" in sys.modules:
            import pandera.polars as pandera_polars
            import polars

            return pandera_polars, polars
        saved = {k: os.environ.get(k) for k in _SPARK_ENV}
        hidden = [m for m in ("pyspark", "pyspark.pandas") if m not in sys.modules]
        for m in hidden:
            sys.modules[m] = None  # type: ignore[assignment]
        try:
            import pandera.polars as pandera_polars
            import polars
        finally:
            for m in hidden:
                if sys.modules.get(m, 0) is None:
                    del sys.modules[m]
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        return pandera_polars, polars


@lru_cache(maxsize=64)
def _pandera_schema(checks: tuple[ValueCheck, ...]) -> Any:
    """The pandera schema of ``checks`` (no dtypes: the contract already typed them)."""
    pp, _ = _import_pandera()
    by_column: dict[str, list[ValueCheck]] = {}
    for c in checks:
        by_column.setdefault(c.column, []).append(c)
    columns = {}
    for name, column_checks in by_column.items():
        pandera_checks = []
        for c in column_checks:
            if c.kind is CheckKind.IN_RANGE:
                # SUBTLE: always a two-sided range (an open side at infinity), never
                # ``ge``/``le`` alone: Polars orders NaN above every number, so NaN
                # passed ``ge(min)`` and failed ``le(max)``; NaN fails any range here.
                low = -math.inf if c.min is None else c.min
                high = math.inf if c.max is None else c.max
                check = pp.Check.in_range(low, high)
            elif c.kind is CheckKind.ISIN:
                check = pp.Check.isin(list(c.values))
            elif c.kind is CheckKind.REGEX:
                check = pp.Check.str_matches(c.pattern)
            else:
                continue  # not_null is the column's nullable=False
            pandera_checks.append((check, c))
        not_null = next((c for c in column_checks if c.kind is CheckKind.NOT_NULL), None)
        columns[name] = (
            pp.Column(None, [p for p, _ in pandera_checks], nullable=not_null is None),
            [c for _, c in pandera_checks],
            not_null,
        )
    schema = pp.DataFrameSchema({n: col for n, (col, _, _) in columns.items()}, strict=False)
    # check_number (pandera's index in a column's checks) -> our check, per column
    meta = {n: (ours, not_null) for n, (_, ours, not_null) in columns.items()}
    return schema, meta


def value_check_problems(
    file: str,
    schema: SourceSchema,
    arrays: Mapping[str, pa.Array],
    file_columns: Sequence[str],
    n: int,
    skip: npt.NDArray[np.bool_],
    checks: tuple[ValueCheck, ...],
    left_out: Mapping[str, npt.NDArray[np.bool_]] | None = None,
) -> dict[int, list[str]]:
    """Row index -> reasons of the rows failing ``checks``, among rows not in ``skip``.

    ``arrays`` are the batch's converted columns (``validate_batch``), each ``n`` long;
    ``file_columns`` the columns the file itself has; ``left_out`` (``--missing keep``)
    per column the rows that leave it out, which ``not_null`` does not judge. See the
    module docstring."""
    if not checks or n == 0 or bool(skip.all()):
        return {}
    names = sorted({c.column for c in checks})
    table: dict[str, pa.Array] = {}
    for c in checks:
        if c.column == schema.deleted:
            raise ConfigError(
                f"{file}: value check {c.column} {c.describe()}: {c.column!r} is the delete"
                " marker column, which cannot be value-checked"
            )
        typ = schema.type_of(c.column)
        if typ is None and c.column not in file_columns:
            known = ", ".join(schema.names) or "none"
            raise ConfigError(
                f"{file}: value check {c.column} {c.describe()}: no column {c.column!r} in"
                f" this file or the shard's schema (known columns: {known})"
            )
        if typ is not None and not c.fits(typ):
            raise ConfigError(
                f"{file}: value check {c.column} {c.describe()} does not apply to column"
                f" {c.column!r} of type {typ}"
            )
    for name in names:
        arr = arrays.get(name)
        table[name] = arr if arr is not None else pa.nulls(n)  # in the file, all null
    compiled, meta = _pandera_schema(checks)
    pp, pl = _import_pandera()
    frame = pl.from_arrow(pa.table(table))
    try:
        compiled.validate(frame, lazy=True)
    except pp.errors.SchemaErrors as exc:
        failures = exc.failure_cases
    else:
        return {}
    problems: dict[int, list[str]] = {}
    rows = failures.select("column", "check_number", "index", "check").drop_nulls("index")
    for column, number, index, check in rows.iter_rows():
        if skip[index]:
            continue
        ours, not_null = meta[column]
        if number is None or check == "not_nullable":
            kept = None if left_out is None else left_out.get(column)
            if kept is not None and kept[index]:
                continue  # --missing keep: the key's earlier value stays, not this null
            found = not_null
        else:
            found = ours[number] if 0 <= number < len(ours) else None
        reason = f"value check {column} {check} failed" if found is None else found.reason()
        problems.setdefault(int(index), []).append(reason)
    return problems


REASON_PREFIX = "value check "
"""Every value-check reason starts with this (and no reason of the contract's does)."""


def failed_checks(reason: str) -> list[str]:
    """The value checks an error reason names (``"amount in_range(0, 1000)"``, ...);
    empty for a reason of the contract's own checks."""
    return [
        part.removeprefix(REASON_PREFIX).removesuffix(" failed")
        for part in reason.split("; ")
        if part.startswith(REASON_PREFIX) and part.endswith(" failed")
    ]
