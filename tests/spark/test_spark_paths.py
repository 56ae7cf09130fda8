"""Which path of the Spark engine a run's files take (``resources/spark_paths.py``): a
group is the pending files from the first on while none would be split, within the
bounds, and at least two; without a session and without reading a file."""

from __future__ import annotations

import pytest

from resources.spark_paths import group_size
from upsert_core.errors import ConfigError
from upsert_core.landing import LandingFile

pytestmark = pytest.mark.spark

MIB = 1 << 20


def _files(*sizes: int, suffix: str = ".jsonl") -> list[LandingFile]:
    return [LandingFile(f"{i:03d}{suffix}", "/nowhere", size) for i, size in enumerate(sizes)]


def test_a_group_is_the_files_before_the_first_one_the_split_path_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("UPSERT_SPARK_SPLIT", "UPSERT_SPARK_SPLIT_BYTES", "UPSERT_SPARK_GROUP_FILES",
                 "UPSERT_SPARK_GROUP_BYTES"):
        monkeypatch.delenv(name, raising=False)
    assert group_size(_files(100, 200, 0, 300), "plain") == 4
    assert group_size(_files(100), "plain") == 0  # one file: its own path
    assert group_size(_files(), "plain") == 0
    big = 33 * MIB  # above the 32 MiB split size
    assert group_size(_files(100, 200, big, 300), "plain") == 2
    assert group_size(_files(100, big, 300), "plain") == 0  # only one before it
    # Files the split path never reads: CSV, Debezium events, or with splitting off.
    assert group_size(_files(100, big, 300, suffix=".csv"), "plain") == 3
    assert group_size(_files(100, big, 300), "debezium") == 3
    monkeypatch.setenv("UPSERT_SPARK_SPLIT", "off")
    assert group_size(_files(100, big, 300), "plain") == 3
    monkeypatch.setenv("UPSERT_SPARK_SPLIT", "on")  # every splittable file splits
    assert group_size(_files(100, 200), "plain") == 0
    assert group_size(_files(100, 200, suffix=".csv"), "plain") == 2


def test_the_bounds_of_a_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UPSERT_SPARK_SPLIT", raising=False)
    monkeypatch.setenv("UPSERT_SPARK_GROUP_FILES", "3")
    assert group_size(_files(*[10] * 10), "plain") == 3
    monkeypatch.setenv("UPSERT_SPARK_GROUP_FILES", "1")  # groups off
    assert group_size(_files(*[10] * 10), "plain") == 0
    monkeypatch.delenv("UPSERT_SPARK_GROUP_FILES")
    monkeypatch.setenv("UPSERT_SPARK_GROUP_BYTES", str(10 * MIB))
    assert group_size(_files(*[3 * MIB] * 5), "plain") == 3
    assert group_size(_files(11 * MIB, MIB, MIB), "plain") == 0  # a first file above: alone
    for bad in ("0", "-1", "many", "1.5"):
        monkeypatch.setenv("UPSERT_SPARK_GROUP_BYTES", bad)
        with pytest.raises(ConfigError, match="UPSERT_SPARK_GROUP_BYTES must be a whole"):
            group_size(_files(1, 2), "plain")
