"""A real PostgreSQL server restarted under a running ``upsertctl ingest``.

The server is a private one (``initdb`` into a temporary directory, on a free loopback
port, run as the ``postgres`` user when the tests run as root), so the shared server
other tests use is never touched. Mid-ingest it is restarted with ``pg_ctl restart``:

- ``-m fast``: the server tells every client "terminating connection due to
  administrator command", shuts down cleanly and comes back;
- ``-m immediate``: the server dies without a shutdown checkpoint (as in a crash or a
  power cut) and replays its WAL on start.

Either way the restart is shorter than the consensus's reconnect window, so the
ingest completes by itself with exit 0, and the shard equals a clean ingest: every
file and error row once, nothing lost, nothing leaked.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.helpers import Cli
from upsert_core.persist.location.consensus_sql import SqlConsensus
from upsert_core.persist.location.urls import open_blob
from upsert_core.persist.shard import Shard

from .helpers import assert_recovered, make_landing, reaped, reference_shard

WAIT_S = 120
OPTIONS = ("--key", "key", "--order", "offset")


def _bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not found:
        pytest.fail("PostgreSQL server binaries (pg_ctl, initdb) not found under "
                    "/usr/lib/postgresql/*/bin; install the postgresql package")
    return Path(found[-1]).parent


@dataclass
class PrivateServer:
    bindir: Path
    datadir: Path
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def pg_ctl(self, *args: str) -> None:
        # SUBTLE: ``-l`` on every start/restart: without it the postmaster writes to
        # pg_ctl's stdout, holds that pipe open for its whole life, and we would wait
        # for its EOF forever.
        _as_postgres([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-w",
                      "-t", "60", "-l", str(self.log), *args], self.log)


def _as_postgres(command: list[str], log: Path) -> None:
    """Run ``command`` as the postgres user when we are root (PostgreSQL refuses root),
    its output appended to ``log`` (a file: a server it starts may keep it open)."""
    if os.geteuid() == 0:
        command = ["runuser", "-u", "postgres", "--", *command]
    with open(log, "ab") as out:
        proc = subprocess.run(command, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                              timeout=120)
    assert proc.returncode == 0, f"{command}: rc={proc.returncode}\n{log.read_text()[-3000:]}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server() -> Iterator[PrivateServer]:
    root = Path(tempfile.mkdtemp(prefix="upsert-pg-"))
    datadir = root / "data"
    log = root / "server.log"
    log.touch()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        shutil.chown(log, "postgres", "postgres")
    root.chmod(0o755)
    bindir = _bindir()
    _as_postgres([str(bindir / "initdb"), "-D", str(datadir), "-A", "trust", "-U", "postgres",
                  "--no-sync"], log)
    srv = PrivateServer(bindir, datadir, _free_port(), log)
    options = f"-p {srv.port} -k {root} -c listen_addresses=127.0.0.1"
    srv.pg_ctl("-o", options, "start")
    try:
        yield srv
    finally:
        subprocess.run(
            (["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else [])
            + [str(bindir / "pg_ctl"), "-D", str(datadir), "-m", "immediate", "stop"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60,
        )
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_server_restart_mid_ingest_is_ridden_out(
    tmp_path: Path, server: PrivateServer, mode: str
) -> None:
    name = f"restart-{mode}-{uuid.uuid4().hex[:8]}"
    landing = make_landing(tmp_path / "landing", files=12, rows=800, keys=300, seed=31)
    reference = reference_shard(landing)
    blob_url = f"file://{tmp_path / 'blob'}"
    cli = Cli(tmp_path / "home", env={"UPSERT_CONSENSUS_URL": server.url,
                                      "UPSERT_BLOB_URL": blob_url})
    with reaped(cli.popen("ingest", str(landing), "--shard", name, *OPTIONS, "--engine", "local",
                     "--no-progress")) as proc:
        watcher = Shard.open(SqlConsensus(server.url), open_blob(blob_url), name, create=True)
        while watcher.upper < 2:
            assert proc.poll() is None, "the ingest ended before the restart"
            time.sleep(0.01)
        upper_at_restart = watcher.upper
        server.pg_ctl("-m", mode, "restart")
        out, err = proc.communicate(timeout=WAIT_S)
    assert upper_at_restart < 12, "the restart came after the ingest's last commit"
    assert proc.returncode == 0, f"the ingest needed the user after a {mode} restart:\n{err}"
    shard = Shard.open(SqlConsensus(server.url), open_blob(blob_url), name, create=False)
    assert shard.upper == 12
    cli.run("gc", "--shard", name)
    assert_recovered(shard, reference)
