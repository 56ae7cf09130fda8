"""The default path of a new user: ``upsertctl ingest`` on the Spark engine through the
warm local Spark server, run by a fork of the warm ``upsertctl`` process
(``orchestration.cli.warm``), whose imports include pyspark's Connect client: a child makes
its own gRPC channel after the fork, and its files are applied as by a process of its
own."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.e2e.helpers import Cli, write_jsonl

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _served(sockets: Path) -> int:
    return sum(len(re.findall(r"runs a command", log.read_text()))
               for log in sockets.glob("*.log"))


def test_spark_ingests_in_forks_of_the_warm_upsertctl(tmp_path: Path) -> None:
    sockets = tmp_path / "warm"
    env = {"UPSERT_SPARK_SERVER": "", "SPARK_REMOTE": "", "SPARK_MASTER": "",
           "UPSERT_SPARK_IDLE_S": "600", "UPSERT_LOCAL_SERVER": "auto",
           "UPSERT_LOCAL_SERVER_DIR": str(sockets)}
    cli = Cli(tmp_path / "home", env=env, engine="spark")
    cold = Cli(tmp_path / "cold-home", env={**env, "UPSERT_LOCAL_SERVER": "off"},
               engine="spark")
    landing = tmp_path / "landing"
    write_jsonl(landing, "1.jsonl", [{"key": k, "offset": 1, "v": "a"} for k in range(50)])
    try:
        cli.ingest(landing)  # starts the warm upsertctl in the background, and Spark
        deadline = time.monotonic() + 120
        while not list(sockets.glob("*.sock")) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert list(sockets.glob("*.sock")), [p.read_text() for p in sockets.glob("*.log")]
        for name, rows in (("2.jsonl", [{"key": 1, "offset": 2, "v": "b"},
                                        {"key": 2, "offset": 2, "__deleted": True}]),
                           ("3.jsonl", [{"key": 3, "offset": 0, "v": "c"},
                                        {"key": 70, "offset": 1, "v": "new"}])):
            write_jsonl(landing, name, rows)
            warm_run = cli.ingest(landing, "--json")
            assert [f["name"] for f in warm_run.json()["files"]] == [name]
        assert _served(sockets) == 2
        cold.ingest(landing)
        warm_rows = sorted(cli.snapshot(), key=lambda r: r["key"])
        assert warm_rows == sorted(cold.snapshot(), key=lambda r: r["key"])
        by_key = {r["key"]: r for r in warm_rows}
        assert by_key[1]["v"] == "b" and 2 not in by_key and by_key[70]["v"] == "new"
        assert _served(sockets) == 3  # the snapshot too
    finally:
        cli.run("spark", "stop", rc=None)
        cold.run("spark", "stop", rc=None)
        for socket_file in sockets.glob("*.sock"):
            socket_file.unlink()
