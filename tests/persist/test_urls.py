"""Opening Consensus and Blob stores from URLs."""

from __future__ import annotations

from pathlib import Path

import pytest

from upsert_core.errors import ConfigError
from upsert_core.persist.location import CasCommitted, VersionedData
from upsert_core.persist.location.blob_local import LocalBlob
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.blob_s3 import S3Blob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.location.consensus_sql import SqlConsensus
from upsert_core.persist.location.urls import open_blob, open_consensus


def test_mem_urls_fresh_or_shared_by_name() -> None:
    assert isinstance(open_consensus("mem://"), MemoryConsensus)
    assert open_consensus("mem://") is not open_consensus("mem://")
    assert open_consensus("mem://test-urls-a") is open_consensus("mem://test-urls-a")
    assert open_consensus("mem://test-urls-a") is not open_consensus("mem://test-urls-b")
    assert isinstance(open_blob("mem://"), MemoryBlob)
    assert open_blob("mem://") is not open_blob("mem://")
    assert open_blob("mem://test-urls-a") is open_blob("mem://test-urls-a")


def test_sqlite_url(tmp_path: Path) -> None:
    c = open_consensus(f"sqlite:///{tmp_path}/c.db")
    assert isinstance(c, SqlConsensus) and c.dialect == "sqlite"
    assert c.compare_and_set("k", None, VersionedData(1, b"x")) == CasCommitted()
    assert (tmp_path / "c.db").exists()


@pytest.mark.postgres
@pytest.mark.parametrize("scheme", ["postgresql+psycopg", "postgresql", "postgres"])
def test_postgres_urls(fresh_postgres_url: str, scheme: str) -> None:
    url = scheme + "://" + fresh_postgres_url.split("://", 1)[1]
    c = open_consensus(url)
    assert isinstance(c, SqlConsensus) and c.dialect == "postgresql"
    assert c.head("k") is None


def test_file_urls_absolute_and_relative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = open_blob(f"file://{tmp_path}/abs")
    assert isinstance(b, LocalBlob) and b.root == tmp_path / "abs"
    monkeypatch.chdir(tmp_path)
    rel = open_blob("file://rel/dir")
    assert isinstance(rel, LocalBlob) and rel.root == tmp_path / "rel" / "dir"
    rel.set("k", b"v")
    assert (tmp_path / "rel" / "dir" / "k").read_bytes() == b"v"


@pytest.mark.s3
def test_s3_url_uses_environment_endpoint(s3_env: str, s3_bucket: str) -> None:
    b = open_blob(f"s3://{s3_bucket}/deep/prefix")
    assert isinstance(b, S3Blob) and b.bucket == s3_bucket and b.prefix == "deep/prefix/"
    b.set("k", b"v")
    assert b.get("k") == b"v"
    direct = S3Blob(s3_bucket, "", s3_env)
    assert direct.get("deep/prefix/k") == b"v"


@pytest.mark.s3
def test_s3_url_endpoint_parameter(
    s3_env: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    b = open_blob(f"s3://{s3_bucket}?endpoint_url={s3_env}&region=us-east-1")
    assert isinstance(b, S3Blob) and b.prefix == ""
    b.set("k", b"v")
    assert [m.key for m in b.list_keys("")] == ["k"]


@pytest.mark.parametrize(
    "url",
    ["", "nothing", "ftp://x/y", "mysql://u@h/db", "sqlite://", "sqlite:///:memory:"],
)
def test_bad_consensus_urls(url: str) -> None:
    with pytest.raises(ConfigError):
        open_consensus(url)


@pytest.mark.parametrize(
    "url",
    ["", "nothing", "ftp://x/y", "file://", "s3:///no-bucket", "s3://b/p?bogus=1", "gs://b/p"],
)
def test_bad_blob_urls(url: str) -> None:
    with pytest.raises(ConfigError):
        open_blob(url)
