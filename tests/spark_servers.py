"""The warm local Spark servers (``resources.local_spark``) a test session started, found
and stopped at its end, so the suite never leaves one running.

A server is the process group ``spark-submit --name upsert-local-spark`` leads (its JVM
and Python workers), its watchdog ``python -m resources.local_spark watch``; both carry
the environment of the command that started them, so the session's
``TESTS_SESSION_TAG`` (``tests/conftest.py``) finds them whatever ``UPSERT_HOME`` they
serve. Only this user's processes are read; only the groups they lead are signalled,
never the test process's own.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

TAG = "TESTS_SESSION_TAG"
MARKERS = (b"upsert-local-spark", b"resources.local_spark")


def tagged_server_processes(tag: str) -> dict[int, str]:
    """Live server and watchdog processes carrying ``TESTS_SESSION_TAG=tag``: pid ->
    command line."""
    wanted = f"{TAG}={tag}".encode()
    found: dict[int, str] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            if not any(m in cmdline for m in MARKERS):
                continue
            if wanted not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
        except (OSError, IndexError):
            continue
        found[int(proc.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")[:200]
    return found


def stop_tagged_servers(tag: str, wait_s: float = 20.0) -> dict[int, str]:
    """Stop (TERM, then KILL) the process groups of :func:`tagged_server_processes`;
    what was found running."""
    found = tagged_server_processes(tag)
    own = os.getpgrp()
    groups = set()
    for pid in found:
        try:
            group = os.getpgid(pid)
        except ProcessLookupError:
            continue
        if group != own:
            groups.add(group)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for group in groups:
            try:
                os.killpg(group, sig)
            except (ProcessLookupError, PermissionError):
                continue
        deadline = time.monotonic() + wait_s
        while tagged_server_processes(tag) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not tagged_server_processes(tag):
            break
    return found
