"""A durable :class:`~upsert_core.persist.location.Blob` in a local directory.

Invariants kept:

- A key maps to the file ``root/<key>``, ``/`` separating directories. A key can NEVER
  name a path outside ``root``: keys with ``..`` or ``.`` segments, empty segments
  (leading, trailing or doubled ``/``), backslashes, NUL bytes, lone surrogates, or
  segments that look like our temporary files are rejected with ``ConfigError``, and
  so is a key whose path resolves outside ``root`` through a symlink.
- ``set`` is atomic and durable: the bytes go to a temporary file in the target's
  directory, are fsynced, renamed over the target (atomic on POSIX), and the directory
  is fsynced so the rename survives a crash. Readers see the old or the new bytes.
- ``list_keys`` walks the tree and never reports temporary files.
- ``delete`` is idempotent; empty directories are left in place (removing them would
  race with a concurrent ``set`` creating a file in them).
- A key cannot be both a file and a directory (``a`` and ``a/b``): that ``set`` fails.
- ``open_reader`` (ranged reads) opens the file: reads fetch only the ranges asked
  for, and an open reader keeps reading the version it opened even after a ``delete``
  or an overwriting ``set`` (POSIX keeps an unlinked or replaced file alive while it
  is open).
"""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

from upsert_core.errors import ConfigError, DeterminateError, IndeterminateError
from upsert_core.persist.location import BlobMetadata, BlobReader
from upsert_core.persist.location.blob_memory import blob_view, check_blob_key

TMP_PREFIX = ".tmp-blob-"
"""Name prefix of in-flight temporary files; no key segment may start with it."""


def key_segments(key: str) -> list[str]:
    """The path segments of ``key``; raise :class:`ConfigError` if it could escape root."""
    check_blob_key(key)
    if "\x00" in key or "\\" in key:
        raise ConfigError(f"blob key {key!r} contains a NUL byte or backslash")
    if key.startswith("/"):
        raise ConfigError(f"blob key {key!r} is absolute; keys are relative to the root")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"blob key {key!r} is not valid Unicode text") from None
    segments = key.split("/")
    for seg in segments:
        if seg in ("", ".", ".."):
            raise ConfigError(f"blob key {key!r} has an empty, '.' or '..' segment")
        if seg.startswith(TMP_PREFIX):
            raise ConfigError(f"blob key {key!r} uses the reserved prefix {TMP_PREFIX!r}")
    return segments


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalBlob:
    """A blob store rooted at a local directory (created if missing)."""

    def __init__(self, root: str | Path) -> None:
        self._root = Path(root).resolve()
        try:
            self._root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot create blob root {self._root}: {e}") from e

    @property
    def root(self) -> Path:
        return self._root

    def _path(self, key: str) -> Path:
        path = self._root.joinpath(*key_segments(key))
        # Belt and braces: the segment checks above already forbid escaping lexically;
        # resolving also refuses a symlink planted inside the root that points out.
        if not Path(os.path.realpath(path)).is_relative_to(self._root):
            raise ConfigError(f"blob key {key!r} resolves outside the root {self._root}")
        return path

    def get(self, key: str) -> bytes | None:
        path = self._path(key)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            return None
        except OSError as e:
            if e.errno == errno.ENOTDIR:
                return None
            raise DeterminateError(f"cannot read blob {key!r} at {path}: {e}") from e

    def open_reader(self, key: str) -> BlobReader | None:
        path = self._path(key)
        try:
            return open(path, "rb")  # noqa: SIM115 (the caller closes it)
        except (FileNotFoundError, IsADirectoryError):
            return None
        except OSError as e:
            if e.errno == errno.ENOTDIR:
                return None
            raise DeterminateError(f"cannot open blob {key!r} at {path}: {e}") from e

    def set(self, key: str, value: bytes | memoryview) -> None:
        path = self._path(key)
        view = blob_view(value)  # written from where it is: no copy
        try:
            self._ensure_dir(path.parent)
        except OSError as e:
            raise DeterminateError(f"cannot create the directory for blob {key!r}: {e}") from e
        tmp = path.parent / f"{TMP_PREFIX}{uuid.uuid4().hex}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                os.fsync(fd)
            finally:
                os.close(fd)
            if path.is_dir():
                raise ConfigError(f"blob key {key!r} names a directory of other keys at {path}")
            # SUBTLE: rename is the commit point; a concurrent reader opened either the
            # old file or the new one, never a partial write.
            os.replace(tmp, path)
        except ConfigError:
            tmp.unlink(missing_ok=True)
            raise
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise DeterminateError(f"cannot write blob {key!r} at {path}: {e}") from e
        try:
            _fsync_dir(path.parent)
        except OSError as e:
            raise IndeterminateError(
                f"wrote blob {key!r} but could not make it durable (directory fsync): {e}"
            ) from e

    def _ensure_dir(self, directory: Path) -> None:
        if directory.is_dir():
            return
        missing: list[Path] = []
        d = directory
        while not d.is_dir():
            missing.append(d)
            d = d.parent
        for d in reversed(missing):
            try:
                d.mkdir()
            except FileExistsError:
                if not d.is_dir():
                    raise
            # A new directory entry is durable only once its parent is fsynced.
            _fsync_dir(d.parent)

    def delete(self, key: str) -> int | None:
        path = self._path(key)
        try:
            size = path.stat().st_size
            if path.is_dir():
                return None
            path.unlink()
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno == errno.ENOTDIR:
                return None
            raise IndeterminateError(f"cannot delete blob {key!r} at {path}: {e}") from e
        try:
            _fsync_dir(path.parent)
        except OSError as e:
            raise IndeterminateError(f"deleted blob {key!r} but fsync failed: {e}") from e
        return size

    def list_keys(self, prefix: str) -> Iterator[BlobMetadata]:
        # Only walk the part of the tree the prefix can reach.
        head, _, _ = prefix.rpartition("/")
        segments = head.split("/") if head else []
        if "\x00" in head or "\\" in head or any(s in ("", ".", "..") for s in segments):
            return iter(())  # no valid key has such a prefix; never walk outside root
        start = self._root.joinpath(*segments)
        if not start.is_dir():
            return iter(())
        found: list[BlobMetadata] = []
        try:
            for dirpath, dirnames, filenames in os.walk(start):
                dirnames.sort()
                rel_dir = Path(dirpath).relative_to(self._root).as_posix()
                base = "" if rel_dir == "." else rel_dir + "/"
                for name in filenames:
                    if name.startswith(TMP_PREFIX):
                        continue
                    key = base + name
                    if not key.startswith(prefix):
                        continue
                    try:
                        size = os.stat(os.path.join(dirpath, name)).st_size
                    except FileNotFoundError:
                        continue  # deleted while we walked
                    found.append(BlobMetadata(key, size))
        except OSError as e:
            raise DeterminateError(f"cannot list blobs under {start}: {e}") from e
        found.sort(key=lambda m: m.key)
        return iter(found)
