"""Typing one column: infer a new column's type, convert values to a column's type.

Invariants:

- :func:`convert` returns an Arrow array of exactly ``ARROW_TYPES[target]`` with one
  entry per input entry, and a boolean mask ``bad`` of the entries that were non-null
  but could not be converted (those entries are null in the array). A null input is
  never bad. Nothing is dropped or reordered.
- Fast paths are vectorised (Arrow casts); whenever a whole-array cast fails, a
  per-value path decides each value, so the result never depends on which path ran.
- JSON values convert by their JSON type: an integer fits ``int64`` if it is in range
  and ``float64`` if a float equals it; a number fits ``float64``; a boolean is never a
  number (nor a string, timestamp or date), whatever the fast path Arrow offers; strings fit
  ``string``, and ``timestamp``/``date`` when they are ISO-8601; booleans fit ``bool``.
- Text (CSV) values are parsed: decimal integers, floats, ``true``/``false`` in any
  case, ISO dates and timestamps; any text fits ``string`` and ``binary`` (UTF-8).
- Timestamps are microseconds in UTC; a timestamp without an offset is taken as UTC.
- Exact or bad, never silently changed: a value converts only if the column's type
  holds it exactly (an integer into ``float64`` only if the float equals it; a
  timestamp only if it is a whole number of microseconds inside Python's calendar; a
  date64 only if it is a whole day; a decimal only if the float reads back as the same
  decimal at its scale; an ISO-8601 text with more than six fraction digits only if
  the extra digits are zeros). No cast here runs with ``safe=False`` unless the
  entries it could change are already known to be bad.
- Strings are valid UTF-8. Arrow does not check the strings of a Parquet file (or of
  a CSV read without ``check_utf8``): :func:`split_invalid_utf8` finds the values that
  are not and nulls them before any conversion, so a shard never holds a string it
  cannot decode; the caller reports those rows.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeAlias, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from upsert_core.errors import IngestError
from upsert_core.landing.batch import Column, SourceKind, is_utf8
from upsert_core.landing.schema import ARROW_TYPES, LogicalType, logical_type_of

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
_INT_TEXT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_FLOAT_TEXT = re.compile(
    r"[+-]?(([0-9]+\.?[0-9]*|\.[0-9]+)(e[+-]?[0-9]+)?|inf|infinity|nan)",
    re.ASCII | re.IGNORECASE,
)
_TRUE_FALSE = {"true": True, "false": False}

BoolMask = npt.NDArray[np.bool_]


Conversion: TypeAlias = tuple[pa.Array, BoolMask]


def file_type(
    column: Column, kind: SourceKind, name: str, file: str, current: LogicalType | None, role: str
) -> tuple[LogicalType | None, Conversion | None]:
    """The type this file gives the column (None: all null, no type information).

    For JSON and text, a value column the schema already types keeps that type: values
    that do not convert are row errors (a boolean in a float column, a string in an
    integer column), even when none converts. A key or order column keeps its type as
    long as at least one of its values converts; when none does, the file's own inferred
    type is returned so schema evolution reports the change (a file whose keys are all of
    another type is a wrong file, not a few bad rows). The conversion is returned too, so
    it is not done twice.
    """
    if kind is SourceKind.TYPED:
        try:
            return logical_type_of(cast(pa.Array, column).type), None
        except TypeError as exc:
            raise IngestError(f"{file}: column {name!r}: {exc}") from exc
    values = _values(column)
    non_null = _non_null(values)
    if not non_null.any():
        return current, None
    if current is not None:
        converted = convert(column, kind, current)
        if role == "value" or (non_null & ~converted[1]).any():
            return current, converted
        # No value converts: name the type the file has instead. If that type happens to
        # be compatible, the values are merely out of range and become row errors.
    return _infer(column, values, kind, name, file, role), None


def convert(column: Column, kind: SourceKind, target: LogicalType) -> tuple[pa.Array, BoolMask]:
    """Convert ``column`` to ``target``; see the module docstring."""
    if kind is SourceKind.TYPED:
        return _convert_typed(cast(pa.Array, column), target)
    if kind is SourceKind.TEXT:
        return _convert_text(cast(pa.Array, column), target)
    return _convert_json(cast(list[object], column), target)


def describe(column: Column, index: int) -> str:
    """A short rendering of one input value, for row-error reasons."""
    if isinstance(column, list):
        text = repr(column[index])
    else:
        try:
            text = repr(column[index].as_py())
        except (ValueError, OverflowError):  # e.g. a timestamp beyond Python's calendar
            return f"an out-of-range {column.type} value"
    return text if len(text) <= 60 else text[:57] + "..."


def split_invalid_utf8(column: Column) -> tuple[Column, BoolMask | None]:
    """``(column, None)`` when every string of ``column`` is valid UTF-8 (or it holds no
    strings); else ``(cleaned, bad)``: the column with those strings set to null, and
    the mask of them. JSON columns are Python strings, already decoded."""
    if isinstance(column, list):
        return column, None
    arr = column
    if pa.types.is_dictionary(arr.type):
        if not _is_string_type(arr.type.value_type) or _valid_utf8(arr.dictionary):
            return column, None
        arr = arr.dictionary_decode()
    if not _is_string_type(arr.type) or _valid_utf8(arr):
        return column, None
    as_bytes = pc.cast(pc.cast(arr, pa.large_string()), pa.large_binary())  # no UTF-8 check
    bad = np.fromiter(
        (v is not None and not _decodes(v) for v in as_bytes.to_pylist()),
        dtype=np.bool_,
        count=len(arr),
    )
    cleaned = pc.cast(_without(as_bytes, bad), pa.large_string())  # validates: all good now
    return pc.cast(cleaned, pa.string()), bad


def describe_bytes(column: Column, index: int) -> str:
    """A short rendering of one (not UTF-8) string value as its bytes."""
    arr = cast(pa.Array, column)
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    raw = pc.cast(pc.cast(arr, pa.large_string()), pa.large_binary())[index].as_py()
    text = repr(raw)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_string_type(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _valid_utf8(arr: pa.Array) -> bool:
    try:
        arr.validate(full=True)  # checks every string's UTF-8, in C++
    except pa.ArrowInvalid:
        return False
    return True


def _decodes(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# --- inference ----------------------------------------------------------------------


def _infer(
    column: Column, values: list[object], kind: SourceKind, name: str, file: str, role: str
) -> LogicalType:
    if kind is SourceKind.TEXT:
        text = cast(pa.Array, column)
        present = [v for v in values if v is not None]
        for candidate in TEXT_CANDIDATES:
            if _all_text_converts(text, present, candidate):
                return candidate
        return LogicalType.STRING
    return infer_json(JsonKinds.of(values), name, file, role)


@dataclass
class JsonKinds:
    """What JSON inference (:func:`infer_json`) needs of a column's values: their first
    scalar (not null, not an object or array) and which kinds of scalars there are. Of
    consecutive parts of a column, :meth:`merged` is that of the whole column, so a
    file read in chunks infers what the whole file would (``landing.text_chunks``)."""

    first: object = None
    scalars: bool = False
    others: bool = False  # a scalar that is no number (a bool is no number here)
    ints: bool = False
    floats: bool = False

    @classmethod
    def of(cls, values: Sequence[object]) -> JsonKinds:
        kinds = cls()
        for v in values:
            if v is None or isinstance(v, dict | list):
                continue
            if not kinds.scalars:
                kinds.first, kinds.scalars = v, True
            t = type(v)
            if t is int:
                kinds.ints = True
            elif t is float:
                kinds.floats = True
            else:
                kinds.others = True
        return kinds

    def merged(self, later: JsonKinds) -> JsonKinds:
        """These values followed by ``later``'s."""
        if not self.scalars:
            return later if later.scalars else self
        return JsonKinds(self.first, True, self.others or later.others,
                         self.ints or later.ints, self.floats or later.floats)


