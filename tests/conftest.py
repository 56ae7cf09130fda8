"""Shared pytest configuration: hypothesis profiles and service fixtures.

Hypothesis profiles: ``dev`` (default, quick), ``ci`` (more examples, no deadline;
selected when ``CI`` is set). Service fixtures (PostgreSQL, the moto S3 server) are in
``tests/services.py`` and re-exported here so every test folder can use them.
"""

from __future__ import annotations

import os
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

from tests.services import *  # noqa: E402,F403  (service fixtures: PostgreSQL, moto S3)


@pytest.fixture(autouse=True)
def _writer_token_stays_in_its_test(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Code under test may claim a writer token (``os.environ``) in this process, as
    ``upsertctl ingest`` and Dagster ingest runs do; each test starts without one."""
    monkeypatch.delenv("UPSERT_WRITER_TOKEN", raising=False)
    yield
    os.environ.pop("UPSERT_WRITER_TOKEN", None)  # monkeypatch restores only what existed
