"""A durable :class:`~upsert_core.persist.location.Blob` on S3 (or MinIO, or moto).

Invariants kept:

- Key ``k`` is the object ``<prefix>/<k>`` in ``bucket`` (no prefix: ``k`` itself);
  ``list_keys`` strips the prefix again, so callers never see it.
- ``set`` is one ``PutObject``: S3 replaces objects atomically.
- ``get`` of a missing object returns ``None``; ``delete`` is idempotent (``None`` when
  the object was missing) and follows pagination when listing.
- Transient failures (throttling, 5xx, dropped connections) are retried by botocore's
  ``standard`` retry mode. What still fails is mapped: could not connect or a 4xx ->
  ``DeterminateError``; a write that timed out or lost its connection after sending,
  or a 5xx on a write -> ``IndeterminateError``. Reads are always determinate.
"""

from __future__ import annotations

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
from upsert_core.persist.blob_memory import check_blob_key, check_blob_value
from upsert_core.persist.location import BlobMetadata

_MISSING_CODES = frozenset({"404", "NoSuchKey", "NotFound"})


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
            raise ConfigError(f"cannot configure S3 client for {endpoint_url!r}: {e}") from e

    @property
    def bucket(self) -> str:
        return self._bucket

    @property
    def prefix(self) -> str:
        """The object-name prefix, ``""`` or ending in ``/``."""
        return self._prefix

    def _name(self, key: str) -> str:
        check_blob_key(key)
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

    def set(self, key: str, value: bytes) -> None:
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
