"""``redact_url`` hides URL secrets and nothing else; URL errors never echo a password."""

from __future__ import annotations

import pytest

from upsert_core.errors import ConfigError, UpsertPlatformError
from upsert_core.persist.location.consensus_sql import SqlConsensus
from upsert_core.persist.location.urls import open_blob, open_consensus, redact_url
from upsert_core.redact import is_secret_name

SECRET = "Sup3r'S3cret"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgresql+psycopg://u:pw@h:5432/db", "postgresql+psycopg://u:***@h:5432/db"),
        ("postgresql://u:p@ss/w@rd@h/db", "postgresql://u:***@h/db"),
        ("x 'postgres://a:b@h/d' y", "x 'postgres://a:***@h/d' y"),
        (
            "postgresql://u@h/db?password=pw&sslmode=require",
            "postgresql://u@h/db?password=***&sslmode=require",
        ),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        # the query string: any case, percent-encoded names, libpq's sslpassword
        ("postgresql://u@h/db?PASSWORD=pw", "postgresql://u@h/db?PASSWORD=***"),
        ("postgresql://u@h/db?PassWord=pw&x=1", "postgresql://u@h/db?PassWord=***&x=1"),
        ("postgresql://u@h/db?%70assword=pw", "postgresql://u@h/db?%70assword=***"),
        ("postgresql://u@h/db?password=p%40s%26s", "postgresql://u@h/db?password=***"),
        ("postgresql://u@h/db?sslmode=require&sslpassword=pw",
         "postgresql://u@h/db?sslmode=require&sslpassword=***"),
        ("postgresql://u@h/db?password=a;b#c&port=1", "postgresql://u@h/db?password=***&port=1"),
        ("postgresql://u:one@h/db?password=two", "postgresql://u:***@h/db?password=***"),
        # files that hold secrets are paths, not secrets: shown
        ("postgresql://u@h/db?sslkey=/k.pem&passfile=/p",
         "postgresql://u@h/db?sslkey=/k.pem&passfile=/p"),
        # libpq keyword/value strings, as drivers quote them in errors
        ("host=h password=pw user=u", "host=h password=*** user=u"),
        ("host=h password='p w' user=u", "host=h password=*** user=u"),
        # S3: credentials in the userinfo or in presigned / explicit query parameters
        ("s3://AKIDEXAMPLE:wJalrXUt/K7MDENG@bucket/p", "s3://AKIDEXAMPLE:***@bucket/p"),
        ("s3://b/p?aws_secret_access_key=sk&aws_session_token=tk&region=eu",
         "s3://b/p?aws_secret_access_key=***&aws_session_token=***&region=eu"),
        ("https://b.s3.amazonaws.com/k?X-Amz-Credential=AKID%2F20240101&X-Amz-Signature=ab12",
         "https://b.s3.amazonaws.com/k?X-Amz-Credential=***&X-Amz-Signature=***"),
        ("http://u:pw@127.0.0.1:9000", "http://u:***@127.0.0.1:9000"),
        ("sqlite:////tmp/a:b@c.db", "sqlite:////tmp/a:b@c.db"),
        (
            "s3://bucket/p?endpoint_url=http://127.0.0.1:9000",
            "s3://bucket/p?endpoint_url=http://127.0.0.1:9000",
        ),
        ("file:///tmp/x", "file:///tmp/x"),
    ],
)
def test_redact_url(text: str, expected: str) -> None:
    assert redact_url(text) == expected


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql+psycopg://postgres:{SECRET}@127.0.0.1:notaport/test",
        f"postgresql+psycopg://postgres:{SECRET}@[::1/test",
        f"mysql://postgres:{SECRET}@127.0.0.1/test",
        f"postgresql+nodriver://postgres:{SECRET}@127.0.0.1/test",
        f"sqlite+pysqlite://u:{SECRET}@/:memory:",
        f"nonsense-{SECRET}",
    ],
)
def test_bad_consensus_urls_are_config_errors_without_the_password(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        open_consensus(url)
    assert "S3cret" not in str(info.value) or url.startswith("nonsense")


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql+psycopg://postgres:{SECRET}@127.0.0.1:notaport/test",
        f"mysql://postgres:{SECRET}@127.0.0.1/test",
        f"sqlite+pysqlite://u:{SECRET}@/:memory:",
    ],
)
def test_sql_consensus_errors_never_echo_the_password(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        SqlConsensus(url)
    assert "S3cret" not in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql+psycopg://postgres@127.0.0.1:1/test?password={SECRET}",
        f"postgresql+psycopg://postgres@127.0.0.1:1/test?sslmode=disable&PASSWORD={SECRET}",
        f"postgresql+psycopg://postgres:{SECRET}@127.0.0.1:1/test",
    ],
)
def test_unreachable_consensus_errors_never_echo_a_query_string_password(url: str) -> None:
    """SQLAlchemy's ``hide_password`` hid only the userinfo password."""
    consensus = SqlConsensus(url, reconnect_s=0, connect_timeout_s=1)
    with pytest.raises(UpsertPlatformError) as info:
        consensus.head("s")
    assert "S3cret" not in str(info.value) and "***" in str(info.value), str(info.value)
    assert "127.0.0.1:1/test" in str(info.value)  # still says where it tried


def test_redaction_is_idempotent_and_keeps_plain_text() -> None:
    text = "cannot list s3://b/p?region=eu: token bucket full; key=value"
    assert redact_url(text) == text
    once = redact_url(f"postgresql://u:{SECRET}@h/db?password={SECRET}")
    assert redact_url(once) == once and "S3cret" not in once
    assert is_secret_name("AWS_SECRET_ACCESS_KEY") and is_secret_name("x-amz-security-token")
    assert not is_secret_name("sslkey") and not is_secret_name("endpoint_url")


@pytest.mark.parametrize(
    "url", [f"ftp://u:{SECRET}@h/x", f"s3://u:{SECRET}@/p", f"file://u:{SECRET}@h/x?q=1"]
)
def test_bad_blob_urls_never_echo_the_password(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        open_blob(url)
    assert "S3cret" not in str(info.value)
