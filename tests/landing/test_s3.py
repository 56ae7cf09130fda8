"""S3 landing locations against a real moto server process (fixtures in tests/services.py)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from tests.landing.helpers import jsonl, parquet
from upsert_core.errors import IngestError
from upsert_core.landing import (
    SourceSchema,
    landing_file,
    list_landing,
    pending,
    validate_file,
)
from upsert_core.landing.listing import _s3_client

pytestmark = pytest.mark.s3


def put(client: Any, bucket: str, key: str, body: bytes = b"") -> None:
    client.put_object(Bucket=bucket, Key=key, Body=body)


def test_lists_under_the_prefix_sorted_across_pages(
    s3_env: str, s3_client: Any, s3_bucket: str
) -> None:
    names = ["c.jsonl", "a.parquet", "sub/b.csv", "B.jsonl", "e.jsonl", "d.jsonl", "0.jsonl"]
    for name in names:
        put(s3_client, s3_bucket, f"land/{name}")
    put(s3_client, s3_bucket, "land/readme.txt")
    put(s3_client, s3_bucket, "land/dir.jsonl/")  # a "directory" marker, not a file
    put(s3_client, s3_bucket, "landing2/x.jsonl")  # a sibling prefix, not under land/
    put(s3_client, s3_bucket, "top.jsonl")

    requests: list[str] = []
    _s3_client().meta.events.register(
        "before-send.s3.ListObjectsV2", lambda request, **_: requests.append(request.url)
    )
    files = list_landing(f"s3://{s3_bucket}/land/", page_size=2)
    assert len(requests) >= 5  # 9 keys under land/, two per page

    assert [f.name for f in files] == sorted(names)
    assert {f.root for f in files} == {f"s3://{s3_bucket}/land"}
    assert [f.name for f in list_landing(f"s3://{s3_bucket}")][-1] == "top.jsonl"
    assert [f.name for f in pending(files, {"B.jsonl", "c.jsonl"})][:2] == ["0.jsonl", "a.parquet"]


def test_reads_and_validates_files_from_s3(s3_env: str, s3_client: Any, s3_bucket: str) -> None:
    put(s3_client, s3_bucket, "in/1.jsonl", jsonl({"key": 1, "offset": 1, "v": "a"}, "{bad"))
    table = pa.table({"key": [2], "offset": [2], "w": [0.5]})
    put(s3_client, s3_bucket, "in/2.parquet", parquet(table))

    first, second = list_landing(f"s3://{s3_bucket}/in")
    assert first.size > 0
    b1 = validate_file(first, SourceSchema())
    b2 = validate_file(second, b1.schema)

    assert b1.positions.tolist() == [1] and [e.row for e in b1.errors] == [2]
    assert b2.schema.names == ("key", "offset", "v", "w")
    # A file handle rebuilt from its name (as a Spark task would) reads the same bytes.
    assert landing_file(f"s3://{s3_bucket}/in", "1.jsonl").read_bytes() == first.read_bytes()


def test_an_escaping_key_is_rejected_naming_the_file(
    s3_env: str, s3_client: Any, s3_bucket: str
) -> None:
    put(s3_client, s3_bucket, "land/ok.jsonl")
    put(s3_client, s3_bucket, "land/../evil.jsonl")
    with pytest.raises(IngestError, match=r"'\.\./evil\.jsonl'"):
        list_landing(f"s3://{s3_bucket}/land")


def test_missing_object_and_missing_bucket_are_file_errors(s3_env: str, s3_bucket: str) -> None:
    with pytest.raises(IngestError, match="^gone.jsonl: cannot read file"):
        landing_file(f"s3://{s3_bucket}/x", "gone.jsonl").read_bytes()
    with pytest.raises(IngestError, match="cannot list landing location"):
        list_landing(f"s3://{s3_bucket}-missing/x")
