"""Listing the batch files of a landing location and opening them by name.

A landing location is a local directory (``/abs/dir``, ``rel/dir``, ``file:///abs/dir``)
or an S3 prefix (``s3://bucket/prefix``; ``AWS_ENDPOINT_URL`` is honoured).

Invariants:

- A file is identified by its *name*: its path relative to the landing root, with
  ``/`` separators. Only names ending in ``.parquet``, ``.jsonl`` or ``.csv`` are batch
  files; everything else in the location is ignored.
- Hidden files are never listed: a name with a component that begins with ``.`` or
  ``_`` (``.part-0.crc``, ``_SUCCESS``, ``_temporary/0/part-0.jsonl``), as Spark and
  Hadoop treat writers' temporary and marker files. Only the part inside the landing
  counts (for S3: the key after the prefix); local hidden directories are not walked.
- :func:`list_landing` returns files sorted lexicographically by name (Python string
  order, i.e. by code point), so every run sees the same ingest order.
- A name can never point outside the landing location: absolute names, empty, ``.``
  or ``..`` components, backslashes, NUL and other control characters, and names that
  are not valid UTF-8 are rejected with an :class:`IngestError` naming the file. A
  listing never fails for one bad name: it lists the file with its ``problem``, and
  reading it raises that error, so an ingest stops at that file in name order, like at
  any other file-level problem. A local symlink that resolves outside the root is
  listed the same way. :func:`landing_file` and :func:`check_name` raise at once.
- A file is read as listed or not at all: the listing records its ``size`` and
  ``version`` (local: inode and modification time; S3: the ETag), and
  :meth:`LandingFile.read_bytes` raises :class:`LandingFileChanged` when what it read
  is not that (the file is still being written, or was replaced). On S3 the read is
  pinned to the listed ETag (``IfMatch``), so every reader of a listed file (every
  Spark slice) gets the same bytes or that error; locally each read compares size,
  inode and modification time before and after. A file built by name alone
  (``size`` -1, no version) is read as it is.
- :class:`LandingFile` holds only strings and an int, so it pickles cheaply into a
  Spark task; it opens its bytes on demand, one file at a time.
- :meth:`LandingFile.fingerprint` is the size and content digest (``landing.digest``;
  by default the block digest every engine records, or the kind asked for, such as an
  old record's whole-file ``xxh3_128``) of the bytes of the version listed (the same
  pinning as :meth:`LandingFile.read_bytes`; read in pieces, so memory stays small). A
  process remembers the digests of the last few versions it read whole, keyed by
  location, size, version and kind, so the ingest that just read a file does not read it
  again to fingerprint it (:meth:`LandingFile.known_digest`); a file listed without a
  version is always read.
"""

from __future__ import annotations

import functools
import os
import stat
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from upsert_core.errors import ConfigError, IngestError, LandingFileChanged
from upsert_core.landing import read_counter
from upsert_core.landing.digest import Digester, DigestKind, blocks_kind, digest_of, kind_of
from upsert_core.redact import redact_url

SUFFIXES: tuple[str, ...] = (".parquet", ".jsonl", ".csv")
_DIGEST_PIECE = 8 << 20
_DIGESTS_KEPT = 16
_digests: OrderedDict[tuple[str, int, str, str], tuple[int, str]] = OrderedDict()
_digests_lock = threading.Lock()


def remember_digest(file: LandingFile, size: int, digest: str) -> None:
    """Remember that the listed version of ``file`` (``size`` bytes) has ``digest``:
    for a reader that read the whole file in order (module docstring)."""
    if not file.version:
        return
    key = (file.url, file.size, file.version, kind_of(digest).text)
    with _digests_lock:
        _digests[key] = (size, digest)
        _digests.move_to_end(key)
        while len(_digests) > _DIGESTS_KEPT:
            _digests.popitem(last=False)


def _remembered(file: LandingFile, kind: DigestKind) -> tuple[int, str] | None:
    if not file.version:
        return None
    with _digests_lock:
        return _digests.get((file.url, file.size, file.version, kind.text))


