"""``upsertctl`` never shows a password given in the consensus URL's query string.

``--consensus 'postgresql+psycopg://bob@host/db?password=secret'`` (libpq reads
``password`` from the query string) used to print the secret in the error line when the
database was unreachable: SQLAlchemy's ``hide_password`` hides only a userinfo password.
Every way a user passes the URL (option, environment), every spelling of the parameter
(any case, percent-encoded name, libpq's ``sslpassword``), with and without ``--debug``
tracebacks: the error line names the host and database, shows ``***``, and nothing on
stdout or stderr holds the secret. No server is needed: port 1 refuses connections.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.e2e.helpers import Cli

PARAMETERS = ["password", "PASSWORD", "PassWord", "%70assword", "sslpassword"]


@pytest.mark.parametrize("parameter", PARAMETERS)
@pytest.mark.parametrize("how", ["option", "environment", "debug"])
def test_unreachable_consensus_error_hides_a_query_string_password(
    tmp_path: Path, parameter: str, how: str
) -> None:
    secret = f"QsPw-{uuid.uuid4().hex}"
    url = f"postgresql+psycopg://bob@127.0.0.1:1/appdb?sslmode=disable&{parameter}={secret}"
    env = {"UPSERT_CONSENSUS_RECONNECT_S": "0"}
    args: list[str] = ["--consensus", url]
    if how != "option":
        env["UPSERT_CONSENSUS_URL"] = url
        args = []
    if how == "debug":
        env["UPSERT_DEBUG"] = "1"
    cli = Cli(tmp_path / "home", env=env)
    result = cli.run(*args, "inspect", "--shard", "s", rc=1)
    line = result.error_line()
    assert "cannot connect to consensus" in line and "127.0.0.1:1/appdb" in line, line
    assert "password=***" in line.lower(), line  # SQLAlchemy renders %70 as p
    assert secret not in result.err and secret not in result.out
    if how == "debug":
        assert "Traceback" in result.err


def test_unparsable_consensus_url_hides_a_query_string_password(tmp_path: Path) -> None:
    secret = f"QsPw-{uuid.uuid4().hex}"
    url = f"postgresql+psycopg://bob@127.0.0.1:notaport/appdb?sslPassword={secret}"
    result = Cli(tmp_path / "home", env={"UPSERT_DEBUG": "1"}).run(
        "--consensus", url, "inspect", "--shard", "s", rc=1
    )
    assert "sslPassword=***" in result.error_line()
    assert secret not in result.err and secret not in result.out