def infer_json(kinds: JsonKinds, name: str, file: str, role: str) -> LogicalType:
    """The type of a new JSON column from its values' :class:`JsonKinds`."""
    if not kinds.scalars:
        raise IngestError(f"{file}: column {name!r} holds JSON objects or arrays (unsupported)")
    if not kinds.others:
        return LogicalType.FLOAT64 if kinds.floats else LogicalType.INT64
    first = kinds.first
    if type(first) is bool:
        return LogicalType.BOOL
    if type(first) is str:
        if role == "order" and _parse_timestamp(first) is not None:
            return LogicalType.TIMESTAMP
        return LogicalType.STRING
    # A number first, then other kinds: the numbers set the type, the rest are row errors.
    return LogicalType.FLOAT64 if kinds.floats else LogicalType.INT64


# --- typed (Parquet) ----------------------------------------------------------------


def _convert_typed(column: pa.Array, target: LogicalType) -> tuple[pa.Array, BoolMask]:
    arr = column
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    bad = np.zeros(len(arr), dtype=np.bool_)
    if pa.types.is_null(arr.type):
        return pa.nulls(len(arr), type=ARROW_TYPES[target]), bad
    if pa.types.is_unsigned_integer(arr.type) and arr.type.bit_width == 64:
        too_big = pc.greater(arr, pa.scalar(INT64_MAX, type=pa.uint64()))
        bad = np.asarray(too_big.fill_null(False).to_numpy(zero_copy_only=False), dtype=np.bool_)
        arr = _without(arr, bad).cast(pa.int64())
    t = arr.type
    if target is LogicalType.FLOAT64 and pa.types.is_integer(t):
        result, inexact = _int_to_float(arr)
        return result, bad | inexact
    if target is LogicalType.FLOAT64 and pa.types.is_decimal(t):
        return _decimal_to_float(arr)
    if target is LogicalType.TIMESTAMP and pa.types.is_timestamp(t):
        result, bad = _timestamp_to_micros(arr)
    elif target is LogicalType.DATE and pa.types.is_date64(t):
        result, bad = _scaled(arr, 86_400_000, divide=True, out=pa.date32())
    else:
        try:
            result = pc.cast(arr, ARROW_TYPES[target])  # safe: refuses to change a value
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise IngestError(f"cannot convert {arr.type} to {target}: {exc}") from exc
    return _within_calendar(result, bad, target)


