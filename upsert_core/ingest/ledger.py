"""The ingested files' ledger: what each landing file was when it was ingested, so a file
rewritten under a name the shard already ingested is noticed (CONTRACT, "Files
rewritten under an ingested name").

Storage, in the shard's config (entry names in :mod:`~upsert_core.ingest.shard_config`):

- ``ledger.file.<name>``: :class:`FileRecord` as JSON, ``{"size": N, "kind":
  "xxh3_128_blocks", "block": B, "hash": "<hex>", "version": V}``: the block digest of
  ``landing.digest`` (``version``: what the listing saw, the local inode and
  modification time or the S3 ETag). Written by the compare-and-append that commits
  the file's name (:func:`with_ledger`): a name and its record are one state transition.
  Records written before block digests are ``{"size": N, "digest": "xxh3_128:<hex>",
  "version": V}`` (the whole file's xxh3-128; no ``kind``) and stay as they are.
- ``ledger.rewritten_files``: a JSON list of the names the last ingest that listed the
  landing found rewritten, in name order; absent when it found none
  (:func:`record_rewritten`, a compare-and-set of that one entry, only when it changes).

Invariants:

- A file ingested before records were kept (no entry, or one that does not parse) is
  never reported: older shards give no false alarms. A record of a kind this version
  does not know reads as none (:func:`recorded`), but its size still tells: a listed
  file of another size than such a record's is rewritten (:func:`recorded_size`; a
  size never gives a false alarm), one of the same size is not reported. A version
  that knows only whole-file records reads a block record as none (it has no
  ``digest``): no false alarm after a downgrade.
- A file is always compared with its record in the record's kind: an old record's
  whole-file digest is computed for it (:func:`find_rewritten`), so the upgrade neither
  hides a rewritten file nor reports an unchanged one.
- The record of a file an engine read whole or in block-aligned pieces carries the
  digest the engine computed from those bytes (``FileRead.digest``): nothing reads the
  file again to record it. Only without one is the file read at commit.
- :func:`find_rewritten`: a listed file whose name was ingested is rewritten iff its
  record exists and its content differs. A different size says so without reading; the
  same size and the same version as recorded say it is unchanged without reading;
  anything else (touched, copied over, uploaded again) is read, and its digest decides,
  so a file touched without a change of content is silent. A file that cannot be read
  now is not reported rewritten: the caller gets a warning instead.
- A rewritten file is never ingested again: its name is ingested (``pending`` skips it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from upsert_core.errors import IngestError
from upsert_core.ingest.shard_config import CONFIG_REWRITTEN, file_record_name
from upsert_core.landing import LandingFile
from upsert_core.landing.digest import BLOCKS, WHOLE, DigestKind, digest_text, kind_of
from upsert_core.persist.state.state import ShardState
from upsert_core.persist.write.append import AppendRequest


@dataclass(frozen=True)
class FileRecord:
    """One ingested file as it was: size in bytes, content digest (``<kind>:<hex>``,
    ``landing.digest``), listed version."""

    size: int
    digest: str
    version: str = ""

    @property
    def kind(self) -> DigestKind:
        return kind_of(self.digest)

    def encode(self) -> str:
        kind = self.kind
        if kind.name == WHOLE:  # as versions before block digests wrote it
            body: dict[str, object] = {"size": self.size, "digest": self.digest}
        else:
            body = {"size": self.size, "kind": kind.name, "block": kind.block,
                    "hash": self.digest.rpartition(":")[2]}
        return json.dumps({**body, "version": self.version}, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | None) -> FileRecord | None:
        """The record ``text`` encodes; None for no text, a malformed one or one of a
        kind this version does not know."""
        if not text:
            return None
        try:
            raw = json.loads(text)
        except ValueError:
            return None
        if not isinstance(raw, dict):
            return None
        size, version = raw.get("size"), raw.get("version", "")
        if type(size) is not int or size < 0:
            return None
        digest = _digest(raw)
        if digest is None:
            return None
        return cls(size, digest, version if isinstance(version, str) else "")


def _digest(raw: dict[str, object]) -> str | None:
    """The digest text of a decoded record (both formats: module docstring)."""
    if "kind" not in raw:
        digest = raw.get("digest")
        if not isinstance(digest, str) or not digest:
            return None
    else:
        block, hexdigest = raw.get("block"), raw.get("hash")
        if raw["kind"] != BLOCKS or type(block) is not int or block < 1:
            return None
        if not isinstance(hexdigest, str):
            return None
        digest = digest_text(DigestKind(BLOCKS, block), hexdigest)
    try:
        kind_of(digest)
    except IngestError:
        return None
    return digest


def record_of(file: LandingFile, kind: DigestKind | None = None) -> FileRecord:
    """``file``'s record, of its bytes as listed, with a digest of ``kind`` (default:
    the kind recorded now); raises as ``LandingFile.read_bytes``."""
    size, digest = file.fingerprint(kind)
    return FileRecord(size, digest, file.version)


def with_ledger(
    request: AppendRequest, file: LandingFile, digest: str | None = None
) -> AppendRequest:
    """``request`` (which commits ``file``'s name) with ``file``'s record in the same
    transition: of ``digest``, the digest the engine computed from the bytes it read of
    the version listed, when it has one; else the file is read now. Raises
    ``LandingFileChanged`` when the file is no longer the version listed (and read),
    ``IngestError`` when it cannot be read."""
    if digest is not None and file.size >= 0:
        record = FileRecord(file.size, digest, file.version)
    else:
        record = record_of(file)
    entry = {file_record_name(file.name): record.encode()}
    return replace(request, config_updates={**request.config_updates, **entry})


def recorded(state: ShardState, name: str) -> FileRecord | None:
    """The record of ingested file ``name`` (None: none kept, or malformed)."""
    return FileRecord.decode(state.config.get(file_record_name(name)))


def recorded_size(state: ShardState, name: str) -> int | None:
    """The size in a record of ``name`` of a kind this version does not know (a later
    version's: a JSON object with a ``size`` and a ``kind`` or ``digest`` it cannot
    parse); None for no such record. Only for a file :func:`recorded` gives none for."""
    try:
        raw = json.loads(state.config.get(file_record_name(name)) or "null")
    except ValueError:
        return None
    if not isinstance(raw, dict):
        return None
    size, kind, digest = raw.get("size"), raw.get("kind"), raw.get("digest")
    if type(size) is not int or size < 0:
        return None
    if isinstance(kind, str) and kind not in (BLOCKS, WHOLE):
        return size
    if kind is None and isinstance(digest, str):
        try:
            kind_of(digest)
        except IngestError:  # a kind not known here, or malformed: only the former counts
            name_part, sep, hexdigest = digest.rpartition(":")
            known = name_part == WHOLE or name_part.partition("/")[0] == BLOCKS
            if sep and name_part and hexdigest and not known:
                return size
    return None


@dataclass(frozen=True)
class Rewritten:
    """A listed file whose content is not what was ingested under its name."""

    name: str
    ts: int
    was_size: int  # the size recorded when it was ingested
    size: int

    def warning(self) -> str:
        sizes = (f"{self.was_size} bytes then, {self.size} now" if self.size != self.was_size
                 else f"same size, {self.size} bytes, other content")
        return (f"{self.name}: rewritten since it was ingested at ts {self.ts} ({sizes});"
                " it is not ingested again: land the new content under a new name")


def find_rewritten(
    files: Iterable[LandingFile], state: ShardState
) -> tuple[list[Rewritten], list[str]]:
    """The listed files rewritten since they were ingested (module docstring), in name
    order, and warnings for ingested files that could not be read to tell."""
    found: list[Rewritten] = []
    warnings: list[str] = []
    for file in sorted(files, key=lambda f: f.name):
        ts = state.ingested_files.get(file.name)
        if ts is None or file.problem:
            continue
        was = recorded(state, file.name)
        if was is None:
            # A later version's record: its content cannot be compared here, its size can.
            size = recorded_size(state, file.name)
            if size is not None and 0 <= file.size != size:
                found.append(Rewritten(file.name, ts, size, file.size))
            continue
        if file.size >= 0 and file.size != was.size:
            found.append(Rewritten(file.name, ts, was.size, file.size))
            continue
        if file.version and file.version == was.version:
            continue
        try:
            now = record_of(file, was.kind)
        except IngestError as exc:
            warnings.append(f"{file.name}: could not be read to compare it with the file"
                            f" ingested at ts {ts}: {exc}")
            continue
        if now.digest != was.digest or now.size != was.size:
            found.append(Rewritten(file.name, ts, was.size, now.size))
    return found, warnings


def rewritten_files(config: Mapping[str, str]) -> list[str]:
    """The names the last ingest found rewritten ([] when none, or malformed)."""
    text = config.get(CONFIG_REWRITTEN)
    if not text:
        return []
    try:
        names = json.loads(text)
    except ValueError:
        return []
    if not isinstance(names, list):
        return []
    return [n for n in names if isinstance(n, str)]


def rewritten_transition(names: Iterable[str]) -> Callable[[ShardState], ShardState | None]:
    """A state transition storing ``names`` as the last ingest's rewritten files (None:
    no change, when they are already stored)."""
    wanted = sorted(set(names))

    def store(state: ShardState) -> ShardState | None:
        if rewritten_files(state.config) == wanted and (
            bool(wanted) == (CONFIG_REWRITTEN in state.config)
        ):
            return None
        config = dict(state.config)
        if wanted:
            config[CONFIG_REWRITTEN] = json.dumps(wanted)
        else:
            config.pop(CONFIG_REWRITTEN, None)
        return state.evolve(config=config)

    return store


__all__ = [
    "FileRecord",
    "Rewritten",
    "find_rewritten",
    "record_of",
    "recorded",
    "recorded_size",
    "rewritten_files",
    "rewritten_transition",
    "with_ledger",
]
