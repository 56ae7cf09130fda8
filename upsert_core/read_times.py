"""Shard times a caller names: exact integers, never rounded.

A shard's times (``ts``, ``as_of``, ``since``, ``until``) are integers. Every surface
that takes one (``open_shard()``'s reads, the Spark source's options, ``upsertctl``'s
``--as-of``/``--since``/``--until``) accepts it through this module.

Invariants:

- :func:`require_ts` accepts Python and numpy integers only. A bool (``True`` is an
  ``int`` to Python), a float (even ``2.0``), a decimal, a string or None is refused
  with :class:`~upsert_core.errors.InvalidUsage` naming the argument: a time is never
  truncated, rounded or reinterpreted.
- :func:`parse_ts_text` reads an optionally signed run of ASCII decimal digits with
  optional surrounding blanks, and nothing else: ``"1.5"``, ``"1e3"``, ``"1_0"``,
  ``"True"`` and non-ASCII digits (which Python's ``int()`` would accept) are None.
- Neither checks a range: whether a time is readable is the reads' business
  (``persist.read.read.check_snapshot_readable`` and friends).
- Wall-clock times (``as_of_time``, ``since_time``, ``until_time``; ``--as-of-time``
  and friends) are :func:`require_time`: a ``datetime`` or an ISO-8601 string, without a
  zone meaning UTC, as exact UTC microseconds since the epoch. Anything else (a number,
  a ``date`` object, text that is not ISO-8601) is :class:`InvalidUsage`; ISO text
  naming a day alone stands for its midnight.
  ``persist.state.commit_times`` resolves them to ts.
- Durations (a retention's ``--keep-for``) are :func:`parse_duration`: a whole number
  and one unit of ``s``, ``m``, ``h``, ``d`` or ``w``, as whole seconds >= 1.
"""

from __future__ import annotations

import numbers
import re
from datetime import UTC, datetime

from upsert_core.errors import InvalidUsage

_TS_TEXT = re.compile(r"\s*[+-]?[0-9]+\s*", re.ASCII)


def require_ts(value: object, name: str) -> int:
    """``value`` as a shard time, or :class:`InvalidUsage` if it is not an integer."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidUsage(f"{name} must be an integer ts, got {value!r}")
    return int(value)


def parse_ts_text(text: str) -> int | None:
    """The integer ``text`` spells in ASCII decimal digits, else None."""
    if not _TS_TEXT.fullmatch(text):
        return None
    return int(text)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


_FRACTION = re.compile(r"T\d\d:?\d\d:?\d\d[.,](\d+)")


def parse_time_text(text: str) -> datetime | None:
    """The instant ISO-8601 ``text`` names (no zone: UTC), else None. Times are kept to
    the microsecond: a fraction with a non-zero digit past the sixth is refused (None),
    since Python would drop it silently and move the time."""
    text = text.strip()
    fraction = _FRACTION.search(text)
    if fraction is not None and len(fraction.group(1)) > 6:
        if fraction.group(1)[6:].strip("0"):
            return None
        start, end = fraction.span(1)
        text = text[:start] + fraction.group(1)[:6] + text[end:]
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _why(text: str) -> str:
    fraction = _FRACTION.search(text.strip())
    if fraction is not None and len(fraction.group(1)) > 6:
        return " (times are kept to the microsecond: no digit past the sixth of a second)"
    return ""


def require_time(value: object, name: str) -> int:
    """``value`` (a ``datetime`` or ISO-8601 text; no zone: UTC) as UTC microseconds
    since the epoch, or :class:`InvalidUsage` naming ``name``."""
    if isinstance(value, str):
        parsed = parse_time_text(value)
        if parsed is None:
            raise InvalidUsage(f"{name} must be an ISO-8601 time, got {value!r}{_why(value)}")
        value = parsed
    if not isinstance(value, datetime):
        raise InvalidUsage(
            f"{name} must be a datetime or an ISO-8601 string, got {value!r}"
        )
    if value.tzinfo is None or value.utcoffset() is None:
        value = value.replace(tzinfo=UTC)
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*([0-9]{1,12})\s*([smhdw])\s*$", re.ASCII)


def parse_duration(text: str) -> int:
    """``text`` such as ``90s``, ``30m``, ``12h``, ``7d`` or ``2w`` in seconds (>= 1),
    else :class:`InvalidUsage` (also for other than ASCII digits, or more than 12)."""
    match = _DURATION.match(text.lower())
    seconds = int(match.group(1)) * _UNITS[match.group(2)] if match else 0
    if seconds < 1:
        raise InvalidUsage(
            f"a retention duration is a whole number (ASCII digits, at most 12) and a unit"
            f" (s, m, h, d or w), e.g. 7d or 12h, got {text!r}"
        )
    return seconds


def format_duration(seconds: int) -> str:
    """``seconds`` in the largest unit up to days that divides it (``604800`` is
    ``7d``)."""
    for unit, size in sorted(_UNITS.items(), key=lambda item: -item[1])[1:]:  # not weeks
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
