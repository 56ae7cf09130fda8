"""``redact_url`` hides URL passwords and nothing else; URL errors never echo a password."""

from __future__ import annotations

import pytest

from upsert_core.errors import ConfigError
from upsert_core.persist.consensus_sql import SqlConsensus
from upsert_core.persist.urls import open_blob, open_consensus, redact_url

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
    "url", [f"ftp://u:{SECRET}@h/x", f"s3://u:{SECRET}@/p", f"file://u:{SECRET}@h/x?q=1"]
)
def test_bad_blob_urls_never_echo_the_password(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        open_blob(url)
    assert "S3cret" not in str(info.value)
