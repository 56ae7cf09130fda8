"""Listing the batch files of a landing location and opening them by name.

A landing location is a local directory (``/abs/dir``, ``rel/dir``, ``file:///abs/dir``)
or an S3 prefix (``s3://bucket/prefix``; ``AWS_ENDPOINT_URL`` is honoured).

Invariants:

- A file is identified by its *name*: its path relative to the landing root, with
  ``/`` separators. Only names ending in ``.parquet``, ``.jsonl`` or ``.csv`` are batch
  files; everything else in the location is ignored.
- :func:`list_landing` returns files sorted lexicographically by name (Python string
  order, i.e. by code point), so every run sees the same ingest order.
- A name can never point outside the landing location: absolute names, empty, ``.``
  or ``..`` components, backslashes, NUL and other control characters are rejected
  with an :class:`IngestError` naming the file, both when listing and when a name is
  turned back into a file (:func:`landing_file`). Local symlinks that resolve outside
  the root are rejected the same way.
- :class:`LandingFile` holds only strings and an int, so it pickles cheaply into a
  Spark task; it opens its bytes on demand, one file at a time.
"""

from __future__ import annotations

import functools
import os
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from upsert_core.errors import ConfigError, IngestError
from upsert_core.redact import redact_url

SUFFIXES: tuple[str, ...] = (".parquet", ".jsonl", ".csv")


@dataclass(frozen=True, order=True)
class LandingFile:
    """One batch file: ``name`` relative to ``root`` (a normalised landing URL)."""

    name: str
    root: str
    size: int = -1

    @property
    def suffix(self) -> str:
        """The batch format suffix, e.g. ``.jsonl``."""
        return os.path.splitext(self.name)[1].lower()

    @property
    def url(self) -> str:
        """The full location of the file."""
        return f"{self.root.rstrip('/')}/{self.name}"

    def read_bytes(self) -> bytes:
        """The whole file. Raises :class:`IngestError` naming the file if unreadable."""
        try:
            if self.root.startswith("s3://"):
                bucket, prefix = _split_s3(self.root)
                response = _s3_client().get_object(Bucket=bucket, Key=_join(prefix, self.name))
                data: bytes = response["Body"].read()
                return data
            return _local_path(self.root, self.name).read_bytes()
        except IngestError:
            raise
        except Exception as exc:  # noqa: BLE001 - every I/O failure becomes one clear line
            raise IngestError(f"{self.name}: cannot read file: {exc}") from exc


def check_name(name: str) -> str:
    """Return ``name`` if it is a safe landing-relative name, else raise IngestError."""
    shown = repr(name)
    if not name:
        raise IngestError(f"{shown}: empty file name")
    if any(_is_control(ch) for ch in name):
        raise IngestError(f"{shown}: file name contains a control character")
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
    for f in files:
        check_name(f.name)
    files.sort(key=lambda f: f.name)
    return files


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
        dirnames.sort()
        for filename in filenames:
            if not filename.lower().endswith(SUFFIXES):
                continue
            full = os.path.join(dirpath, filename)
            name = os.path.relpath(full, root).replace(os.sep, "/")
            check_name(name)
            if not _inside(real_root, os.path.realpath(full)):
                raise IngestError(f"{name}: symlink points outside the landing location")
            if not os.path.isfile(full):
                continue
            yield LandingFile(name=name, root=root, size=os.path.getsize(full))


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
                yield LandingFile(name=check_name(name), root=root, size=int(obj["Size"]))
    except (IngestError, ConfigError):
        raise
    except Exception as exc:  # noqa: BLE001 - any listing failure is one clear line
        raise IngestError(f"{root}: cannot list landing location: {exc}") from exc