@dataclass(frozen=True, order=True)
class LandingFile:
    """One batch file: ``name`` relative to ``root`` (a normalised landing URL)."""

    name: str
    root: str
    size: int = -1
    version: str = ""  # local: "inode:mtime_ns"; S3: the ETag; "": not checked
    problem: str = ""  # why the file cannot be ingested (a bad name): read_bytes raises

    @property
    def suffix(self) -> str:
        """The batch format suffix, e.g. ``.jsonl``."""
        return os.path.splitext(self.name)[1].lower()

    @property
    def url(self) -> str:
        """The full location of the file."""
        return f"{self.root.rstrip('/')}/{self.name}"

    def read_bytes(self) -> bytes:
        """The whole file, exactly as listed. Raises :class:`LandingFileChanged` if it
        changed since, and :class:`IngestError` naming the file if it cannot be read."""
        if self.problem:
            raise IngestError(self.problem)
        try:
            data = self._read_s3() if self.root.startswith("s3://") else self._read_local()
        except IngestError:
            raise
        except Exception as exc:  # noqa: BLE001 - every I/O failure becomes one clear line
            raise IngestError(f"{self.name}: cannot read file: {exc}") from exc
        read_counter.add(self.url, len(data))
        if self.size >= 0 and len(data) != self.size:
            raise self._changed(f"listed with {self.size} bytes, read {len(data)}")
        remember_digest(self, len(data), digest_of(data, blocks_kind(len(data))))
        return data

    def read_range(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the file as listed (fewer at its end). Raises as
        :meth:`read_bytes` does: :class:`LandingFileChanged` if the file is no longer
        the version listed (S3: pinned to the ETag; locally: inode, modification time
        and size compared after the read)."""
        if self.problem:
            raise IngestError(self.problem)
        if end <= start:
            return b""
        try:
            if self.root.startswith("s3://"):
                data = self._read_s3_range(start, end)
            else:
                data = self._read_local_range(start, end)
        except IngestError:
            raise
        except Exception as exc:  # noqa: BLE001 - every I/O failure becomes one clear line
            raise IngestError(f"{self.name}: cannot read file: {exc}") from exc
        read_counter.add(self.url, len(data))
        return data

    def _read_local_range(self, start: int, end: int) -> bytes:
        with _local_path(self.root, self.name).open("rb") as fh:
            fh.seek(start)
            data = fh.read(end - start)
            after = os.fstat(fh.fileno())
        self.check_local_version(after)
        return data

    def _read_s3_range(self, start: int, end: int) -> bytes:
        if self.size >= 0 and start >= self.size:
            return b""
        data: bytes = self._get_s3(f"bytes={start}-{end - 1}")["Body"].read()
        return data

    def digest_kind(self) -> DigestKind:
        """The kind of digest recorded for this file now (``landing.digest``; a file
        listed without a size is digested in the smallest blocks)."""
        return blocks_kind(max(0, self.size))

    def known_digest(self) -> str | None:
        """The digest of :meth:`digest_kind` of the listed version, if this process
        read the whole file and remembered it (nothing is read here)."""
        known = _remembered(self, self.digest_kind())
        return known[1] if known is not None and known[0] == self.size else None

    def fingerprint(self, kind: DigestKind | None = None) -> tuple[int, str]:
        """The size and digest of ``kind`` (default :meth:`digest_kind`) of the file's
        bytes, exactly as listed (module docstring); raises as :meth:`read_bytes` does."""
        if self.problem:
            raise IngestError(self.problem)
        kind = kind or self.digest_kind()
        known = _remembered(self, kind)
        if known is not None:
            return known
        digester = Digester(kind)
        try:
            size = self._digest_s3(digester) if self.root.startswith("s3://") else (
                self._digest_local(digester))
        except IngestError:
            raise
        except Exception as exc:  # noqa: BLE001 - every I/O failure becomes one clear line
            raise IngestError(f"{self.name}: cannot read file: {exc}") from exc
        if self.size >= 0 and size != self.size:
            raise self._changed(f"listed with {self.size} bytes, read {size}")
        digest = digester.text()
        remember_digest(self, size, digest)
        return size, digest

    def _digest_local(self, digester: Digester) -> int:
        with _local_path(self.root, self.name).open("rb") as fh:
            while piece := fh.read(_DIGEST_PIECE):
                digester.update(piece)
                read_counter.add(self.url, len(piece))
            after = os.fstat(fh.fileno())
        if self.version and _local_version(after) != self.version:
            raise self._changed("replaced or modified since it was listed")
        return digester.size

    def _digest_s3(self, digester: Digester) -> int:
        body = self._get_s3()["Body"]
        while piece := body.read(_DIGEST_PIECE):
            digester.update(piece)
            read_counter.add(self.url, len(piece))
        return digester.size

    def local_path(self) -> Path | None:
        """The local path of the file (None on S3); :class:`IngestError` for a bad name."""
        if self.problem:
            raise IngestError(self.problem)
        if self.root.startswith("s3://"):
            return None
        return _local_path(self.root, self.name)

    def check_local_version(self, st: os.stat_result) -> None:
        """:class:`LandingFileChanged` unless ``st`` (of :meth:`local_path`, taken after
        reading it) is the version and size that were listed."""
        if self.version and _local_version(st) != self.version:
            raise self._changed("replaced or modified since it was listed")
        if self.size >= 0 and st.st_size != self.size:
            raise self._changed(f"listed with {self.size} bytes, now {st.st_size}")

    def _read_local(self) -> bytes:  # counted by read_bytes
        with _local_path(self.root, self.name).open("rb") as fh:
            data = fh.read()
            after = os.fstat(fh.fileno())
        if self.version and _local_version(after) != self.version:
            raise self._changed("replaced or modified since it was listed")
        return data

    def _read_s3(self) -> bytes:
        data: bytes = self._get_s3()["Body"].read()
        return data

    def _get_s3(self, byte_range: str = "") -> Any:
        """The listed version of the object (``get_object`` pinned to its ETag), or the
        ``byte_range`` of it (an HTTP ``Range``, e.g. ``bytes=0-99``)."""
        from botocore.exceptions import ClientError

        bucket, prefix = _split_s3(self.root)
        pinned: dict[str, str] = {"IfMatch": self.version} if self.version else {}
        if byte_range:
            pinned["Range"] = byte_range
        try:
            response = _s3_client().get_object(
                Bucket=bucket, Key=_join(prefix, self.name), **pinned
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("PreconditionFailed", "412"):
                raise self._changed(f"its ETag is no longer {self.version}") from exc
            raise
        return response

    def _changed(self, how: str) -> LandingFileChanged:
        return LandingFileChanged(
            f"{self.name}: changed while being ingested ({how}); still being written?"
        )


def check_name(name: str) -> str:
    """Return ``name`` if it is a safe landing-relative name, else raise IngestError."""
    shown = repr(name)
    if not name:
        raise IngestError(f"{shown}: empty file name")
    # A printable name holds no control, bidi or surrogate character: only the others
    # are looked at character by character (that was most of listing a large landing).
    if not name.isprintable():
        if any(_is_control(ch) for ch in name):
            raise IngestError(f"{shown}: file name contains a control character")
        if any(unicodedata.category(ch) == "Cs" for ch in name):  # undecodable bytes
            raise IngestError(f"{shown}: file name is not valid UTF-8")
    if "\\" in name:
        raise IngestError(f"{shown}: file name contains a backslash")
    if name.startswith("/"):
        raise IngestError(f"{shown}: file name is absolute")
    for part in name.split("/"):
        if part in ("", ".", ".."):
            raise IngestError(f"{shown}: file name escapes or is not normalised ({part!r})")
    return name


def list_landing(url: str, *, page_size: int | None = None) -> list[LandingFile]:
    """Every batch file under the landing location ``url``, sorted by name.

    ``page_size`` bounds the keys per S3 list request (tests use it to force paging).
    """
    root = normalise_root(url)
    files = list(_list_s3(root, page_size) if root.startswith("s3://") else _list_local(root))
    files.sort(key=lambda f: f.name)
    return files


def is_hidden(name: str) -> bool:
    """Whether a landing-relative name is a writer's temporary or marker file: one of
    its components begins with ``.`` or ``_`` (``.`` and ``..`` are bad names instead)."""
    return any(part.startswith((".", "_")) and part not in (".", "..") for part in name.split("/"))


def _name_problem(name: str) -> str:
    try:
        check_name(name)
    except IngestError as exc:
        return str(exc)
    return ""


def pending(files: Iterable[LandingFile], ingested_names: Iterable[str]) -> list[LandingFile]:
    """The files whose names have not been ingested yet, in name order."""
    done = set(ingested_names)
    return sorted((f for f in files if f.name not in done), key=lambda f: f.name)


def landing_file(url: str, name: str) -> LandingFile:
    """The file called ``name`` in the landing location ``url`` (not checked to exist)."""
    root = normalise_root(url)
    check_name(name)
    if not root.startswith("s3://"):
        _local_path(root, name)  # rejects symlink escapes
    return LandingFile(name=name, root=root)


def normalise_root(url: str) -> str:
    """``s3://bucket/prefix`` (no trailing slash) or an absolute local directory path."""
    if not url:
        raise ConfigError("empty landing location")
    if url.startswith("s3://"):
        bucket, prefix = _split_s3(url)
        return f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
    if url.startswith("file://"):
        parsed = urlparse(url)
        if parsed.netloc not in ("", "localhost"):
            raise ConfigError(f"{redact_url(url)}: file URLs must name a local path (file:///dir)")
        path = unquote(parsed.path)
    elif "://" in url:
        raise ConfigError(f"{redact_url(url)}: unsupported landing location (use a directory or s3://)")
    else:
        path = url
    return os.path.abspath(path)


# --- local directories ------------------------------------------------------------


def _list_local(root: str) -> Iterable[LandingFile]:
    if not os.path.isdir(root):
        raise IngestError(f"{root}: landing directory does not exist")
    real_root = os.path.realpath(root)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not is_hidden(d))
        below = os.path.relpath(dirpath, root).replace(os.sep, "/")  # once per directory
        prefix = "" if below == "." else below + "/"
        for filename in filenames:
            if not filename.lower().endswith(SUFFIXES) or is_hidden(filename):
                continue
            full = os.path.join(dirpath, filename)
            name = prefix + filename
            problem = _name_problem(name)
            if problem:
                yield LandingFile(name=name, root=root, problem=problem)
                continue
            # os.walk does not follow directory symlinks, so only a file that is itself
            # a symlink can resolve outside the root: only it pays for a realpath
            # (six lstat calls and more per file made listing grow with the landing).
            try:
                st = os.lstat(full)
                if stat.S_ISLNK(st.st_mode):
                    if not _inside(real_root, os.path.realpath(full)):
                        problem = f"{name}: symlink points outside the landing location"
                        yield LandingFile(name=name, root=root, problem=problem)
                        continue
                    st = os.stat(full)
            except OSError:  # vanished since the directory was read
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            yield LandingFile(name=name, root=root, size=st.st_size, version=_local_version(st))