def _within_calendar(result: pa.Array, bad: BoolMask, target: LogicalType) -> Conversion:
    """``(result, bad)`` with timestamps and dates outside Python's calendar (years
    1..9999, in UTC) made bad and null: Arrow's range is wider, and such a value could
    not be decoded (``decode_row``) once stored."""
    limits = _PYTHON_RANGE.get(target)
    if limits is None:
        return result, bad
    raw = result.view(pa.int32() if target is LogicalType.DATE else pa.int64())
    out = pc.or_(pc.less(raw, limits[0]), pc.greater(raw, limits[1])).fill_null(False)
    out_np = np.asarray(out.to_numpy(zero_copy_only=False), dtype=np.bool_)
    if out_np.any():
        bad = bad | out_np
        result = pc.if_else(out, pa.scalar(None, type=result.type), result)
    return result, bad


def _without(arr: pa.Array, bad: BoolMask) -> pa.Array:
    """``arr`` with the entries ``bad`` marks set to null."""
    if not bad.any():
        return arr
    return pc.if_else(pa.array(bad), pa.scalar(None, type=arr.type), arr)


def _int_to_float(arr: pa.Array) -> Conversion:
    """Integers (int64 range) as float64; one the float cannot equal exactly is bad."""
    ints = np.asarray(arr.cast(pa.int64()).fill_null(0).to_numpy(), dtype=np.int64)
    floats = ints.astype(np.float64)
    in_range = (floats >= -(2.0**63)) & (floats < 2.0**63)
    exact = in_range & (np.where(in_range, floats, 0.0).astype(np.int64) == ints)
    bad = np.asarray(pc.is_valid(arr).to_numpy(zero_copy_only=False), dtype=np.bool_) & ~exact
    mask = bad | np.asarray(pc.is_null(arr).to_numpy(zero_copy_only=False), dtype=np.bool_)
    return pa.array(floats, type=pa.float64(), mask=mask), bad


