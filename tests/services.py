"""Session fixtures for the real services tests talk to: PostgreSQL and a moto S3 server.

- ``postgres_url``: a SQLAlchemy URL (``postgresql+psycopg``) whose ``search_path`` is
  a fresh schema created for this test session and dropped at its end.
- ``fresh_postgres_url``: the same for one test (a schema of its own, dropped after).
- ``s3_endpoint``: the URL of a ``moto_server`` PROCESS started on a free port for the
  session, waited for, and killed at its end.
- ``s3_bucket``: a fresh bucket on that server for one test.
- ``s3_env``: sets ``AWS_ENDPOINT_URL`` and dummy credentials for one test, so code that
  opens ``s3://`` URLs through the environment reaches the moto server.

A service that cannot be reached is a test failure with a clear message, never a skip.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import boto3
import psycopg
import pytest

__all__ = [
    "AWS_TEST_CREDENTIALS",
    "PG_ADMIN_DSN",
    "fresh_postgres_url",
    "postgres_schema_factory",
    "postgres_url",
    "s3_bucket",
    "s3_client",
    "s3_endpoint",
    "s3_env",
]

PG_ADMIN_DSN = os.environ.get("UPSERT_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
AWS_TEST_CREDENTIALS = {
    "aws_access_key_id": "testing",
    "aws_secret_access_key": "testing",
    "region_name": "us-east-1",
}


def _schema_url(schema: str) -> str:
    base = PG_ADMIN_DSN.replace("postgresql://", "postgresql+psycopg://", 1)
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options={quote(f'-csearch_path={schema}')}"


@pytest.fixture(scope="session")
def postgres_schema_factory() -> Iterator[Callable[[], str]]:
    """Creates uniquely named schemas (returning their URLs); drops them all at the end."""
    try:
        admin = psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as e:
        pytest.fail(f"PostgreSQL is not reachable at {PG_ADMIN_DSN}: {e}")
    created: list[str] = []

    def make() -> str:
        schema = f"upsert_test_{os.getpid()}_{uuid.uuid4().hex[:10]}"
        admin.execute(f'CREATE SCHEMA "{schema}"')
        created.append(schema)
        return _schema_url(schema)

    try:
        yield make
    finally:
        for schema in created:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.close()


@pytest.fixture(scope="session")
def postgres_url(postgres_schema_factory: Callable[[], str]) -> str:
    """A URL for a schema private to this test session."""
    return postgres_schema_factory()


@pytest.fixture
def fresh_postgres_url(postgres_schema_factory: Callable[[], str]) -> str:
    """A URL for a schema private to one test (dropped with the session's schemas)."""
    return postgres_schema_factory()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _moto_command(port: int) -> list[str]:
    exe = Path(sys.executable).with_name("moto_server")
    if exe.exists():
        return [str(exe), "-H", "127.0.0.1", "-p", str(port)]
    return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]


def _wait_for(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url + "/moto-api/", timeout=1):
                return True
        except OSError:
            time.sleep(0.1)
    return False


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Start a moto S3 server process on a free port; yield its URL; kill it after."""
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    for _attempt in range(3):  # a port can be taken between probing and binding
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                _moto_command(port), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        if _wait_for(url, proc, timeout_s=30):
            break
        proc.kill()
        proc.wait()
    else:
        pytest.fail(f"moto_server did not start; see {log}:\n{log.read_text()[-2000:]}")
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def s3_client(s3_endpoint: str) -> object:
    """A boto3 S3 client for the moto server (for setup and inspection in tests)."""
    return boto3.session.Session().client("s3", endpoint_url=s3_endpoint, **AWS_TEST_CREDENTIALS)


@pytest.fixture
def s3_bucket(s3_client: object) -> str:
    """A fresh, empty bucket on the moto server for one test."""
    name = f"test-{uuid.uuid4().hex[:16]}"
    s3_client.create_bucket(Bucket=name)  # type: ignore[attr-defined]
    return name


@pytest.fixture
def s3_env(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point boto3's environment at the moto server for one test; returns the endpoint."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AWS_TEST_CREDENTIALS["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_TEST_CREDENTIALS["aws_secret_access_key"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", AWS_TEST_CREDENTIALS["region_name"])
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return s3_endpoint
