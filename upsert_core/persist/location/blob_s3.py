"""A durable :class:`~upsert_core.persist.location.Blob` on S3 (or MinIO, or moto).

Invariants kept:

- Key ``k`` is the object ``<prefix>/<k>`` in ``bucket`` (no prefix: ``k`` itself); keys
  follow the local store's rules (no ``.``, ``..`` or empty segments), so none leaves the prefix;
  ``list_keys`` strips the prefix again, so callers never see it.
- ``set`` is one ``PutObject``: S3 replaces objects atomically.
- ``get`` of a missing object returns ``None``; ``delete`` is idempotent (``None`` when
  the object was missing) and follows pagination when listing.
- Transient failures (throttling, 5xx, dropped connections) are retried by botocore's
  ``standard`` retry mode. What still fails is mapped: could not connect or a 4xx ->
  ``DeterminateError``; a write that timed out or lost its connection after sending,
  or a 5xx on a write -> ``IndeterminateError``. Reads are always determinate.
- ``open_reader`` (ranged reads) fetches the object's tail (where Parquet keeps its
  footer) with one suffix-range GET that also tells the size and the ETag; every
  further read is one ranged GET pinned to that ETag (``If-Match``), so a reader never
  mixes two versions: an object deleted or replaced under an open reader makes its
  next fetch raise ``FileNotFoundError``.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)

from upsert_core.errors import ConfigError, DeterminateError, IndeterminateError, LocationError
from upsert_core.persist.location import BlobMetadata, BlobReader
from upsert_core.persist.location.blob_local import key_segments
from upsert_core.persist.location.blob_memory import check_blob_value
from upsert_core.redact import redact_url

_MISSING_CODES = frozenset({"404", "NoSuchKey", "NotFound"})
_CHANGED_CODES = frozenset({"412", "PreconditionFailed"})
_INVALID_RANGE_CODES = frozenset({"416", "InvalidRange"})
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")

TAIL_READ_BYTES = 64 * 1024
"""Bytes fetched from the end of an object when a reader opens it (Parquet footer)."""


def _status(e: ClientError) -> int:
    meta: dict[str, Any] = e.response.get("ResponseMetadata", {})
    return int(meta.get("HTTPStatusCode", 0) or 0)


def _code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def classify_s3_error(e: Exception, *, wrote: bool, what: str) -> LocationError:
    """Map a botocore failure (after botocore's own retries) to the location errors."""
    if isinstance(e, EndpointConnectionError | ConnectTimeoutError | NoCredentialsError):
        return DeterminateError(f"{what}: could not reach S3: {e}")
    if isinstance(e, ClientError):
        status = _status(e)
        if wrote and (status >= 500 or status == 0):
            return IndeterminateError(f"{what}: S3 error {status} {_code(e)}, outcome unknown")
        return DeterminateError(f"{what}: S3 error {status} {_code(e)}: {e}")
    if wrote and isinstance(e, ReadTimeoutError | ConnectionClosedError | BotoCoreError):
        return IndeterminateError(f"{what}: request sent but no answer, outcome unknown: {e}")
    return DeterminateError(f"{what}: {e}")


def _missing(e: ClientError) -> bool:
    return _code(e) in _MISSING_CODES or _status(e) == 404


class S3BlobReader:
    """Reads one version of an object with ranged GETs (see the module docstring).

    ``tail`` holds the object's last bytes, fetched when it was opened; reads that fall
    inside it cost no request.
    """

    def __init__(
        self, client: Any, bucket: str, name: str, where: str, size: int, etag: str,
        tail: bytes,
    ) -> None:
        self._client = client
        self._bucket = bucket
        self._name = name
        self._where = where
        self._size = size
        self._etag = etag
        self._tail = tail
        self._tail_start = size - len(tail)
        self._pos = 0
        self._closed = False

    @property
    def size(self) -> int:
        return self._size

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        self._check_open()
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET, /) -> int:
        self._check_open()
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}.get(whence)
        if base is None:
            raise ValueError(f"invalid whence {whence}")
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def read(self, size: int | None = -1, /) -> bytes:
        self._check_open()
        start = min(self._pos, self._size)
        end = self._size if size is None or size < 0 else min(self._size, start + size)
        if end <= start:
            return b""
        if start >= self._tail_start:
            data = self._tail[start - self._tail_start : end - self._tail_start]
        else:
            fetch_end = min(end, self._tail_start)
            data = self._fetch(start, fetch_end)
            if end > fetch_end:
                data += self._tail[: end - fetch_end]
        self._pos = end
        return data

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"reader of {self._where} is closed")

    def _fetch(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the version this reader opened."""
        what = f"read bytes {start}-{end - 1} of {self._where}"
        try:
            resp = self._client.get_object(
                Bucket=self._bucket, Key=self._name, Range=f"bytes={start}-{end - 1}",
                IfMatch=self._etag,
            )
            data = bytes(resp["Body"].read())
        except ClientError as e:
            if _missing(e):
                raise FileNotFoundError(f"{self._where} was deleted while being read") from e
            if _code(e) in _CHANGED_CODES or _status(e) == 412:
                raise FileNotFoundError(f"{self._where} was replaced while being read") from e
            raise classify_s3_error(e, wrote=False, what=what) from e
        except (BotoCoreError, OSError) as e:
            raise classify_s3_error(e, wrote=False, what=what) from e
        if len(data) != end - start:
            raise DeterminateError(f"{what}: got {len(data)} bytes")
        return data


class S3Blob:
    """Blob store in an S3 bucket under an optional key prefix.

    ``endpoint_url`` points at MinIO or a moto server (``None``: AWS, or the
    ``AWS_ENDPOINT_URL`` environment variable which boto3 honours itself). Credentials
    and region come from the arguments or boto3's usual chain.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        *,
        region_name: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        max_attempts: int = 5,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 30.0,
        list_page_size: int = 1000,
    ) -> None:
        if not bucket or "/" in bucket:
            raise ConfigError(f"invalid S3 bucket name {bucket!r}")
        self._bucket = bucket
        self._page_size = list_page_size
        prefix = prefix.strip("/")
        self._prefix = prefix + "/" if prefix else ""
        config = Config(
            retries={"max_attempts": max_attempts, "mode": "standard"},
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            s3={"addressing_style": "path"} if endpoint_url else None,
        )
        try:
            self._client = boto3.session.Session().client(
                "s3",
                endpoint_url=endpoint_url,
                region_name=region_name,
                aws_access_key_id=aws_access_key_id,
                aws_secret_access_key=aws_secret_access_key,
                config=config,
            )
        except (BotoCoreError, ValueError) as e:
            raise ConfigError(
                f"cannot configure S3 client for {redact_url(repr(endpoint_url))}:"
                f" {redact_url(str(e))}"
            ) from e

    @property
    def bucket(self) -> str:
        return self._bucket

    @property
    def prefix(self) -> str:
        """The object-name prefix, ``""`` or ending in ``/``."""
        return self._prefix

    def _name(self, key: str) -> str:
        # The same key rules as the local store: no '.'/'..'/empty segments, so a key
        # can never name an object outside the prefix, even on a server that
        # normalises paths.
        key_segments(key)
        return self._prefix + key

    def _where(self, key: str) -> str:
        return f"s3://{self._bucket}/{self._prefix}{key}"

    def get(self, key: str) -> bytes | None:
        name = self._name(key)
        try:
            resp = self._client.get_object(Bucket=self._bucket, Key=name)
            return bytes(resp["Body"].read())
        except ClientError as e:
            if _code(e) in _MISSING_CODES or _status(e) == 404:
                return None
            raise classify_s3_error(e, wrote=False, what=f"get {self._where(key)}") from e
        except (BotoCoreError, OSError) as e:
            raise classify_s3_error(e, wrote=False, what=f"get {self._where(key)}") from e

    def open_reader(self, key: str) -> BlobReader | None:
        name = self._name(key)
        where = self._where(key)
        what = f"open {where}"
        try:
            try:
                resp = self._client.get_object(
                    Bucket=self._bucket, Key=name, Range=f"bytes=-{TAIL_READ_BYTES}"
                )
            except ClientError as e:
                if _code(e) not in _INVALID_RANGE_CODES and _status(e) != 416:
                    raise
                # An empty object has no suffix range to return.
                resp = self._client.get_object(Bucket=self._bucket, Key=name)
            tail = bytes(resp["Body"].read())
        except ClientError as e:
            if _missing(e):
                return None
            raise classify_s3_error(e, wrote=False, what=what) from e
        except (BotoCoreError, OSError) as e:
            raise classify_s3_error(e, wrote=False, what=what) from e
        match = _CONTENT_RANGE.fullmatch(str(resp.get("ContentRange") or ""))
        size = int(match.group(3)) if match else len(tail)  # no range: the whole object
        if match and int(match.group(2)) != size - 1:
            raise DeterminateError(f"{what}: unexpected range {resp.get('ContentRange')}")
        return S3BlobReader(
            self._client, self._bucket, name, where, size, str(resp["ETag"]), tail
        )

    def set(self, key: str, value: bytes | memoryview) -> None:
        name = self._name(key)
        value = check_blob_value(value)
        try:
            self._client.put_object(Bucket=self._bucket, Key=name, Body=value)
        except (ClientError, BotoCoreError, OSError) as e:
            raise classify_s3_error(e, wrote=True, what=f"set {self._where(key)}") from e

    def delete(self, key: str) -> int | None:
        name = self._name(key)
        what = f"delete {self._where(key)}"
        try:
            head = self._client.head_object(Bucket=self._bucket, Key=name)
        except ClientError as e:
            if _code(e) in _MISSING_CODES or _status(e) == 404:
                return None
            raise classify_s3_error(e, wrote=False, what=what) from e
        except (BotoCoreError, OSError) as e:
            raise classify_s3_error(e, wrote=False, what=what) from e
        try:
            # SUBTLE: DeleteObject succeeds for missing objects too, so a racing delete
            # between the head and here is harmless; both callers report the size.
            self._client.delete_object(Bucket=self._bucket, Key=name)
        except (ClientError, BotoCoreError, OSError) as e:
            raise classify_s3_error(e, wrote=True, what=what) from e
        return int(head["ContentLength"])

    def list_keys(self, prefix: str) -> Iterator[BlobMetadata]:
        what = f"list s3://{self._bucket}/{self._prefix}{prefix}"
        found: list[BlobMetadata] = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self._bucket,
                Prefix=self._prefix + prefix,
                PaginationConfig={"PageSize": self._page_size},
            )
            for page in pages:
                for obj in page.get("Contents", ()):
                    found.append(BlobMetadata(obj["Key"][len(self._prefix) :], int(obj["Size"])))
        except (ClientError, BotoCoreError, OSError) as e:
            raise classify_s3_error(e, wrote=False, what=what) from e
        return iter(found)
