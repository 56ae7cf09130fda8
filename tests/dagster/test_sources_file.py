"""Where the code location finds its sources, and that it refuses to load with none."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestration import sources
from orchestration.definitions import require_sources
from orchestration.sources import load_sources
from upsert_core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
ONE = "sources:\n  - {name: here, landing: /x}\n"


def test_upsert_sources_must_name_an_existing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="UPSERT_SOURCES=.*no such file"):
        load_sources(env={"UPSERT_SOURCES": str(tmp_path / "missing.yaml")})
    (tmp_path / "s.yaml").write_text(ONE)
    assert [s.name for s in load_sources(env={"UPSERT_SOURCES": str(tmp_path / "s.yaml")})] \
        == ["here"]


def test_the_working_directory_comes_before_the_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert [s.name for s in load_sources(env={})] == ["demo"]  # the checkout's file
    (tmp_path / "sources.yaml").write_text(ONE)
    assert [s.name for s in load_sources(env={})] == ["here"]


def test_no_sources_anywhere_fails_loudly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sources, "CHECKOUT_SOURCES_FILE", tmp_path / "absent.yaml")
    assert load_sources(env={}) == []
    with pytest.raises(ConfigError, match="no sources to serve"):
        require_sources([])


def test_loading_the_code_location_without_sources_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "empty.yaml").write_text("sources: []\n")
    env = {"PATH": "/usr/bin:/bin", "UPSERT_SOURCES": str(tmp_path / "empty.yaml"),
           "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", "import orchestration.definitions"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "no sources to serve" in done.stderr
