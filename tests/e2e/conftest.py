"""Fixtures for the end-to-end tests: a CLI on the embedded defaults and a landing dir."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.helpers import Cli


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    """``upsertctl`` with UPSERT_HOME in a fresh temp dir (SQLite + local blob store)."""
    return Cli(tmp_path / "home")


@pytest.fixture
def landing(tmp_path: Path) -> Path:
    path = tmp_path / "landing"
    path.mkdir()
    return path
