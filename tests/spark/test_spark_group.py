"""A run of many files through Spark is one job (issue 24): the group path
(``resources/spark_group.py``) on a real ``local[2]`` session.

- N pending files are ONE Spark job (counted by the status tracker, in a job group of
  the test's own) and the shard equals the in-process engine's ts by ts (snapshot and
  changes at every ts, error rows, late rows, ingested files), in both order scopes.
- A run of one file keeps the one-stage path, and ``UPSERT_SPARK_GROUP_FILES=1`` runs
  every file as its own job.
- A file-level problem stops the run at that file with the files before it committed.
- A run killed after committing ``k`` files of a group leaves exactly the first ``k``
  applied; a re-run applies the rest exactly once (``tests.faults.helpers``).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pyspark.sql import SparkSession

from resources.spark_ingest import SparkEngine
from tests.faults.helpers import GLOBAL_REQUEST, REQUEST, assert_recovered, make_landing
from tests.ingest.helpers import contents, write_jsonl
from upsert_core.errors import IngestError
from upsert_core.ingest import IngestReport, IngestRequest, ingest
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard
from upsert_core.persist.testing import unreferenced_blobs
from upsert_core.shard_table import ShardTable

pytestmark = pytest.mark.spark

T = TypeVar("T")


@contextmanager
def counted_jobs(spark: SparkSession) -> Iterator[list[int]]:
    """Count the Spark jobs this thread starts inside the block (a job group of its own,
    read from the status tracker afterwards); the list holds the count after the block."""
    context = spark.sparkContext
    group = f"upsert-test-{uuid.uuid4().hex}"
    context.setJobGroup(group, "counted by a test")
    counted: list[int] = []
    try:
        yield counted
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        counted.append(len(context.statusTracker().getJobIdsForGroup(group)))


def _shard(root: Path, name: str = "s") -> Shard:
    return Shard.open(open_consensus(f"sqlite:///{root / 'c.db'}"),
                      open_blob(f"file://{root / 'blob'}"), name)


def _reference(landing: Path, request: IngestRequest) -> Shard:
    shard = Shard.open(MemoryConsensus(), MemoryBlob(), "s")
    ingest(shard, str(landing), request)
    return shard


def _same(shard: Shard, reference: Shard) -> None:
    state, ref = shard.state(), reference.state()
    assert state.upper == ref.upper
    assert dict(state.ingested_files) == dict(ref.ingested_files)
    assert contents(shard) == contents(reference)  # snapshot and changes at every ts
    assert list(shard.errors()) == list(reference.errors())
    assert list(ShardTable(shard).late_records()) == list(ShardTable(reference).late_records())


def _counts(report: IngestReport) -> list[tuple[Any, ...]]:
    return [(f.name, f.ts, f.rows_read, f.inserts, f.retractions, f.errors, f.late_rows)
            for f in report.files]


def _landing(root: Path, files: int, seed: int) -> Path:
    landing = root / "landing"
    landing.mkdir()
    rng = random.Random(seed)
    for f in range(files):
        rows: list[object] = [{"key": None, "offset": f}]  # one error row per file
        for _ in range(30):
            row: dict[str, object] = {"key": rng.randrange(40), "offset": rng.randrange(20)}
            if rng.random() < 0.2:
                row["__deleted"] = True
            else:
                row["v"] = rng.choice("abcd")
            rows.append(row)
        write_jsonl(landing, f"{f:03d}.jsonl", rows)
    (landing / f"{files:03d}.jsonl").touch()  # an empty batch takes a ts too
    return landing


@pytest.mark.parametrize("scope", ["batch", "global"])
def test_a_run_of_many_files_is_one_spark_job_equal_to_the_in_process_engine(
    spark: SparkSession, tmp_path: Path, scope: str
) -> None:
    landing = _landing(tmp_path, files=12, seed=3)
    request = IngestRequest(order_scope=scope, buckets=4, inline_threshold=256,
                            maintain=False)
    shard = _shard(tmp_path)
    with counted_jobs(spark) as jobs:
        report = ingest(shard, str(landing), request, engine=SparkEngine(spark))
    assert jobs == [1]
    assert len(report.files) == 13
    assert {(f.read_tasks, f.drain_tasks) for f in report.files} == {(2, 2)}
    reference = _reference(landing, request)
    _same(shard, reference)
    assert _counts(report) == _counts(ingest(Shard.open(MemoryConsensus(), MemoryBlob(), "s"),
                                             str(landing), request))
    assert unreferenced_blobs(shard) == set()

    # The next run's files start where the states the workers cached left off.
    for f in range(13, 16):
        write_jsonl(landing, f"{f:03d}.jsonl",
                    [{"key": k, "offset": 99, "v": f"next-{f}"} for k in range(0, 40, 3)])
    with counted_jobs(spark) as jobs:
        ingest(shard, str(landing), request, engine=SparkEngine(spark))
    assert jobs == [1]
    ingest(reference, str(landing), request)
    _same(shard, reference)


def test_one_file_keeps_its_own_path_and_groups_can_be_turned_off(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    landing = _landing(tmp_path, files=4, seed=5)
    request = IngestRequest(buckets=4, maintain=False)
    shard = _shard(tmp_path)
    engine = SparkEngine(spark)
    monkeypatch.setenv("UPSERT_SPARK_GROUP_FILES", "1")
    with counted_jobs(spark) as jobs:
        ingest(shard, str(landing), request, engine=engine)
    assert jobs == [5]  # every file its own job
    monkeypatch.delenv("UPSERT_SPARK_GROUP_FILES")
    write_jsonl(landing, "100.jsonl", [{"key": 1, "offset": 1, "v": "one"}])
    grouped = engine.run_group
    engine.run_group = lambda *a: pytest.fail("a run of one file made a group")  # type: ignore[method-assign]
    with counted_jobs(spark) as jobs:
        ingest(shard, str(landing), request, engine=engine)
    assert jobs == [1]
    engine.run_group = grouped  # type: ignore[method-assign]
    _same(shard, _reference(landing, request))


def test_a_file_level_problem_stops_the_run_there_with_the_files_before_it_committed(
    spark: SparkSession, tmp_path: Path
) -> None:
    landing = _landing(tmp_path, files=8, seed=7)
    write_jsonl(landing, "005.jsonl", [{"id": 1, "offset": 1, "v": "no key column"}])
    request = IngestRequest(buckets=3, maintain=False)
    shard = _shard(tmp_path)
    # A shard that has its columns: the group's files are read with the schema they
    # would be read with one by one, so a file-level problem is the file's own. (In a
    # new shard's first group, whose first file adds the columns, a file-level problem
    # is checked again in a job of its own: ``group.SchemaChain``.)
    ingest(shard, str(landing), request, engine=SparkEngine(spark), through="000.jsonl")
    with counted_jobs(spark) as jobs, pytest.raises(IngestError) as failed:
        ingest(shard, str(landing), request, engine=SparkEngine(spark))
    assert jobs == [1]
    with pytest.raises(IngestError) as expected:
        _reference(landing, request)
    assert str(failed.value) == str(expected.value) == "005.jsonl: missing key column 'key'"
    assert sorted(shard.state().ingested_files) == [f"{f:03d}.jsonl" for f in range(5)]
    assert unreferenced_blobs(shard) == set()

    (landing / "005.jsonl").unlink()  # the contract's remedy: the rest goes in
    ingest(shard, str(landing), request, engine=SparkEngine(spark))
    _same(shard, _reference(landing, request))


class _Killed(BaseException):
    """The driver dying between two commits (not an error any code path handles)."""


def _dies_after(shard: Shard, commits: int) -> Callable[[], None]:
    """Make ``shard``'s ``compare_and_append`` die on the call after ``commits`` ones;
    returns the undo."""
    real = shard.compare_and_append
    calls = [0]

    def append(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] > commits:
            raise _Killed(f"killed before commit {calls[0]}")
        return real(*args, **kwargs)

    shard.compare_and_append = append  # type: ignore[method-assign]
    return lambda: setattr(shard, "compare_and_append", real)


@pytest.mark.parametrize(("request_", "commits"), [(REQUEST, 4), (GLOBAL_REQUEST, 1),
                                                   (GLOBAL_REQUEST, 7)])
def test_a_run_killed_after_k_commits_leaves_exactly_k_files_and_a_rerun_the_rest(
    spark: SparkSession, tmp_path: Path, request_: IngestRequest, commits: int
) -> None:
    landing = make_landing(tmp_path / "landing", files=9, rows=30, keys=20, seed=commits)
    shard = _shard(tmp_path)
    undo = _dies_after(shard, commits)
    with counted_jobs(spark) as jobs, pytest.raises(_Killed):
        ingest(shard, str(landing), request_, engine=SparkEngine(spark))
    undo()
    assert jobs == [1]
    names = sorted(p.name for p in landing.iterdir())
    assert sorted(shard.state().ingested_files) == names[:commits]
    assert shard.state().upper == commits
    assert [e["file"] for e in shard.errors()] == names[:commits]  # each error row once

    with counted_jobs(spark) as jobs:
        report = ingest(shard, str(landing), request_, engine=SparkEngine(spark))
    assert jobs == [1]
    assert [f.name for f in report.files] == names[commits:]
    assert_recovered(shard, _reference(landing, request_))
