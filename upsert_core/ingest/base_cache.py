"""A local, disposable copy of bucket bases, so a fresh process maps a base instead of
fetching and decoding it.

A batch-scope bucket's base (a part base or a typed base: Parquet in the blob store)
is read whole by every batch a fresh process ingests (``upsertctl ingest`` is one
process per run): its Parquet decode was a third of such a batch. After a process has
read a base, it keeps the decoded columns here as an uncompressed Arrow IPC file; the
next process memory-maps it (Paimon keeps local lookup files of its remote sorted runs
for the same reason). Typed snapshots use the copies too (``shard_table``), but only
ingests write them.

Invariants:

- An entry is named by the blob store's location, the shard, the bucket and the
  base's blob key. A blob key is never written twice (keys are unique per write), so an
  entry never goes stale: it holds exactly the columns and schema metadata the
  Parquet read gave, and the caller checks them as it checks a blob it fetched.
- Every entry ends with an xxh3-64 checksum of its bytes (a CRC-32 cost 0.9 s per
  3.5 GB of bases, xxh3 0.2 s) and a digest of the bucket and blob key it copies, both
  checked on every load: a torn,
  truncated or altered entry is deleted and the caller reads the blob. An entry is
  written to a temporary name and renamed, so a reader never sees a partial one.
- It is an optimisation only: failing to read, write or delete an entry is ignored
  (the blob is read), so a missing, full or read-only cache directory, or no home
  directory at all, changes no result and stops no ingest. An entry the caller finds
  unusable (other columns or labels) is dropped like a damaged one. Malformed settings
  are refused before an ingest commits anything (:func:`check_settings`).
- Replayed parts (:data:`PARTS`): a fresh process replays the parts written since a
  bucket's base (``ingest.replay``), deriving each update's encoded row from its
  values; the decoded updates of a part are kept under the same rules (named by the
  part's never-rewritten blob key), in the ``parts`` directory beside the buckets'.
- Bounded: a bucket keeps its :data:`KEEP_PER_BUCKET` newest entries, a shard its
  :data:`KEEP_PARTS` newest part copies, and the whole cache at most
  ``UPSERT_BASE_CACHE_MB`` (default 16384: a 30M-key shard's bases take 3.5 GB, and a
  cache smaller than the bases one ingest maps evicts each entry before its next use):
  the oldest entries go first. The whole cache is scanned every :data:`SCAN_EVERY_S`
  and whenever a tally of the puts since the last scan would pass the bound, so racing
  processes may overshoot it by what they wrote in between.
- Where: ``UPSERT_CACHE_DIR`` (default ``$XDG_CACHE_HOME/upsert-platform``, else
  ``~/.cache/upsert-platform``), under ``bases/``. Off with ``UPSERT_BASE_CACHE=0``.
  Only local-directory and S3 blob stores are cached (others have no location that
  outlives the process). Spark executors read these settings from their own
  environment (``spark.executorEnv.*``), not the driver's.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import threading
import time
import uuid
from pathlib import Path

import pyarrow as pa
import xxhash

from upsert_core.errors import ConfigError
from upsert_core.ingest.options import on_off_setting
from upsert_core.persist.location import Blob
from upsert_core.persist.location.urls import blob_url

ENABLED_ENV = "UPSERT_BASE_CACHE"
DIR_ENV = "UPSERT_CACHE_DIR"
LIMIT_ENV = "UPSERT_BASE_CACHE_MB"
DEFAULT_LIMIT_MB = 16384
KEEP_PER_BUCKET = 2
"""Entries a bucket keeps: its current base and the one before (a racing writer's)."""
PARTS = "parts"
"""The directory (in place of a bucket number) of replayed parts' decoded updates."""
KEEP_PARTS = 1024
"""Replayed parts' copies a shard keeps, the newest (a replay reads only the parts
written since each bucket's base: at most 64 batches' worth, ``tasks.MAX_REPLAY_BATCHES``,
so 1024 covers 16 buckets; a copy dropped early costs its decode, never a result)."""
SCAN_EVERY_S = 60.0
"""The whole cache's size is scanned at least this often, and whenever the tally of
puts since the last scan would pass the bound; between scans a put costs a small read
and write instead of a stat of every entry (which grew with the part copies kept)."""
TALLY = ".size"
"""The file (beside the shards' directories) holding the cache's size as last tallied."""
STALE_TEMPORARY_S = 3600
"""A temporary file older than this is a killed writer's, and is removed."""

_TRAILER = struct.Struct("<QQQ4s")  # payload length, xxh3-64 of it, of its name, magic
_MAGIC = b"UPB2"
"""Entries of an earlier layout (``UPB1``: a CRC-32, no name) are dropped as damaged."""
_SUFFIX = ".arrow"


def cache_root() -> Path | None:
    """The cache directory (see the module docstring; not created), or None when there
    is none to use (no home directory, as in some containers and executors)."""
    given = os.environ.get(DIR_ENV, "").strip()
    if given:
        return Path(given).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    if xdg:
        return Path(xdg) / "upsert-platform"
    try:
        return Path.home() / ".cache" / "upsert-platform"
    except (RuntimeError, KeyError, OSError):  # no HOME and no passwd entry
        return None


def check_settings() -> None:
    """Raise :class:`ConfigError` for a malformed cache setting, so an ingest refuses
    before it commits anything rather than at its first base."""
    on_off_setting(os.environ, ENABLED_ENV)
    _limit_bytes()


def _limit_bytes() -> int:
    text = os.environ.get(LIMIT_ENV, "").strip()
    if not text:
        return DEFAULT_LIMIT_MB << 20
    if not text.isdigit():
        raise ConfigError(f"{LIMIT_ENV}={text!r}: give the cache's size limit in MB (e.g. 4096)")
    return int(text) << 20


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _name_id(bucket: int | str, key: str) -> int:
    """What an entry's trailer records of the base it copies (so an entry moved to
    another base's name is not taken for it)."""
    return xxhash.xxh3_64_intdigest(f"{bucket}|{key}".encode())


class BaseCache:
    """The cache of one shard's bases in one blob store (:meth:`for_blob`)."""

    def __init__(self, root: Path, limit_bytes: int) -> None:
        self.root = root
        self.limit_bytes = limit_bytes
        self._unevicted = 0  # bytes put with evict=False since the last eviction
        self._lock = threading.Lock()

    @classmethod
    def for_blob(cls, blob: Blob, shard: str) -> BaseCache | None:
        """The cache for ``shard`` in ``blob``, or None when caching is off or ``blob``
        is not cached (see the module docstring)."""
        if not on_off_setting(os.environ, ENABLED_ENV):
            return None
        location = blob_url(blob)
        root = cache_root()
        if location is None or root is None:
            return None
        return cls(root / "bases" / _digest(f"{location}|{shard}"), _limit_bytes())

    def _path(self, bucket: int | str, key: str) -> Path:
        return self.root / str(bucket) / f"{_digest(key)}{_SUFFIX}"

    def get(self, bucket: int | str, key: str) -> pa.Table | None:
        """The table cached for base ``key`` of ``bucket``, or None (absent, or found
        damaged and deleted)."""
        path = self._path(bucket, key)
        try:
            source = pa.memory_map(str(path))
        except (OSError, pa.ArrowException):
            return None
        try:
            whole = source.read_buffer()
            size = whole.size - _TRAILER.size
            if size < 0:
                raise ValueError("shorter than its trailer")
            length, checksum, name, magic = _TRAILER.unpack(whole.slice(size).to_pybytes())
            payload = whole.slice(0, size)
            if magic != _MAGIC or length != size or name != _name_id(bucket, key) or (
                xxhash.xxh3_64_intdigest(payload) != checksum
            ):
                raise ValueError("trailer or checksum does not match")
            table = pa.ipc.open_file(payload).read_all()
        except (OSError, ValueError, pa.ArrowException):
            self.drop(bucket, key)
            return None
        finally:
            source.close()
        with contextlib.suppress(OSError):  # a read-only cache is still read
            os.utime(path)  # recently used: the size bound drops older entries first
        return table

    def drop(self, bucket: int | str, key: str) -> None:
        """Delete the entry of base ``key`` (damaged, or found unusable by the caller)."""
        with contextlib.suppress(OSError):
            self._path(bucket, key).unlink()

    def put(self, bucket: int | str, key: str, table: pa.Table, *, evict: bool = True) -> None:
        """Keep ``table`` as base ``key`` of ``bucket`` (best effort: see the module
        docstring), then drop what the bounds exclude (unless ``evict`` is False: a
        caller that puts many entries calls :meth:`evict` once after them)."""
        path = self._path(bucket, key)
        temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with pa.OSFile(str(temporary), "wb") as out, pa.ipc.new_file(
                out, table.schema
            ) as writer:
                writer.write_table(table)
            with pa.memory_map(str(temporary)) as written:  # the bytes just written
                payload = written.read_buffer()
                trailer = _TRAILER.pack(payload.size, xxhash.xxh3_64_intdigest(payload),
                                        _name_id(bucket, key), _MAGIC)
            with open(temporary, "ab") as out:
                out.write(trailer)
            temporary.replace(path)
        except (OSError, pa.ArrowException):
            with contextlib.suppress(OSError):
                temporary.unlink()
            return
        if evict:
            self._evict(path)
            return
        # SUBTLE: counted now, tallied by the next eviction: a replay's copies are put
        # in a row and the bound applied once after them (:meth:`evict`), and puts the
        # tally never saw let one process take the cache past its bound until the
        # next whole scan.
        with contextlib.suppress(OSError):
            size = path.stat().st_size
            with self._lock:
                self._unevicted += size

    def evict(self) -> None:
        """Drop what the bounds exclude (after puts made with ``evict=False``)."""
        self._evict(None)

    def _evict(self, kept: Path | None) -> None:
        if kept is not None and kept.parent.name.isdigit():  # a bucket's bases
            _keep_newest(kept.parent, KEEP_PER_BUCKET, kept)
        parts = self.root / PARTS
        _keep_newest(parts, KEEP_PARTS, kept if kept is not None and kept.parent == parts
                     else None)
        with self._lock:
            added, self._unevicted = self._unevicted, 0
        with contextlib.suppress(OSError):
            if kept is not None:
                added += kept.stat().st_size
        if self._tally_allows(added):
            return
        with contextlib.suppress(OSError):  # a writer killed mid-put leaves its temporary
            stale = time.time() - STALE_TEMPORARY_S
            leftovers = [*self.root.parent.glob("*/*/.*.tmp"),  # entries'
                         *self.root.parent.glob(f"{TALLY}.*.tmp")]  # the tally's
            for leftover in leftovers:
                if leftover.stat().st_mtime < stale:
                    leftover.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            entries = [(p.stat(), p) for p in (self.root.parent).glob(f"*/*/*{_SUFFIX}")]
            total = sum(s.st_size for s, _ in entries)
            for stat, path in sorted(entries, key=lambda e: e[0].st_mtime):
                if total <= self.limit_bytes or path == kept:
                    continue
                path.unlink(missing_ok=True)
                total -= stat.st_size
            self._write_tally(total)

    @property
    def _tally_path(self) -> Path:
        return self.root.parent / TALLY

    def _tally_allows(self, added: int) -> bool:
        """Whether the whole cache's scan may be skipped: the tally of its size, written
        by the last scan (any process's) less than :data:`SCAN_EVERY_S` ago and grown
        by every put since, stays within the bound with ``added`` bytes more (the tally
        then records them). Puts of other processes racing this one may go uncounted
        until the next scan: the bound holds to within what they wrote meanwhile."""
        try:
            tally = self._tally_path
            scanned = tally.stat().st_mtime
            total = int(tally.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return False
        # A tally from the future (a clock set back since) would never expire, as each
        # write of it keeps its time, nor would a negative one ever pass the bound:
        # neither can be right, so the cache is scanned.
        age = time.time() - scanned
        if not -1.0 <= age <= SCAN_EVERY_S or total < 0 or total + added > self.limit_bytes:
            return False
        if added:
            self._write_tally(total + added, scanned)
        return True

    def _write_tally(self, total: int, scanned: float | None = None) -> None:
        tally = self._tally_path
        temporary = tally.with_name(f"{tally.name}.{uuid.uuid4().hex}.tmp")
        with contextlib.suppress(OSError):
            temporary.write_text(f"{total}\n")
            if scanned is not None:  # the tally keeps the time of the scan it grew from
                os.utime(temporary, (scanned, scanned))
            temporary.replace(tally)
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)


def keep_base_copy(blob: Blob, shard: str, bucket: int, key: str, written: pa.Table) -> None:
    """Keep this machine's copy of the base ``key`` of ``bucket`` a writer just stored
    from ``written`` (its ``key``, ``ts``, ``diff`` and value columns, with the schema
    metadata it was stored with): the columns a reader of the base reads (all but
    ``ts``), which is what a Parquet read of it gives (tested). Best effort, like every
    entry; a copy of a base whose commit failed names a blob never referenced."""
    cache = BaseCache.for_blob(blob, shard)
    if cache is not None:
        cache.put(bucket, key, written.drop_columns(["ts"]))


def _keep_newest(directory: Path, keep: int, kept: Path | None) -> None:
    """Delete all but the ``keep`` newest entries of ``directory`` (``kept`` counts as
    the newest); best effort."""
    with contextlib.suppress(OSError):
        with os.scandir(directory) as scan:
            entries = [(e.stat().st_mtime, e.path) for e in scan
                       if e.name.endswith(_SUFFIX) and not e.name.startswith(".")]
        if len(entries) <= keep:
            return
        entries.sort(reverse=True)
        others = [path for _, path in entries if kept is None or path != str(kept)]
        for path in others[keep - (1 if kept is not None else 0):]:
            with contextlib.suppress(OSError):
                os.unlink(path)
