"""PostgreSQL consensus through restarts: connects are retried for ``reconnect_s``.

A loopback proxy (``tests/faults/tcp_proxy.py``) stands in for the server going away
and coming back on the same port; the shared PostgreSQL server is never touched.
Refusals that need the user (unknown database, DNS) fail at once, and the window is
configured by ``UPSERT_CONSENSUS_RECONNECT_S`` (bad values are a ConfigError).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.faults.tcp_proxy import TcpProxy
from upsert_core.errors import ConfigError, DeterminateError, LocationUnreachable
from upsert_core.persist.location import CasCommitted, VersionedData
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_sql import SqlConsensus
from upsert_core.persist.location.sql_driver import pg_connect_is_transient
from upsert_core.persist.location.urls import RECONNECT_ENV, open_consensus, reconnect_seconds
from upsert_core.persist.shard import Shard

UPSTREAM = ("127.0.0.1", 5432)


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    p = TcpProxy(UPSTREAM)
    p.start()
    yield p
    p.stop()


def _url(port: int, database: str = "test") -> str:
    return f"postgresql+psycopg://postgres@127.0.0.1:{port}/{database}"


@pytest.mark.parametrize(
    ("message", "transient"),
    [
        ('connection to server at "127.0.0.1", port 1 failed: Connection refused', True),
        ("server closed the connection unexpectedly", True),
        ("connection failed: timeout expired", True),
        ("FATAL:  the database system is starting up", True),
        ("FATAL:  the database system is shutting down", True),
        ("FATAL:  sorry, too many clients already", True),
        ('FATAL:  database "nope" does not exist', False),
        ('FATAL:  password authentication failed for user "u"', False),
        ('FATAL:  role "nouser" does not exist', False),
        ('could not translate host name "db.invalid" to address', False),
        ("failed to resolve host 'db.invalid': [Errno -2] Name or service not known", False),
        ('invalid sslmode value: "bogus"', False),
        ("fe_sendauth: no password supplied", False),
        ("server does not support SSL, but SSL was required", False),
    ],
)
def test_which_connect_failures_are_retried(message: str, transient: bool) -> None:
    assert pg_connect_is_transient(message) is transient


@pytest.mark.postgres
def test_a_server_coming_back_within_the_window_is_waited_for(proxy: TcpProxy) -> None:
    key = f"reconnect-{uuid.uuid4().hex[:10]}"
    consensus = SqlConsensus(_url(proxy.port), reconnect_s=30)
    assert consensus.head(key) is None  # connected and created the table once
    proxy.stop()  # pooled connections are reset, new ones refused
    timer = threading.Timer(0.8, proxy.start)
    timer.start()
    try:
        result = consensus.compare_and_set(key, None, VersionedData(0, b"x"))
    finally:
        timer.join()
    assert isinstance(result, CasCommitted)
    assert consensus.head(key) == VersionedData(0, b"x")
    consensus.close()


@pytest.mark.postgres
def test_a_server_that_stays_down_fails_after_the_window(proxy: TcpProxy) -> None:
    consensus = SqlConsensus(_url(proxy.port), reconnect_s=0.4)
    proxy.stop()
    with pytest.raises(DeterminateError) as info:
        consensus.head("k")
    message = str(info.value)
    assert "cannot connect to consensus" in message and "retried for" in message
    assert str(proxy.port) in message


@pytest.mark.postgres
def test_an_unknown_database_fails_at_once_without_retrying() -> None:
    # A huge window would hang this test if the refusal were retried.
    consensus = SqlConsensus(_url(5432, "no_such_db_" + uuid.uuid4().hex[:8]),
                             reconnect_s=3600)
    with pytest.raises(DeterminateError) as info:
        consensus.head("k")
    assert "does not exist" in str(info.value) and "retried for" not in str(info.value)


@pytest.mark.timeout(120)
def test_an_unknown_host_fails_at_once_without_retrying() -> None:
    consensus = SqlConsensus("postgresql+psycopg://u@db.invalid:5432/x", reconnect_s=3600)
    with pytest.raises(DeterminateError) as info:
        consensus.head("k")
    assert "retried for" not in str(info.value)


@pytest.mark.postgres
def test_the_shard_does_not_multiply_the_window(proxy: TcpProxy) -> None:
    """A consensus that waited out its window is reported, not retried again above it."""
    consensus = SqlConsensus(_url(proxy.port), reconnect_s=0.3)
    calls = 0
    inner = consensus._retrying

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return inner(*args, **kwargs)

    consensus._retrying = counting  # type: ignore[method-assign]
    proxy.stop()
    with pytest.raises(LocationUnreachable, match="retried for"):
        Shard.open(consensus, MemoryBlob(), "s", create=True)
    assert calls == 1


def test_the_window_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RECONNECT_ENV, "2.5")
    assert reconnect_seconds() == 2.5
    monkeypatch.setenv(RECONNECT_ENV, "")
    assert reconnect_seconds() == 15.0
    for bad in ("-1", "soon", "nan", "inf"):
        monkeypatch.setenv(RECONNECT_ENV, bad)
        with pytest.raises(ConfigError, match=RECONNECT_ENV):
            open_consensus("postgresql://postgres@127.0.0.1:5432/test")
    with pytest.raises(ConfigError, match="reconnect_s"):
        SqlConsensus(_url(5432), reconnect_s=-1)
