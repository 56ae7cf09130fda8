"""One SparkSession for the whole test session (starting one costs 6-15 s), and a Spark
Connect server on ``local[2]`` for the tests that need one (started once, ~10 s, on a
free loopback port, and stopped at the end)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
from pyspark.sql import SparkSession

from resources.spark_session import REPO_ROOT, get_spark

CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
CONNECT_START_TIMEOUT_S = 90


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    master = os.environ.get("SPARK_MASTER", "local[2]")  # a cluster when one is configured
    session = get_spark(master, app_name="upsert-tests", shuffle_partitions=4)
    try:
        yield session
    finally:
        session.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``sc://127.0.0.1:PORT`` of a Spark Connect server on ``local[2]``, started from the
    pyspark package in a process group of its own (its Python workers import this
    checkout: ``PYTHONPATH`` has it first)."""
    spark_home = Path(pyspark.__file__).parent
    port = _free_port()
    log = tmp_path_factory.mktemp("connect") / "connect-server.log"
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_MASTER")}
    env.update(SPARK_HOME=str(spark_home), SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    command = [
        str(spark_home / "bin" / "spark-submit"), "--class", CONNECT_CLASS,
        "--name", "upsert-tests-connect", "--master", "local[2]",
        "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
        "--conf", f"spark.connect.grpc.binding.port={port}",
        "--conf", "spark.ui.enabled=false",
        "--conf", "spark.sql.shuffle.partitions=4",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + CONNECT_START_TIMEOUT_S
        while not _answers(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-3000:]
                pytest.fail(f"the Spark Connect server did not come up:\n{tail}")
            time.sleep(0.3)
        yield f"sc://127.0.0.1:{port}"
    finally:
        _stop_group(proc)


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