def _decimal_to_float(arr: pa.Array) -> Conversion:
    """Decimals as the nearest float64 (parsed from their text, so correctly rounded);
    bad when that float does not read back as the same decimal at the column's scale."""
    floats = pc.cast(pc.cast(arr, pa.string()), pa.float64())
    try:
        back = pc.cast(floats, arr.type, safe=False)  # rounds to the scale
        same = pc.equal(back, arr)
        ok = np.asarray(same.fill_null(True).to_numpy(zero_copy_only=False), dtype=np.bool_)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # e.g. beyond the precision
        scale = arr.type.scale
        ok = np.fromiter(
            (
                d is None or (math.isfinite(f) and _decimal_round(f, scale) == d)
                for d, f in zip(arr.to_pylist(), floats.to_pylist(), strict=True)
            ),
            dtype=np.bool_,
            count=len(arr),
        )
    bad = ~ok
    return _without(floats, bad), bad


def _decimal_round(value: float, scale: int) -> decimal.Decimal:
    return decimal.Decimal(value).quantize(decimal.Decimal(1).scaleb(-scale))


_TO_MICROS: dict[str, tuple[int, bool]] = {
    "s": (1_000_000, False),
    "ms": (1_000, False),
    "us": (1, False),
    "ns": (1_000, True),
}


def _timestamp_to_micros(arr: pa.Array) -> Conversion:
    """Any timestamp as microseconds (UTC); a value off the microsecond grid (a
    nanosecond part) or out of range is bad instead of truncated or wrapped."""
    factor, divide = _TO_MICROS[arr.type.unit]
    return _scaled(arr, factor, divide=divide, out=ARROW_TYPES[LogicalType.TIMESTAMP])


def _scaled(arr: pa.Array, factor: int, *, divide: bool, out: pa.DataType) -> Conversion:
    """``arr``'s integer storage multiplied (or exactly divided) by ``factor``, as type
    ``out``; entries that would overflow, or not divide exactly, are bad (and null).
    The result still gets the caller's calendar range check."""
    raw = np.asarray(arr.view(pa.int64()).fill_null(0).to_numpy(), dtype=np.int64)
    valid = np.asarray(pc.is_valid(arr).to_numpy(zero_copy_only=False), dtype=np.bool_)
    if divide:
        ok = raw % factor == 0
        values = raw // factor
    else:
        limit = INT64_MAX // factor
        ok = (raw >= -limit) & (raw <= limit)
        values = np.where(ok, raw, 0) * factor
    bad = valid & ~ok
    storage = pa.int32() if pa.types.is_date32(out) else pa.int64()
    result = pa.array(values.astype(storage.to_pandas_dtype()), type=storage, mask=~valid | bad)
    return result.view(out), bad


_EPOCH_DAYS = dt.date(1970, 1, 1).toordinal()
_MIN_DAYS = dt.date.min.toordinal() - _EPOCH_DAYS
_MAX_DAYS = dt.date.max.toordinal() - _EPOCH_DAYS
_PYTHON_RANGE: dict[LogicalType, tuple[int, int]] = {
    LogicalType.DATE: (_MIN_DAYS, _MAX_DAYS),
    LogicalType.TIMESTAMP: (_MIN_DAYS * 86_400_000_000, (_MAX_DAYS + 1) * 86_400_000_000 - 1),
}


