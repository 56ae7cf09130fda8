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
  (``persist.read.check_snapshot_readable`` and friends).
"""

from __future__ import annotations

import numbers
import re

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
