"""PostgreSQL going away mid-ingest, simulated without touching the shared server:

- a loopback TCP proxy in front of it is stopped (connections reset, new ones refused)
  and started again while ``upsertctl ingest`` runs through it;
- the ingest's own backends are killed with ``pg_terminate_backend`` while it runs
  (found by their ``application_name``).

An outage shorter than the consensus's reconnect window (``UPSERT_CONSENSUS_RECONNECT_S``,
15 s by default) needs nothing from the user: the ingest completes by itself. Killed
backends make the ingest complete or exit non-zero with one error line. Either way a
re-run completes and the shard then equals a clean ingest with nothing leaked. While the
database stays down past the window, an ingest fails with one line naming the consensus
and how long it tried."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.e2e.helpers import Cli
from upsert_core.persist.location.consensus_sql import SqlConsensus
from upsert_core.persist.location.urls import open_blob
from upsert_core.persist.shard import Shard

from .helpers import assert_recovered, make_landing, reaped, reference_shard
from .tcp_proxy import TcpProxy

PG = ("127.0.0.1", 5432)
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
OPTIONS = ("--key", "key", "--order", "offset")
WAIT_S = 120
KILL_FOR_S = 10.0


@pytest.fixture
def shard_name() -> Iterator[str]:
    name = f"h16-fault-{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/test", autocommit=True) as conn:
        conn.execute("DELETE FROM consensus WHERE shard = %s", (name,))


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    p = TcpProxy(PG)
    p.start()
    yield p
    p.stop()


def _cli(tmp_path: Path, consensus_url: str, reconnect_s: float | None = None) -> Cli:
    env = {"UPSERT_CONSENSUS_URL": consensus_url,
           "UPSERT_BLOB_URL": f"file://{tmp_path / 'blob'}"}
    if reconnect_s is not None:
        env["UPSERT_CONSENSUS_RECONNECT_S"] = str(reconnect_s)
    return Cli(tmp_path / "home", env=env)


def _shard(tmp_path: Path, name: str) -> Shard:
    return Shard.open(SqlConsensus(PG_URL), open_blob(f"file://{tmp_path / 'blob'}"), name)


def _wait_for_upper(shard: Shard, upper: int, proc_done: threading.Event | None = None) -> None:
    deadline = time.monotonic() + WAIT_S
    while shard.upper < upper:
        assert time.monotonic() < deadline, "the ingest made no progress"
        time.sleep(0.02)


def _ingest_args(landing: Path, name: str) -> list[str]:
    return ["ingest", str(landing), "--shard", name, *OPTIONS, "--engine", "local",
            "--no-progress"]


def _finish(cli: Cli, landing: Path, name: str, tmp_path: Path, reference: Shard) -> None:
    """The user's re-run completes; the shard then equals the clean ingest."""
    cli.ingest(landing, *OPTIONS, shard=name)
    assert_recovered(_shard(tmp_path, name), reference)


def _outcome_is_clear(rc: int, err: str) -> None:
    if rc != 0:
        lines = [x for x in err.splitlines() if x.startswith("upsertctl: error:")]
        assert len(lines) == 1, err


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.parametrize("down_s", [0.2, 1.5])
def test_proxy_restart_mid_ingest(
    tmp_path: Path, shard_name: str, proxy: TcpProxy, down_s: float
) -> None:
    landing = make_landing(tmp_path / "landing", files=12, rows=800, keys=300, seed=21)
    reference = reference_shard(landing)
    cli = _cli(tmp_path, f"postgresql+psycopg://postgres@127.0.0.1:{proxy.port}/test")
    with reaped(cli.popen(*_ingest_args(landing, shard_name))) as proc:
        watcher = _shard(tmp_path, shard_name)
        _wait_for_upper(watcher, 3)
        proxy.stop()
        time.sleep(down_s)
        proxy.start()
        out, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 0, f"a {down_s} s outage needed the user:\n{err}"
    assert_recovered(_shard(tmp_path, shard_name), reference)
    _finish(cli, landing, shard_name, tmp_path, reference)


@pytest.mark.postgres
def test_database_coming_up_after_the_ingest_started_is_waited_for(
    tmp_path: Path, shard_name: str, proxy: TcpProxy
) -> None:
    landing = make_landing(tmp_path / "landing", files=3, rows=50, keys=20, seed=24)
    reference = reference_shard(landing)
    cli = _cli(tmp_path, f"postgresql+psycopg://postgres@127.0.0.1:{proxy.port}/test")
    proxy.stop()
    with reaped(cli.popen(*_ingest_args(landing, shard_name))) as proc:
        time.sleep(1.0)
        assert proc.poll() is None, "the ingest gave up while the database was restarting"
        proxy.start()
        out, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 0, err
    assert_recovered(_shard(tmp_path, shard_name), reference)


@pytest.mark.postgres
def test_database_down_fails_with_one_line_then_rerun_completes(
    tmp_path: Path, shard_name: str, proxy: TcpProxy
) -> None:
    landing = make_landing(tmp_path / "landing", files=3, rows=50, keys=20, seed=22)
    reference = reference_shard(landing)
    cli = _cli(tmp_path, f"postgresql+psycopg://postgres@127.0.0.1:{proxy.port}/test",
               reconnect_s=0.5)
    proxy.stop()
    result = cli.ingest(landing, *OPTIONS, shard=shard_name, rc=None)
    assert result.rc != 0
    line = result.error_line()
    assert "consensus" in line and str(proxy.port) in line, line
    assert "retried for" in line, line
    assert "postgres@" in line and "password" not in line.lower()
    proxy.start()
    _finish(cli, landing, shard_name, tmp_path, reference)


@pytest.mark.postgres
@pytest.mark.slow
def test_backends_terminated_mid_ingest(tmp_path: Path, shard_name: str) -> None:
    landing = make_landing(tmp_path / "landing", files=12, rows=800, keys=300, seed=23)
    reference = reference_shard(landing)
    app = f"h16_{uuid.uuid4().hex[:8]}"
    cli = _cli(tmp_path, f"{PG_URL}?application_name={app}")
    stop = threading.Event()
    terminated: list[int] = []

    def terminate_loop() -> None:
        # Bounded: a fault that never ends is an outage (tested above), not a blip; an
        # ingest retrying through endless kills on a loaded machine only tests patience.
        kill_until = time.monotonic() + KILL_FOR_S
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/test",
                             autocommit=True) as conn:
            while not stop.wait(0.15) and time.monotonic() < kill_until:
                rows = conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = %s", (app,)).fetchall()
                terminated.extend(1 for r in rows if r[0])

    killer = threading.Thread(target=terminate_loop, daemon=True)
    with reaped(cli.popen(*_ingest_args(landing, shard_name))) as proc:
        try:
            _wait_for_upper(_shard(tmp_path, shard_name), 1)
            killer.start()
            out, err = proc.communicate(timeout=WAIT_S)
        finally:
            stop.set()
    killer.join(timeout=10)
    assert terminated, "no backend was terminated: the test proves nothing"
    _outcome_is_clear(proc.returncode, err)
    _finish(cli, landing, shard_name, tmp_path, reference)
