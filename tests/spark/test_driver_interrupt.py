"""A driver JVM whose start is interrupted does not outlive the interrupt (issue 23).

``dagster dev`` stopped with Ctrl-C (or SIGTERM to its group) while a run was starting
its Spark driver left that JVM running for good: pyspark starts it ignoring SIGINT, and
the interrupted ``launch_gateway`` deletes the file the JVM reports its port in, so its
main thread dies while its gateway thread keeps it alive, with no parent that will ever
stop it. ``resources.spark_session.start_driver_quietly`` now kills it before the
interrupt goes on. The interrupt is simulated where it lands in practice: in pyspark's
wait for the JVM, right after the JVM process was started.
"""

from __future__ import annotations

import os
import signal
import time
import types
from pathlib import Path

import pyspark.java_gateway as java_gateway
import pytest

from resources.spark_session import start_driver_quietly


def _children() -> dict[int, str]:
    """This process's child processes: pid -> command line."""
    out: dict[int, str] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == os.getpid():
                out[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue
    return out


class _InterruptedWait:
    """``time`` for pyspark's gateway wait: its first sleep is interrupted (Ctrl-C)."""

    def __init__(self) -> None:
        self.started: dict[int, str] = {}

    def sleep(self, seconds: float) -> None:
        self.started = _children()
        raise KeyboardInterrupt


@pytest.mark.spark
def test_an_interrupted_driver_start_leaves_no_jvm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = set(_children())
    wait = _InterruptedWait()
    monkeypatch.setattr(java_gateway, "time", types.SimpleNamespace(sleep=wait.sleep))
    try:
        with pytest.raises(KeyboardInterrupt):
            start_driver_quietly("local[1]", {"spark.ui.enabled": "false"},
                                 tmp_path / "driver.log")
        started = set(wait.started) - before
        assert started, "the JVM was not started before the interrupt"
        # Long enough for a JVM left behind to have failed its port file and carry on.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and started & set(_children()):
            time.sleep(0.2)
        left = {pid: cmd for pid, cmd in _children().items() if pid in started}
        assert left == {}, f"the interrupted driver JVM is still running: {left}"
    finally:
        for pid in set(_children()) - before:  # never leave one behind, even on failure
            os.kill(pid, signal.SIGKILL)
