"""S3 landing locations against a real moto server process (fixtures in tests/services.py)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from tests.landing.helpers import jsonl, parquet
from upsert_core.errors import IngestError, LandingFileChanged
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
    put(s3_client, s3_bucket, "land/x\x01.jsonl")
    evil, ok, ctl = list_landing(f"s3://{s3_bucket}/land")  # listed, each with its problem
    assert not ok.problem
    with pytest.raises(IngestError, match=r"'\.\./evil\.jsonl'"):
        evil.read_bytes()
    with pytest.raises(IngestError, match="control character"):
        ctl.read_bytes()


def test_hidden_keys_after_the_prefix_are_never_listed(
    s3_env: str, s3_client: Any, s3_bucket: str
) -> None:
    for key in ["_p/land/a.jsonl", "_p/land/_temporary/0/part-0.jsonl", "_p/land/.x.jsonl",
                "_p/land/_SUCCESS.csv", "_p/land/d/.crc.parquet", "_p/land/d/b.jsonl"]:
        put(s3_client, s3_bucket, key)
    # Only the part after the prefix counts: "_p/" is the landing's own location.
    assert [f.name for f in list_landing(f"s3://{s3_bucket}/_p/land")] == ["a.jsonl", "d/b.jsonl"]


def test_every_read_gets_the_listed_version_or_leaves_the_file_pending(
    s3_env: str, s3_client: Any, s3_bucket: str
) -> None:
    put(s3_client, s3_bucket, "v/a.jsonl", b'{"key": 1}\n')
    [listed] = list_landing(f"s3://{s3_bucket}/v")
    assert listed.version.strip('"') and listed.read_bytes() == b'{"key": 1}\n'
    # Overwritten with the same size after the listing: the pinned read refuses it.
    put(s3_client, s3_bucket, "v/a.jsonl", b'{"key": 2}\n')
    with pytest.raises(LandingFileChanged, match="^a.jsonl: changed while being ingested"):
        listed.read_bytes()
    [relisted] = list_landing(f"s3://{s3_bucket}/v")
    assert relisted.read_bytes() == b'{"key": 2}\n'


def test_missing_object_and_missing_bucket_are_file_errors(s3_env: str, s3_bucket: str) -> None:
    with pytest.raises(IngestError, match="^gone.jsonl: cannot read file"):
        landing_file(f"s3://{s3_bucket}/x", "gone.jsonl").read_bytes()
    with pytest.raises(IngestError, match="cannot list landing location"):
        list_landing(f"s3://{s3_bucket}-missing/x")
