"""Shared pytest configuration: hypothesis profiles, service fixtures, and no warm
local Spark server unless a test asks for one.

Hypothesis profiles: ``dev`` (default, quick), ``ci`` (more examples, no deadline;
selected when ``CI`` is set). Service fixtures (PostgreSQL, the moto S3 server) are in
``tests/services.py`` and re-exported here so every test folder can use them.

The warm local Spark Connect server (``resources.local_spark``) is the product's
default on the embedded defaults; the suite runs with ``UPSERT_SPARK_SERVER=off`` (a
JVM per command, or the test's in-process session), whatever the developer's shell
says, and the tests of the server itself ask for it. Every process the suite starts
carries ``TESTS_SESSION_TAG``; a local server or watchdog still running with this
session's tag when the session ends is stopped and fails the run.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "dev",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "ci",
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

# The local base cache (ingest.base_cache) of this test process and every process it
# starts lives in a directory of its own, removed at exit, never in the user's ~/.cache.
if not os.environ.get("UPSERT_CACHE_DIR"):
    os.environ["UPSERT_CACHE_DIR"] = tempfile.mkdtemp(prefix="upsert-test-cache-")
    atexit.register(shutil.rmtree, os.environ["UPSERT_CACHE_DIR"], ignore_errors=True)

# The suite's processes run Spark as before unless a test asks for the warm server.
os.environ["UPSERT_SPARK_SERVER"] = "off"
# Each upsertctl runs in its own process unless a test asks for a warm one
# (orchestration.cli.warm); a warm process a test starts anyway lives in a directory of
# the session's, removed at exit, which makes it exit (its socket is gone).
os.environ["UPSERT_LOCAL_SERVER"] = "off"
if not os.environ.get("UPSERT_LOCAL_SERVER_DIR"):
    os.environ["UPSERT_LOCAL_SERVER_DIR"] = tempfile.mkdtemp(prefix="upsert-test-warm-")
    atexit.register(shutil.rmtree, os.environ["UPSERT_LOCAL_SERVER_DIR"], ignore_errors=True)
os.environ.setdefault("TESTS_SESSION_TAG", uuid.uuid4().hex)

from tests.services import *  # noqa: E402,F403  (service fixtures: PostgreSQL, moto S3)
from tests.spark_servers import stop_tagged_servers  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _no_local_spark_server_outlives_the_suite() -> Iterator[None]:
    """The suite stops every warm local Spark server it starts (module docstring)."""
    yield
    left = stop_tagged_servers(os.environ["TESTS_SESSION_TAG"])
    if left:
        pytest.fail(f"warm local Spark server processes were left running (now killed): {left}")


@pytest.fixture(autouse=True)
def _writer_token_stays_in_its_test(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Code under test may claim a writer token (``os.environ``) in this process, as
    ``upsertctl ingest`` and Dagster ingest runs do; each test starts without one."""
    monkeypatch.delenv("UPSERT_WRITER_TOKEN", raising=False)
    yield
    os.environ.pop("UPSERT_WRITER_TOKEN", None)  # monkeypatch restores only what existed
