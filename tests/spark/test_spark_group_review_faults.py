"""Review of issue 24, faults in the middle of a group on a real ``local[2]`` session:

- a writer fenced between two of its group's commits (GC, its clock past the lease,
  removes the registration and every blob the group wrote for the files not yet
  committed): the run registers again, redoes the rest, every file applied once;
- another writer commits the next files between two of the group's commits;
- the driver process SIGKILLed between two commits (no ``finally`` runs): the shard
  holds exactly the first ``k`` files, and a re-run in another process (whose Spark
  workers still cache the dead group's states) completes it;
- a re-run after a partial group whose first file is one that arrived late, sorting
  between the committed files and the rest, while the workers cache the dead group's
  states for those timestamps; and a batch-scope shard whose buckets keep their bases
  through the group (the re-run replays the group's committed parts);
- a file that makes the group's job fail as a whole: one failed job, then its group's
  files one by one (before the fix, one failed job per file before the culprit).
- ``gc --retain 1`` between a group's planning and its job, deleting the parts its
  first file's replay of a kept base reads: the bucket fails, nothing of it commits,
  and the run completes as the per-file path would.

Each ends equal to the in-process engine's ingest of the same arrivals
(``tests.faults.helpers.assert_recovered``: check, state comparison, history ts by ts,
error and late rows once, nothing leaked after GC).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from resources.spark_ingest import SparkEngine
from tests.faults.helpers import GLOBAL_REQUEST, REQUEST, assert_recovered, make_landing
from tests.ingest.helpers import write_jsonl
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]


def _shard(root: Path, clock_ms: Callable[[], int] | None = None) -> Shard:
    root.mkdir(parents=True, exist_ok=True)
    extra: dict[str, Any] = {} if clock_ms is None else {"clock_ms": clock_ms}
    return Shard.open(open_consensus(f"sqlite:///{root / 'c.db'}"),
                      open_blob(f"file://{root / 'blob'}"), "s", **extra)


def _reference(landing: Path, request: IngestRequest, through: str | None = None) -> Shard:
    shard = Shard.open(MemoryConsensus(), MemoryBlob(), "s")
    if through is not None:
        ingest(shard, str(landing), request, through=through)
    ingest(shard, str(landing), request)
    return shard


def _before_commit(shard: Shard, number: int, act: Callable[[], None]) -> list[int]:
    """Run ``act`` right before ``shard``'s append number ``number`` (from 1); returns the
    list of calls seen."""
    real = shard.compare_and_append
    calls: list[int] = []

    def append(*args: Any, **kwargs: Any) -> Any:
        calls.append(len(calls) + 1)
        if len(calls) == number:
            act()
        return real(*args, **kwargs)

    shard.compare_and_append = append  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize(("request_", "fenced_at"), [(REQUEST, 4), (GLOBAL_REQUEST, 2)])
def test_a_writer_fenced_between_two_commits_of_its_group_redoes_the_rest(
    spark: SparkSession, tmp_path: Path, request_: IngestRequest, fenced_at: int
) -> None:
    landing = make_landing(tmp_path / "landing", files=8, rows=25, keys=15, seed=fenced_at)
    writer = _shard(tmp_path / "shard")
    gc_report: list[Any] = []

    def fence() -> None:
        late = _shard(tmp_path / "shard", clock_ms=lambda: 2**50)  # past every lease
        gc_report.append(late.gc(leak_grace_ms=0, run_compaction=False))

    _before_commit(writer, fenced_at, fence)
    report = ingest(writer, str(landing), request_, engine=SparkEngine(spark))
    assert gc_report and gc_report[0].leases_expired == 1
    assert any("fenced" in w and "redoing it as a new writer" in w for w in report.warnings)
    names = sorted(p.name for p in landing.iterdir())
    assert [f.name for f in report.files] == names
    assert_recovered(writer, _reference(landing, request_))


def test_another_writer_commits_the_next_files_between_two_commits_of_a_group(
    spark: SparkSession, tmp_path: Path
) -> None:
    landing = make_landing(tmp_path / "landing", files=8, rows=25, keys=15, seed=11)
    writer = _shard(tmp_path / "shard")

    def other() -> None:  # 03 and 04 go in through another handle, in process
        ingest(_shard(tmp_path / "shard"), str(landing), REQUEST, through="004.jsonl")

    _before_commit(writer, 4, other)
    report = ingest(writer, str(landing), REQUEST, engine=SparkEngine(spark))
    names = sorted(p.name for p in landing.iterdir())
    assert [f.name for f in report.files] == [n for n in names if n not in
                                              ("003.jsonl", "004.jsonl")]
    assert report.ingested_elsewhere == ["003.jsonl", "004.jsonl"]
    assert_recovered(writer, _reference(landing, REQUEST))


KILLER = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from resources.spark_ingest import SparkEngine
    from resources.spark_session import get_spark
    from upsert_core.ingest import IngestRequest, ingest
    from upsert_core.persist.location.urls import open_blob, open_consensus
    from upsert_core.persist.shard import Shard

    root, landing, commits, scope = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    shard = Shard.open(open_consensus(f"sqlite:///{root / 'c.db'}"),
                       open_blob(f"file://{root / 'blob'}"), "s")
    real, calls = shard.compare_and_append, [0]

    def append(*args, **kwargs):
        calls[0] += 1
        if calls[0] > commits:
            os.kill(os.getpid(), signal.SIGKILL)  # the driver dies: no finally runs
        return real(*args, **kwargs)

    shard.compare_and_append = append
    spark = get_spark("local[2]", app_name="review-killed", shuffle_partitions=2,
                      log=root / "driver.log")
    ingest(shard, landing, IngestRequest(key=("key",), order="offset", buckets=2,
                                         inline_threshold=256, order_scope=scope),
           engine=SparkEngine(spark))
    print("not killed", flush=True)
""")