# --- text (CSV) ---------------------------------------------------------------------


def _convert_text(column: pa.Array, target: LogicalType) -> tuple[pa.Array, BoolMask]:
    arrow_type = ARROW_TYPES[target]
    if target is LogicalType.STRING:
        return pc.cast(column, pa.string()), np.zeros(len(column), dtype=np.bool_)
    if target is LogicalType.BINARY:
        return pc.cast(column, pa.binary()), np.zeros(len(column), dtype=np.bool_)
    if target is LogicalType.BOOL:
        lowered = pc.utf8_lower(pc.utf8_trim_whitespace(column))
        is_true = pc.equal(lowered, "true")
        known = pc.or_(is_true, pc.equal(lowered, "false"))
        result = pc.if_else(known, is_true, pa.scalar(None, type=pa.bool_()))
        return result, _bad_mask(column, result)
    fast: pa.Array | None = None
    try:
        if target is LogicalType.TIMESTAMP:
            fast = _timestamp_text_fast(column)
        elif _plain_number_text(column, target):
            fast = pc.cast(column, arrow_type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        fast = None
    if fast is not None:
        bad = np.zeros(len(column), dtype=np.bool_)
        if target is LogicalType.FLOAT64:
            fast, bad = _inexact_float_text(column, fast)
        # SUBTLE: Arrow parses years 0000 and (with an offset) instants before
        # 0001-01-01 or after 9999-12-31 UTC, which the per-value (Python) way refuses.
        return _within_calendar(fast, bad, target)
    parse = _TEXT_PARSERS[target]
    return _per_value(column.to_pylist(), parse, arrow_type)


_LONG_INT_TEXT = r"^\s*[+-]?[0-9]{16,}\s*$"  # 15 digits or fewer always fit a float64
_INF_TEXT = r"(?i)^\s*[+-]?inf(inity)?\s*$"
_INF_WORD = re.compile(r"[+-]?inf(inity)?", re.IGNORECASE)


def _inexact_float_text(text: pa.Array, floats: pa.Array) -> Conversion:
    """Arrow parsed ``text`` into ``floats``; an integer text the float does not equal,
    or a number that overflowed to infinity, is bad (and null)."""
    suspects = pc.or_(
        pc.match_substring_regex(text, _LONG_INT_TEXT),
        pc.and_(pc.is_inf(floats), pc.invert(pc.match_substring_regex(text, _INF_TEXT))),
    )
    idx = np.flatnonzero(np.asarray(suspects.fill_null(False).to_numpy(zero_copy_only=False)))
    bad = np.zeros(len(text), dtype=np.bool_)
    for i in idx.tolist():
        bad[i] = _parse_float_text(text[i].as_py()) is None
    return _without(floats, bad), bad


def _all_text_converts(column: pa.Array, present: list[object], target: LogicalType) -> bool:
    """Whether every non-null text value converts (stops at the first that does not):
    exactly whether :func:`convert` finds none bad, so the answer for a column is the
    answer for all of its parts (:func:`text_fits`)."""
    if target is LogicalType.BOOL:
        return not _convert_text(column, target)[1].any()
    parse = _TEXT_PARSERS[target]
    if parse(present[0]) is None:  # cheap rejection, the common case for other types
        return False
    try:
        if target is LogicalType.TIMESTAMP:
            fast = _timestamp_text_fast(column)
        elif _plain_number_text(column, target):
            fast = pc.cast(column, ARROW_TYPES[target])
        else:
            return all(parse(v) is not None for v in present)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return all(parse(v) is not None for v in present)
    bad = np.zeros(len(fast), dtype=np.bool_)
    if target is LogicalType.FLOAT64:
        # As convert: Arrow reads "1e400" as infinity and rounds a long integer; neither
        # converts, so neither may make a new column float64.
        fast, bad = _inexact_float_text(column, fast)
        if bad.any():
            return False
    return not _within_calendar(fast, bad, target)[1].any()


TEXT_CANDIDATES = (
    LogicalType.INT64, LogicalType.FLOAT64, LogicalType.BOOL, LogicalType.DATE,
    LogicalType.TIMESTAMP,
)
"""The types a new text column may be inferred as, in order of preference (the first
every value converts to; else ``string``)."""


def text_fits(column: pa.Array, candidates: Sequence[LogicalType]) -> list[bool]:
    """For each of ``candidates``, whether every non-null text value of ``column``
    converts to it (True when there is none). Of consecutive parts of a column, the
    answer for the whole is the AND of the parts' (it is :func:`convert`'s, value by
    value), so a file read in chunks infers what the whole file would
    (``landing.stream_types``)."""
    valid = pc.is_valid(column)
    if not pc.any(valid).as_py():
        return [True] * len(candidates)
    first = int(pc.index(valid, True).as_py())
    out: list[bool] = []
    for target in candidates:
        # The first value alone rejects most candidates without reading the rest.
        if _convert_text(column.slice(first, 1), target)[1].any():
            out.append(False)
        else:
            out.append(not _convert_text(column, target)[1].any())
    return out


def infer_text(fits: Sequence[bool]) -> LogicalType:
    """The type of a new text column: the first of :data:`TEXT_CANDIDATES` that
    ``fits`` (:func:`text_fits` of ``TEXT_CANDIDATES``) marks, else ``string``."""
    return next((t for t, ok in zip(TEXT_CANDIDATES, fits, strict=True) if ok),
                LogicalType.STRING)


# What the per-value parsers accept, as RE2 patterns: Arrow's own text casts also read
# "0x10" (16, and "0xFFFFFFFFFFFFFFFF" as -1) and "nan(5)", which the parsers refuse, so
# a cast is trusted only for a column whose every value has the plain form.
_PLAIN_TEXT = {
    LogicalType.INT64: r"^\s*[+-]?[0-9]+\s*$",
    LogicalType.FLOAT64: (
        r"^\s*[+-]?(([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?"
        r"|(?i:inf|infinity|nan))\s*$"
    ),
}


def _plain_number_text(column: pa.Array, target: LogicalType) -> bool:
    """Whether Arrow's cast of ``column`` to ``target`` may be trusted: always for other
    targets, for numbers only when every non-null value is a plain decimal number."""
    pattern = _PLAIN_TEXT.get(target)
    if pattern is None:
        return True
    plain = pc.match_substring_regex(column, pattern)
    return bool(pc.all(plain.fill_null(True)).as_py())


def _timestamp_text_fast(column: pa.Array) -> pa.Array:
    try:
        naive = pc.cast(column, pa.timestamp("us"))
        return pc.cast(naive, ARROW_TYPES[LogicalType.TIMESTAMP])
    except pa.ArrowInvalid:
        return pc.cast(column, ARROW_TYPES[LogicalType.TIMESTAMP])


def _parse_int_text(value: object) -> object:
    if not isinstance(value, str):
        return None
    text = value.strip()
    if not _INT_TEXT.fullmatch(text):
        return None
    return _int64(int(text))


def _parse_float_text(value: object) -> object:
    if not isinstance(value, str):
        return None
    text = value.strip()
    if _INT_TEXT.fullmatch(text):
        return _json_float(int(text))  # an integer converts only if the float equals it
    if not _FLOAT_TEXT.fullmatch(text):
        # Python's float() also reads "1_2" as 12.0 and non-ASCII digits ("５", "١٢"):
        # not numbers in a CSV file, and not what Arrow's fast cast reads either.
        return None
    try:
        parsed = float(text)
    except ValueError:
        return None
    if math.isinf(parsed) and not _INF_WORD.fullmatch(text):
        return None  # "1e400": out of float64's range, not infinity
    return parsed


def _parse_date(value: object) -> object:
    if not isinstance(value, str):
        return None
    try:
        return dt.date.fromisoformat(value.strip())
    except ValueError:
        return None


_FRACTION = re.compile(r"[.,]([0-9]+)", re.ASCII)


def _parse_timestamp(value: object) -> dt.datetime | None:
    if not isinstance(value, str):
        return None
    text = value.strip()
    fraction = _FRACTION.search(text)
    if fraction is not None and fraction.group(1)[6:].strip("0"):
        # Python keeps six fraction digits and silently drops the rest: not exact.
        return None
    try:
        parsed = dt.datetime.fromisoformat(text)
        if parsed.tzinfo is None:
            return parsed.replace(tzinfo=dt.UTC)
        return parsed.astimezone(dt.UTC)
    except (ValueError, OverflowError):  # not ISO-8601, or off the calendar in UTC
        return None


_TEXT_PARSERS: dict[LogicalType, Callable[[object], object]] = {
    LogicalType.INT64: _parse_int_text,
    LogicalType.FLOAT64: _parse_float_text,
    LogicalType.DATE: _parse_date,
    LogicalType.TIMESTAMP: _parse_timestamp,
}


# --- JSON ---------------------------------------------------------------------------


def _int64(value: int) -> int | None:
    return value if INT64_MIN <= value <= INT64_MAX else None


def _json_int(value: object) -> object:
    return _int64(value) if type(value) is int else None


def _json_float(value: object) -> object:
    if type(value) is float:
        # json.loads turns a number beyond float64's range ("1e400") into infinity, and
        # the readers refuse the NaN/Infinity literals, so an infinity here overflowed.
        return None if math.isinf(value) else value
    if type(value) is int:
        try:
            converted = float(value)
        except OverflowError:
            return None
        return converted if converted == value else None  # exact, or not at all
    return None


def _json_str(value: object) -> object:
    return value if type(value) is str else None


def _json_bool(value: object) -> object:
    return value if type(value) is bool else None


def _json_never(value: object) -> object:
    return None


_JSON_PARSERS: dict[LogicalType, Callable[[object], object]] = {
    LogicalType.INT64: _json_int,
    LogicalType.FLOAT64: _json_float,
    LogicalType.STRING: _json_str,
    LogicalType.BOOL: _json_bool,
    LogicalType.TIMESTAMP: _parse_timestamp,
    LogicalType.DATE: _parse_date,
    LogicalType.BINARY: _json_never,  # JSON has no bytes; guessing an encoding would lie
}


# Arrow's own inference of a Python list, and what it proves: if Arrow infers one of
# these types for the whole list, every non-null value is of the JSON kind the target
# accepts (Arrow refuses to infer int64 from a list holding bools or floats), except
# float64, which Arrow also infers for a list of floats and booleans: that case is
# checked value by value (``_all_json_floats_exact``).
_JSON_EXACT: dict[LogicalType, tuple[pa.DataType, ...]] = {
    LogicalType.INT64: (pa.int64(),),
    LogicalType.FLOAT64: (pa.float64(), pa.int64()),
    LogicalType.STRING: (pa.string(),),
    LogicalType.BOOL: (pa.bool_(),),
}


def _convert_json(values: list[object], target: LogicalType) -> tuple[pa.Array, BoolMask]:
    exact = _JSON_EXACT.get(target)
    if exact is not None:
        try:
            inferred = pa.array(values)
        except (pa.ArrowException, OverflowError, UnicodeEncodeError):
            inferred = None
        if inferred is not None and (inferred.type in exact or pa.types.is_null(inferred.type)):
            if target is not LogicalType.FLOAT64 or pa.types.is_null(inferred.type):
                return pc.cast(inferred, ARROW_TYPES[target]), np.zeros(len(values), np.bool_)
            if pa.types.is_integer(inferred.type):
                return _int_to_float(inferred)
            # Arrow's float64 inference turns booleans into 1.0/0.0, rounds integers
            # beyond 2**53 and keeps the infinities of overflowed numbers: then the
            # exact per-value way decides (a boolean is never a number).
            if _all_json_floats_exact(values) and not pc.any(pc.is_inf(inferred)).as_py():
                return inferred, np.zeros(len(values), dtype=np.bool_)
    return _per_value(values, _JSON_PARSERS[target], ARROW_TYPES[target])


def _all_json_floats_exact(values: list[object]) -> bool:
    """Whether every value is null, a float, or an integer a float64 equals exactly (so
    no boolean: ``type(True)`` is ``bool``, not ``int``)."""
    return all(
        v is None or type(v) is float or (type(v) is int and _json_float(v) is not None)
        for v in values
    )


# --- shared -------------------------------------------------------------------------


def _per_value(
    values: Sequence[object], parse: Callable[[object], object], arrow_type: pa.DataType
) -> tuple[pa.Array, BoolMask]:
    converted = [None if v is None else parse(v) for v in values]
    try:
        array = pa.array(converted, type=arrow_type)
    except UnicodeEncodeError:
        # A JSON string with a lone surrogate ("\ud800") is not UTF-8: not convertible.
        converted = [None if isinstance(c, str) and not is_utf8(c) else c for c in converted]
        array = pa.array(converted, type=arrow_type)
    bad = np.fromiter(
        (v is not None and c is None for v, c in zip(values, converted, strict=True)),
        dtype=np.bool_,
        count=len(values),
    )
    return array, bad


def _bad_mask(source: pa.Array, result: pa.Array) -> BoolMask:
    mask = pc.and_(pc.is_valid(source), pc.is_null(result))
    return np.asarray(mask.to_numpy(zero_copy_only=False), dtype=np.bool_)


def _values(column: Column) -> list[object]:
    return column if isinstance(column, list) else column.to_pylist()


def _non_null(values: list[object]) -> BoolMask:
    return np.fromiter((v is not None for v in values), dtype=np.bool_, count=len(values))


# --- the delete marker --------------------------------------------------------------


def convert_deleted(column: Column, kind: SourceKind) -> tuple[BoolMask, BoolMask]:
    """``(deletes, bad)``: a boolean, or "true"/"false" in any case; null means false."""
    if kind is SourceKind.JSON:
        values = cast(list[object], column)
        parsed = [_json_deleted(v) for v in values]
        deletes = np.fromiter((p is True for p in parsed), dtype=np.bool_, count=len(values))
        bad = np.fromiter((p is None for p in parsed), dtype=np.bool_, count=len(values))
        return deletes, bad
    arr = cast(pa.Array, column)
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    n = len(arr)
    if pa.types.is_null(arr.type):
        return np.zeros(n, dtype=np.bool_), np.zeros(n, dtype=np.bool_)
    if pa.types.is_boolean(arr.type):
        filled = arr.fill_null(False).to_numpy(zero_copy_only=False)
        return np.asarray(filled, dtype=np.bool_), np.zeros(n, dtype=np.bool_)
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        lowered = pc.utf8_lower(arr)
        is_true = pc.equal(lowered, "true").fill_null(False)
        known = pc.or_(is_true, pc.equal(lowered, "false").fill_null(False))
        bad = pc.and_(pc.is_valid(arr), pc.invert(known))
        return (
            np.asarray(is_true.to_numpy(zero_copy_only=False), dtype=np.bool_),
            np.asarray(bad.to_numpy(zero_copy_only=False), dtype=np.bool_),
        )
    bad_any = np.asarray(pc.is_valid(arr).to_numpy(zero_copy_only=False), dtype=np.bool_)
    return np.zeros(n, dtype=np.bool_), bad_any


def _json_deleted(value: object) -> bool | None:
    """True/False for a valid marker (null is False), None for an invalid one."""
    if value is None:
        return False
    if type(value) is bool:
        return value
    if type(value) is str:
        return _TRUE_FALSE.get(value.lower())
    return None
