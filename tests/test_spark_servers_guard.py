"""The suite's guard against warm local Spark servers left running
(``tests/spark_servers.py``): a process group carrying the session's tag and a server's
or watchdog's command line is found and stopped; one without the tag, or without such a
command line, is left alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

from tests.spark_servers import stop_tagged_servers, tagged_server_processes

SLEEPER = "import time; time.sleep(120)"


def _start(tag: str | None, marker: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "TESTS_SESSION_TAG"}
    if tag is not None:
        env["TESTS_SESSION_TAG"] = tag
    return subprocess.Popen([sys.executable, "-c", SLEEPER, marker], env=env,
                            start_new_session=True)


def test_tagged_server_groups_are_found_and_stopped() -> None:
    tag = uuid.uuid4().hex
    server = _start(tag, "--name upsert-local-spark")
    watchdog = _start(tag, "resources.local_spark")
    other_tag = _start(uuid.uuid4().hex, "upsert-local-spark")
    not_a_server = _start(tag, "something-else")
    try:
        deadline = time.monotonic() + 10
        while len(tagged_server_processes(tag)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert set(tagged_server_processes(tag)) == {server.pid, watchdog.pid}
        assert set(stop_tagged_servers(tag)) == {server.pid, watchdog.pid}
        assert server.wait(timeout=10) is not None and watchdog.wait(timeout=10) is not None
        assert tagged_server_processes(tag) == {}
        assert other_tag.poll() is None and not_a_server.poll() is None
    finally:
        for proc in (server, watchdog, other_tag, not_a_server):
            proc.kill()
            proc.wait()
