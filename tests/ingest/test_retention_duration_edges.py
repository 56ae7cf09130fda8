"""Edges of the retention duration syntax (non-ASCII digits, huge values, on the CLI
and in sources.yaml) and of what the retention surfaces show once since passed the
window."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from upsert_core.errors import ConfigError, InvalidUsage
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.shard import Shard
from upsert_core.read_times import parse_duration

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("text", ["\u0667d", "\uff17d", "\u0661\u0662h"])
def test_a_duration_in_non_ascii_digits_is_refused_like_every_other_number(text: str) -> None:
    """``--keep ٧``, ``--as-of ٧`` and stored integers take ASCII digits only
    (``main._int_at_least``: "'١' is not an integer here"), but ``_DURATION`` is
    ``\\d`` without ``re.ASCII``: ``--keep-for ٧d`` (Arabic-Indic 7) and ``７d``
    (full-width) are stored as 7 days. Expected InvalidUsage; actual 604800."""
    with pytest.raises(InvalidUsage):
        parse_duration(text)


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "UPSERT_HOME": str(home), "UPSERT_CACHE_DIR": str(home / "cache")}
    return subprocess.run([sys.executable, "-m", "orchestration.cli", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300, check=False)


def test_a_huge_duration_is_a_usage_error_not_an_unexpected_value_error(
    tmp_path: Path,
) -> None:
    """``--keep-for <4296 nines>d`` parses (the digits are within Python's 4300-digit
    int/str limit) but the seconds are not, so storing ``str(seconds)`` raises
    ``ValueError`` inside the transition: exit 1, "unexpected ValueError: Exceeds the
    limit (4300 digits) ...". Expected: exit 2 naming the option, as for ``0d``."""
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "0001.jsonl").write_text('{"id": 1, "offset": 1}\n')
    r = _cli(tmp_path, "ingest", str(landing), "--shard", "s", "--key", "id", "--order",
             "offset", "--engine", "local")
    assert r.returncode == 0, r.stderr
    r = _cli(tmp_path, "retention", "--shard", "s", "--keep-for", "9" * 4296 + "d")
    assert r.returncode == 2, (r.returncode, r.stderr[:300])
    assert "unexpected" not in r.stderr


def test_a_huge_source_retention_is_a_config_error(tmp_path: Path) -> None:
    """``sources.yaml`` ``retention: <5000 nines>s``: ``_retention`` catches only
    InvalidUsage, so the ValueError of ``int()`` escapes ``load_sources`` (expected the
    file's ConfigError naming the source)."""
    from orchestration.sources import load_sources

    path = tmp_path / "sources.yaml"
    path.write_text(f"sources:\n  - {{name: a, landing: /x, retention: '{'9' * 5000}s'}}\n")
    with pytest.raises(ConfigError, match="retention"):
        load_sources(path, env={})


def test_a_duration_whose_window_since_already_passed_is_not_shown_as_all_history() -> None:
    """``since`` already above the window's answer (an earlier ``gc --retain 1``):
    ``retention_keep`` finds no readable step before the cutoff and returns None, so
    ``inspect`` shows ``"retention": null`` (elsewhere: all history kept) and
    ``upsertctl retention`` says "(all of it now)" while only the newest ts is
    readable. Expected: the count that is in force (1 here), or at least not null."""
    now = [1_700_000_000_000]
    shard = Shard.open(MemoryConsensus(), MemoryBlob(), "s", clock_ms=lambda: now[0])
    for i in range(6):
        _commit(shard, i)
        now[0] += 3_600_000
    shard.gc(retain=1, leak_grace_ms=0)
    assert shard.state().since == 5
    shard.set_retention_for(150 * 60)  # 2.5 h; ts 5 was committed 1 h ago
    assert shard.inspect()["retention"] is not None, (
        "a shard with 1 readable ts reports retention null (= keeps all history)"
    )


def _commit(shard: Shard, i: int) -> None:
    import tempfile

    from upsert_core.ingest import IngestRequest, ingest

    from .helpers import write_jsonl

    root = Path(tempfile.mkdtemp())
    write_jsonl(root, f"{i:04d}.jsonl", [{"key": i, "offset": i, "v": str(i)}])
    ingest(shard, str(root), IngestRequest(order_scope="global", buckets=1, maintain=False))