@pytest.mark.parametrize(("scope", "commits"), [("batch", 3)])
def test_a_driver_sigkilled_between_commits_of_a_group_leaves_a_prefix(
    spark: SparkSession, tmp_path: Path, scope: str, commits: int
) -> None:
    landing = make_landing(tmp_path / "landing", files=7, rows=25, keys=15, seed=3)
    root = tmp_path / "shard"
    root.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", KILLER, str(root), str(landing),
                           str(commits), scope], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    shard = _shard(root)
    names = sorted(p.name for p in landing.iterdir())
    assert sorted(shard.state().ingested_files) == names[:commits]
    assert [e["file"] for e in shard.errors()] == names[:commits]
    request = REQUEST if scope == "batch" else GLOBAL_REQUEST
    report = ingest(shard, str(landing), request, engine=SparkEngine(spark))
    assert [f.name for f in report.files] == names[commits:]
    assert_recovered(shard, _reference(landing, request))


class _Killed(BaseException):
    """The driver dying between two commits."""


def _dies_after(shard: Shard, commits: int) -> Callable[[], None]:
    real = shard.compare_and_append
    calls = [0]

    def append(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] > commits:
            raise _Killed(f"killed before commit {calls[0]}")
        return real(*args, **kwargs)

    shard.compare_and_append = append  # type: ignore[method-assign]
    return lambda: setattr(shard, "compare_and_append", real)


@pytest.mark.parametrize("request_", [REQUEST, GLOBAL_REQUEST])
def test_a_rerun_whose_first_file_arrived_late_after_a_partial_group(
    spark: SparkSession, tmp_path: Path, request_: IngestRequest
) -> None:
    landing = make_landing(tmp_path / "landing", files=8, rows=25, keys=15, seed=5)
    shard = _shard(tmp_path / "shard")
    undo = _dies_after(shard, 3)
    with pytest.raises(_Killed):
        ingest(shard, str(landing), request_, engine=SparkEngine(spark))
    undo()
    # A file sorting between the committed ones and the rest arrives: the re-run's
    # group starts with it, at the ts the dead group had planned for 003.
    write_jsonl(landing, "002a.jsonl", [{"key": k, "offset": 500, "v": f"late-{k}"}
                                        for k in range(0, 15, 2)])
    ingest(shard, str(landing), request_, engine=SparkEngine(spark))
    reference = Shard.open(MemoryConsensus(), MemoryBlob(), "s")
    (landing / "002a.jsonl").rename(tmp_path / "002a.jsonl")
    ingest(reference, str(landing), request_, through="002.jsonl")
    (tmp_path / "002a.jsonl").rename(landing / "002a.jsonl")
    ingest(reference, str(landing), request_)
    assert_recovered(shard, reference)