def _local_version(st: os.stat_result) -> str:
    """What identifies one version of a local file: a rewrite in place changes the
    modification time, an atomic replace (rename) the inode."""
    return f"{st.st_ino}:{st.st_mtime_ns}"


def _local_path(root: str, name: str) -> Path:
    check_name(name)
    full = os.path.join(root, *name.split("/"))
    if not _inside(os.path.realpath(root), os.path.realpath(full)):
        raise IngestError(f"{name}: path resolves outside the landing location")
    return Path(full)


def _inside(real_root: str, real_path: str) -> bool:
    return os.path.commonpath([real_root, real_path]) == real_root


# Bidirectional overrides and isolates: they make a name display as another name.
_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _is_control(ch: str) -> bool:
    return unicodedata.category(ch) in ("Cc", "Zl", "Zp") or ch in _BIDI_CONTROLS


# --- S3 ---------------------------------------------------------------------------


def _split_s3(url: str) -> tuple[str, str]:
    rest = url[len("s3://") :]
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ConfigError(f"{redact_url(url)}: S3 landing location needs a bucket (s3://bucket/prefix)")
    return bucket, prefix.strip("/")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


@functools.lru_cache(maxsize=8)
def _s3_client_for(endpoint: str | None, region: str | None) -> Any:
    import boto3  # local import: only S3 users pay for it

    return boto3.client("s3", endpoint_url=endpoint or None, region_name=region or None)


