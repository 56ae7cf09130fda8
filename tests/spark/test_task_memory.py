"""The memory a Spark task of the ingest took (``resources/task_memory.py``) and the size of
the buckets it drained, as the run's report gives them (``--json``, Dagster metadata).

- :class:`TaskMemory` measures this process: a task's peak covers what it allocated, and
  starts again at the next task (the Linux peak reset), or, where the peak cannot be
  reset, is the process's lifetime peak and says it is not exact.
- On ``local[2]``, both Spark paths report each file's largest task peak and growth while
  reading and draining (the Python worker's, which Spark's own metrics do not see) and its
  largest bucket state;
  the in-process engine reports no task memory and the same largest bucket.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

import resources.task_memory as task_memory
from resources.spark_ingest import SparkEngine
from resources.spark_lines import task_memory as memory_of_lines
from resources.task_memory import TaskMemory, current_rss
from tests.ingest.helpers import memory_shard, write_jsonl
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard

MIB = 1 << 20


def _touched(size: int) -> bytearray:
    """``size`` bytes, every page written (so resident)."""
    block = bytearray(size)
    block[::4096] = b"\1" * len(range(0, size, 4096))
    return block


def test_a_task_peak_covers_what_it_allocated_and_restarts_with_the_next_task() -> None:
    first = TaskMemory()
    assert first.exact  # Linux: the peak is reset at a task's start
    block = _touched(96 * MIB)
    assert first.peak() >= first.rss_start + 90 * MIB
    assert current_rss() >= first.rss_start + 90 * MIB
    high = first.peak()
    del block
    second = TaskMemory()
    assert second.peak() < high - 80 * MIB  # not the first task's peak
    figures = second.figures()
    assert figures["exact"] is True and figures["rss_start"] == second.rss_start
    assert int(figures["peak_rss"]) >= second.rss_start


def test_without_a_peak_reset_the_peak_is_the_process_lifetime_peak(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    block = _touched(64 * MIB)
    del block  # before the task: only a peak that was not reset still holds it
    monkeypatch.setattr(task_memory, "_CLEAR_REFS", str(tmp_path / "no" / "clear_refs"))
    memory = TaskMemory()
    assert not memory.exact
    assert memory.peak() >= memory.rss_start + 60 * MIB


def test_task_lines_give_the_largest_peak_and_growth() -> None:
    lines = [
        'task:{"kind": "read", "of": 0, "rss_start": 100, "peak_rss": 400, "exact": true}',
        'task:{"kind": "read", "of": 1, "rss_start": 100, "peak_rss": 200, "exact": true}',
        'task:{"kind": "bucket", "of": 3, "rss_start": 350, "peak_rss": 500, "exact": true}',
        'task:{"kind": "bucket", "of": 1}',  # no memory figures: ignored
        'bucket:{"bucket": 3}',
    ]
    assert memory_of_lines(lines) == (500, 300, 150)
    assert memory_of_lines(['bucket:{"bucket": 3}']) == (0, 0, 0)


def test_growth_is_taken_only_from_exact_figures() -> None:
    # A worker whose peak could not be reset reports its lifetime peak (exact false),
    # which may come from an earlier task, even of another file: its peak minus this
    # task's start is no growth of this task (the docs call growth a lower bound), so
    # it is left out; its peak still counts, as the upper bound it is. A start of 0
    # (the resident set could not be read) gives no growth either.
    lines = [
        'task:{"kind": "read", "of": 0, "rss_start": 100, "peak_rss": 900, "exact": false}',
        'task:{"kind": "read", "of": 1, "rss_start": 100, "peak_rss": 200, "exact": true}',
        'task:{"kind": "bucket", "of": 3, "rss_start": 0, "peak_rss": 700, "exact": true}',
        'task:{"kind": "bucket", "of": 2, "rss_start": 300, "peak_rss": 350, "exact": true}',
    ]
    assert memory_of_lines(lines) == (900, 100, 50)


def test_a_worker_without_the_resource_module_still_measures(tmp_path: Path) -> None:
    # ``resource`` is POSIX only: the module must import and measure without it (and
    # without /proc), not fail the task that imports the Spark engine.
    code = (
        "import sys; sys.modules['resource'] = None\n"
        "import resources.task_memory as tm\n"
        f"tm._STATUS = {str(tmp_path / 'no-status')!r}\n"
        "m = tm.TaskMemory()\n"
        "print(m.figures())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2], timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "{'rss_start': 0, 'peak_rss': 0, 'exact': False}"


def _shard(root: Path) -> Shard:
    return Shard.open(open_consensus(f"sqlite:///{root}/c.db"), open_blob(f"file://{root}/blob"),
                      "s")


@pytest.mark.spark
def test_the_report_gives_task_memory_and_the_largest_bucket(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    rng = random.Random(9)
    rows = [{"key": k, "offset": 1, "v": f"{rng.getrandbits(64):x}"} for k in range(6000)]
    write_jsonl(landing, "00.jsonl", rows)
    size = (landing / "00.jsonl").stat().st_size
    monkeypatch.setenv("UPSERT_SPARK_SPLIT_BYTES", str(size // 3))
    for path, buckets in (("on", 4), ("off", 4), ("on", 1)):
        monkeypatch.setenv("UPSERT_SPARK_SPLIT", path)
        engine = SparkEngine(spark, slices=2)
        report = ingest(_shard(tmp_path / f"{path}{buckets}"), str(landing),
                        IngestRequest(buckets=buckets), engine=engine)
        assert (engine.last_split is not None) is (path == "on")
        (entry,) = json.loads(json.dumps(report.to_dict()))["files"]
        (local,) = ingest(memory_shard(), str(landing), IngestRequest(buckets=buckets)).files
        # A Python worker with pyarrow loaded is resident well above 30 MiB.
        assert entry["task_peak_memory"] > 30 * MIB, entry
        for grew in ("read_memory_added", "drain_memory_added"):
            assert 0 <= entry[grew] < entry["task_peak_memory"], entry
        if path == "off":  # a slice reads the whole file before it drains its buckets
            assert entry["drain_memory_added"] >= entry["read_memory_added"], entry
        assert (local.task_peak_memory, local.read_memory_added,
                local.drain_memory_added) == (0, 0, 0)
        assert entry["largest_bucket_keys"] == local.largest_bucket_keys
        if buckets == 1:
            assert local.largest_bucket_keys == len(rows)
        else:
            assert len(rows) // buckets <= local.largest_bucket_keys < len(rows) // 2