def test_kept_bases_through_a_group_then_a_partial_group_and_a_rerun(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Batch scope, buckets of many keys and files that touch a few: every bucket keeps
    its base through the group (its checkpoint stays the first file's, the updates since
    replayed), so the re-run after a partial group loads the base and replays the
    committed files' parts."""
    landing = tmp_path / "landing"
    landing.mkdir()
    write_jsonl(landing, "00.jsonl", [{"key": k, "offset": 0, "v": f"base-{k}"}
                                      for k in range(400)])
    for f in range(1, 10):
        rows: list[object] = [{"key": (f * 37 + j * 11) % 400, "offset": f, "v": f"{f}-{j}"}
                              for j in range(6)]
        rows.append({"key": (f * 13) % 400, "offset": f, "__deleted": True})
        rows.append({"key": None, "offset": f})
        write_jsonl(landing, f"{f:02d}.jsonl", rows)
    request = IngestRequest(buckets=2, inline_threshold=64, maintain=False)
    shard = _shard(tmp_path / "shard")
    ingest(shard, str(landing), request, engine=SparkEngine(spark), through="00.jsonl")
    undo = _dies_after(shard, 5)
    with pytest.raises(_Killed):
        ingest(shard, str(landing), request, engine=SparkEngine(spark))
    undo()
    assert shard.state().upper == 6
    bases = {k: v for k, v in shard.state().config.items() if "base" in k}
    assert bases and all(v.startswith("1:") for v in bases.values()), bases  # kept
    ingest(shard, str(landing), request, engine=SparkEngine(spark))
    assert_recovered(shard, _reference(landing, request, through="00.jsonl"))


def test_two_grouped_runs_at_once_apply_every_file_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Two ingests of one shard at once, each grouping on the same session (threads,
    each with its own handle): every file with its error rows applied once; a loser
    retries or stops with ``concurrently modified``."""
    import threading

    from upsert_core.errors import ConcurrentModification

    landing = make_landing(tmp_path / "landing", files=10, rows=20, keys=12, seed=8)
    _shard(tmp_path / "shard")
    start = threading.Barrier(2)
    raised: list[BaseException] = []

    def run() -> None:
        shard = _shard(tmp_path / "shard")
        start.wait()
        try:
            ingest(shard, str(landing), REQUEST, engine=SparkEngine(spark))
        except ConcurrentModification as exc:
            raised.append(exc)
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            raised.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    assert all(isinstance(e, ConcurrentModification) for e in raised), raised
    shard = _shard(tmp_path / "shard")
    ingest(shard, str(landing), REQUEST, engine=SparkEngine(spark))
    assert_recovered(shard, _reference(landing, REQUEST))


def test_a_file_that_crashes_the_groups_job_costs_one_failed_group_not_one_per_file(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file whose read kills the job's Python workers (say a line too big for their
    memory; simulated: the job runs, then fails as a whole whenever its group holds the
    file) fails every group that holds it. The driver then runs the group's first file
    on its own; if the next group started again from the file after it, each file
    before the poisoned one would cost a failed job of the whole rest of the group,
    reading every file again (quadratic work, and blobs left to GC) before the run
    reaches the file and reports it."""
    import resources.spark_ingest as spark_ingest
    from upsert_core.errors import IngestError
    from upsert_core.persist.testing import unreferenced_blobs

    landing = make_landing(tmp_path / "landing", files=12, rows=10, keys=8, seed=4)
    poison = "008.jsonl"
    real_job, real_file = spark_ingest.run_group_job, SparkEngine.run_file
    groups: list[list[str]] = []

    def crashing_job(spark: SparkSession, tasks: list[Any], *args: Any) -> list[str]:
        names = [t.file.name for t in tasks]
        groups.append(names)
        results = real_job(spark, tasks, *args)
        if poison in names:
            raise RuntimeError("Python worker exited unexpectedly (crashed)")
        return results

    def crashing_file(self: SparkEngine, task: Any, shard: Any) -> Any:
        if task.file.name == poison:
            raise IngestError(f"{poison}: the Spark job failed: Python worker exited"
                              " unexpectedly (crashed)")
        return real_file(self, task, shard)

    monkeypatch.setattr(spark_ingest, "run_group_job", crashing_job)
    monkeypatch.setattr(SparkEngine, "run_file", crashing_file)
    shard = _shard(tmp_path / "shard")
    with pytest.raises(IngestError, match=f"^{poison}: the Spark job failed"):
        ingest(shard, str(landing), REQUEST, engine=SparkEngine(spark))
    names = sorted(p.name for p in landing.iterdir())
    assert sorted(shard.state().ingested_files) == names[:8]
    assert len(groups) == 1, f"{len(groups)} group jobs read {sum(map(len, groups))} files"
    # One job's blobs left to GC (~5 a file: 58 here), not every failed group's (358).
    assert len(unreferenced_blobs(shard)) <= 12 * 2 * 4

    monkeypatch.undo()
    (landing / poison).unlink()
    ingest(shard, str(landing), REQUEST, engine=SparkEngine(spark))
    assert_recovered(shard, _reference(landing, REQUEST))


def test_gc_with_retention_between_a_groups_planning_and_its_job(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The buckets keep their base through the first run (their checkpoints stand on the
    first file, the updates since replayed from the shard's parts). The next run plans
    a group, then ``gc --retain 1`` (another process) compacts and truncates the history
    those replays read before the group's job starts: the group must not commit a state
    built on a replay that went missing, and the run completes as one without the GC."""
    from upsert_core.ingest import FileTask
    from upsert_core.ingest.outcome import FileOutcome
    from upsert_core.ingest.shard_api import IngestShard

    landing = tmp_path / "landing"
    landing.mkdir()
    write_jsonl(landing, "00.jsonl", [{"key": k, "offset": 0, "v": f"base-{k}"}
                                      for k in range(400)])
    for f in range(1, 12):
        rows: list[object] = [{"key": (f * 37 + j * 11) % 400, "offset": f, "v": f"{f}-{j}"}
                              for j in range(6)]
        rows.append({"key": (f * 13) % 400, "offset": f, "__deleted": True})
        write_jsonl(landing, f"{f:02d}.jsonl", rows)
    request = IngestRequest(buckets=2, inline_threshold=0, maintain=False)
    shard = _shard(tmp_path / "shard")
    # In process: no Spark worker caches these states, so the group loads the bases
    # and replays.
    ingest(shard, str(landing), request, through="06.jsonl")
    bases = {k: v for k, v in shard.state().config.items() if "base" in k}
    assert bases and all(v.startswith("1:") for v in bases.values()), bases

    failures: list[str] = []

    class GcFirst(SparkEngine):
        ran = 0

        def run_group(self, tasks: list[FileTask], s: IngestShard) -> list[FileOutcome]:
            if not self.ran:
                self.ran = 1
                _shard(tmp_path / "shard").gc(retain=1, leak_grace_ms=0)
            out = super().run_group(tasks, s)
            failures.extend(o.failure for o in out if o.failure is not None)
            return out

    ingest(shard, str(landing), request, engine=GcFirst(spark))
    assert failures and "missing" in failures[0]  # the replay's part was gone
    reference = Shard.open(MemoryConsensus(), MemoryBlob(), "s")
    ingest(reference, str(landing), request, through="06.jsonl")
    reference.gc(retain=1, leak_grace_ms=0)
    ingest(reference, str(landing), request)
    assert_recovered(shard, reference)
