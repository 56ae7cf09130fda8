"""The landing sensor's cursor: the greatest file name it handled, and what it saw of each
file it requested a run for that the shard does not hold yet.

Stored as JSON: ``{"after": NAME, "seen": {NAME: {"size": BYTES, "version": V}}}``, where
``version`` is what :func:`upsert_core.landing.list_landing` reports (``inode:mtime_ns``
for a local file, the ETag on S3). Until records were kept the cursor was the plain
name; :meth:`LandingCursor.parse` reads both, so a sensor upgraded in place keeps its
position (an old cursor has no records: see :mod:`orchestration.sensors` for how a
failed partition then gets one).

Invariants:

- ``after`` only moves forward (:meth:`LandingCursor.advanced`).
- ``seen`` keeps only files that have a partition and are not in the shard
  (:meth:`LandingCursor.pruned`): its size follows the files pending or failed, not the
  landing's history.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from upsert_core.landing import LandingFile


@dataclass(frozen=True)
class FileRecord:
    """What a listing said of one version of a file."""

    size: int
    version: str

    @classmethod
    def of(cls, file: LandingFile) -> FileRecord:
        return cls(size=file.size, version=file.version)

    @property
    def token(self) -> str:
        """This version in a run key: ``<size>-<version>`` (an ETag without its quotes)."""
        return f"{self.size}-{self.version.strip(chr(34))}"

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "version": self.version}

    @classmethod
    def from_json(cls, value: Any) -> FileRecord | None:
        if not isinstance(value, dict):
            return None
        size, version = value.get("size"), value.get("version")
        if not isinstance(size, int) or not isinstance(version, str):
            return None
        return cls(size=size, version=version)


@dataclass(frozen=True)
class LandingCursor:
    """The sensor's state between ticks (see the module docstring)."""

    after: str = ""
    seen: dict[str, FileRecord] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str | None) -> LandingCursor:
        """A stored cursor, JSON or the plain name of the old format ("" for none)."""
        if not text:
            return cls()
        if text.startswith("{"):
            try:
                value = json.loads(text)
            except ValueError:
                value = None
            if isinstance(value, dict) and isinstance(value.get("after"), str):
                seen = value.get("seen")
                records = {
                    name: record
                    for name, raw in (seen.items() if isinstance(seen, dict) else ())
                    if (record := FileRecord.from_json(raw)) is not None
                }
                return cls(after=value["after"], seen=records)
        return cls(after=text)

    def dumps(self) -> str:
        seen = {name: self.seen[name].to_json() for name in sorted(self.seen)}
        return json.dumps({"after": self.after, "seen": seen}, separators=(",", ":"))

    def advanced(self, names: Iterable[str]) -> LandingCursor:
        """``after`` moved past ``names`` (never backwards)."""
        return replace(self, after=max([self.after, *names]))

    def recorded(self, files: Iterable[LandingFile]) -> LandingCursor:
        """With what the listing says of ``files`` now."""
        return replace(self, seen={**self.seen, **{f.name: FileRecord.of(f) for f in files}})

    def pruned(self, partitions: Collection[str], done: Collection[str]) -> LandingCursor:
        """Only the records of files that have a partition and are not in the shard."""
        return replace(self, seen={n: r for n, r in self.seen.items()
                                   if n in partitions and n not in done})