def _s3_client() -> Any:
    # Keyed on the environment so a test (or a task) that changes AWS_ENDPOINT_URL gets
    # a client for the new endpoint rather than a stale cached one.
    return _s3_client_for(
        os.environ.get("AWS_ENDPOINT_URL"),
        os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"),
    )


def _list_s3(root: str, page_size: int | None) -> Iterable[LandingFile]:
    bucket, prefix = _split_s3(root)
    list_prefix = f"{prefix}/" if prefix else ""
    try:
        paginator = _s3_client().get_paginator("list_objects_v2")
        config = {"PageSize": page_size} if page_size else {}
        pages = paginator.paginate(Bucket=bucket, Prefix=list_prefix, PaginationConfig=config)
        for page in pages:
            for obj in page.get("Contents", []):
                key: str = obj["Key"]
                name = key[len(list_prefix) :]
                if name.endswith("/") or not name.lower().endswith(SUFFIXES):
                    continue
                if is_hidden(name):
                    continue
                problem = _name_problem(name)
                etag = "" if problem else str(obj.get("ETag") or "")
                yield LandingFile(
                    name=name, root=root, size=int(obj["Size"]), version=etag, problem=problem
                )
    except (IngestError, ConfigError):
        raise
    except Exception as exc:  # noqa: BLE001 - any listing failure is one clear line
        raise IngestError(f"{root}: cannot list landing location: {exc}") from exc
