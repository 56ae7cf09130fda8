"""Spark's own output stays off the user's terminal unless asked for (issue 23).

``upsertctl ingest`` on a ``local[*]`` driver used to print the JVM's ``WARNING: Using
incubator modules``, log4j's profile lines and ``WARN NativeCodeLoader`` on stderr
around our own progress lines. They now go to ``$UPSERT_HOME/spark/driver.log``;
``UPSERT_SPARK_LOG=1`` shows them; a job that fails still says why on the one error line
(the JVM's stack trace is the log's). Real processes: each ``upsertctl`` starts its JVM
(but the last test, of the error line alone). (The warm local server's output is its own
log's: ``test_local_server.py``.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from resources.spark_ingest import failure_line
from tests.e2e.helpers import Cli, spark_noise, write_jsonl

# A driver JVM in the command (no warm local server: UPSERT_SPARK_SERVER=off).
LOCAL = {"SPARK_REMOTE": "", "SPARK_MASTER": "", "UPSERT_SPARK_SERVER": "off"}


def _landing(tmp_path: Path) -> Path:
    landing = tmp_path / "landing"
    write_jsonl(landing, "1.jsonl", [{"key": k, "offset": 1, "v": "a"} for k in range(3)])
    return landing


@pytest.mark.spark
@pytest.mark.slow
def test_spark_log_lines_stay_off_stderr(tmp_path: Path) -> None:
    cli = Cli(tmp_path / "home", env=LOCAL, engine="spark")
    result = cli.ingest(_landing(tmp_path), "--json")
    assert spark_noise(result.err) == [], result.err
    assert result.err_lines[-1].startswith("ingested 1 file(s)"), result.err
    assert json.loads(result.out)["files"][0]["inserts"] == 3  # stdout: the report only
    # Not lost: Spark's driver wrote them to its log.
    log = (cli.home / "spark" / "driver.log").read_text()
    assert "WARNING: Using incubator modules" in log and "log4j" in log
    # UPSERT_SPARK_SERVER=off: the JVM was the command's own, no server was started.
    assert cli.run("spark", "status").json()["running"] is False
    assert not (cli.home / "spark" / "server.json").exists()


@pytest.mark.spark
@pytest.mark.slow
def test_upsert_spark_log_shows_them(tmp_path: Path) -> None:
    cli = Cli(tmp_path / "home", env={**LOCAL, "UPSERT_SPARK_LOG": "1"}, engine="spark")
    result = cli.ingest(_landing(tmp_path))
    assert "WARNING: Using incubator modules" in result.err, result.err
    assert "log4j" in result.err, result.err
    assert cli.snapshot() and not (cli.home / "spark" / "driver.log").exists()


@pytest.mark.spark
@pytest.mark.slow
def test_a_failing_spark_job_still_says_why(tmp_path: Path) -> None:
    """Executors cannot start their Python workers: the job fails, and the one error
    line carries the JVM's reason while its stack trace stays in the log."""
    env = {**LOCAL, "PYSPARK_PYTHON": str(tmp_path / "no-python")}
    cli = Cli(tmp_path / "home", env=env, engine="spark")
    failed = cli.ingest(_landing(tmp_path), rc=1)
    line = failed.error_line()
    assert "1.jsonl: the Spark job failed" in line, line
    assert "No such file or directory" in line and "no-python" in line, line
    assert spark_noise(failed.err) == [], failed.err
    assert "ERROR TaskSetManager" in (cli.home / "spark" / "driver.log").read_text()


PY4J = """An error occurred while calling o58.collectToPython.
: org.apache.spark.SparkException: Job aborted due to stage failure: Lost task 1.0: \
java.io.IOException: Cannot run program "/x/python": error=2, No such file or directory
\tat java.base/java.lang.ProcessBuilder.start(ProcessBuilder.java:1143)
Caused by: java.io.IOException: error=2, No such file or directory"""
WORKER = """An exception was thrown from the Python worker:
Traceback (most recent call last):
  File "/repo/resources/spark_ingest.py", line 7, in run
    raise ValueError("boom")
ValueError: boom"""
WRAPPED = """An error occurred while calling o9.collect.
: org.apache.spark.SparkException: Job aborted: org.apache.spark.api.python.PythonException: \
Traceback (most recent call last):
  File "x.py", line 1, in f
KeyError: 'k'

\tat org.apache.spark.api.python.BasePythonRunner.handle(PythonRunner.scala:1)
Caused by: something else"""

GRPC = """<_MultiThreadedRendezvous of RPC that terminated with:
	status = StatusCode.UNAVAILABLE
	details = "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:41615: \
Failed to connect to remote host: connect: Connection refused (111)"
	debug_error_string = "UNKNOWN:Error received from peer  {grpc_status:14}"
>"""


@pytest.mark.parametrize(("text", "line"), [
    (PY4J, "An error occurred while calling o58.collectToPython."
           " org.apache.spark.SparkException: Job aborted due to stage failure: Lost task 1.0:"
           ' java.io.IOException: Cannot run program "/x/python": error=2,'
           " No such file or directory"),
    (WORKER, "An exception was thrown from the Python worker: ValueError: boom"),
    (WRAPPED, "An error occurred while calling o9.collect. KeyError: 'k'"),
    (GRPC, "the Spark Connect call failed: UNAVAILABLE: failed to connect to all addresses;"
           " last error: UNKNOWN: ipv4:127.0.0.1:41615: Failed to connect to remote host:"
           " connect: Connection refused (111)"),
    ("a plain message\nand more", "a plain message"),
    ("", "RuntimeError"),
])
def test_a_failure_is_one_line_that_says_why(text: str, line: str) -> None:
    assert failure_line(RuntimeError(text)) == line
