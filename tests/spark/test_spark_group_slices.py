"""The Spark engine's group path (``resources/spark_group.py``), its slices run one after
another in this process (no JVM), driven by the real ingest driver: on random landings
(columns added along the way with agreeing or clashing types, error rows, deletes, empty
files, a file without its key column, both order scopes, ``--missing keep``), whatever
the number of slices and buckets, the group bound and which "worker" cache each slice
finds, the shard equals the in-process engine's ts by ts, with the same error and late
rows and the same ingested files, and the run fails at the same file with the same
message; a group stops where a file's schema would differ from the one it was read with,
and runs it again on the shard as it then is."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resources.spark_group import group_outcomes, run_group_slice
from resources.spark_split import WorkerHooks
from tests.ingest.helpers import contents, memory_shard, write_jsonl
from upsert_core.errors import ConcurrentModification, IngestError
from upsert_core.ingest import (
    BucketResult,
    FileOutcome,
    FileTask,
    IngestReport,
    IngestRequest,
    InProcessEngine,
    ingest,
)
from upsert_core.ingest.shard_api import IngestShard
from upsert_core.ingest.statecache import StateCache
from upsert_core.landing import LandingFile
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.codec_state import encode_state
from upsert_core.persist.testing import unreferenced_blobs
from upsert_core.shard_table import ShardTable

pytestmark = pytest.mark.spark


class GroupedInProcess:
    """The Spark engine's two paths without Spark: a file on its own in this process (the
    in-process engine; the one-stage path's equivalence is tested elsewhere), a group as
    its ``slices`` slices run one after another, each on the "worker" (state cache) a
    seeded choice gives, at most ``bound`` files a group."""

    def __init__(self, slices: int, bound: int, workers: int = 2, seed: int = 0,
                 meet: threading.Barrier | None = None) -> None:
        self.slices, self.bound, self.meet = slices, bound, meet
        self.caches = [StateCache() for _ in range(workers)]
        self.rng = random.Random(seed)
        self.single = InProcessEngine(cache=None, threads=1)
        self.groups: list[int] = []  # files per group run, in order
        self.lines: list[list[str]] = []  # every line of each group run

    def run_file(self, task: FileTask, shard: IngestShard) -> FileOutcome:
        return self.single.run_file(task, shard)

    def group_size(self, files: Sequence[LandingFile], envelope: str) -> int:
        n = min(len(files), self.bound)
        return n if n >= 2 else 0

    def run_group(self, tasks: list[FileTask], shard: IngestShard) -> list[FileOutcome]:
        first = tasks[0]
        shipped = [dataclasses.replace(first, shard_state=None,
                                       shard_state_bytes=encode_state(first.load_shard_state())),
                   *tasks[1:]]
        self.groups.append(len(tasks))
        lines: list[str] = []
        for index in self.rng.sample(range(self.slices), self.slices):
            cache = self.rng.choice(self.caches)
            hooks = WorkerHooks(frozen=contextlib.nullcontext,
                                blob=lambda url, env: shard.blob,
                                cache=lambda cache=cache: cache)  # type: ignore[misc]
            lines += run_group_slice(shipped, "", {}, index, self.slices, hooks)
        self.lines.append(lines)
        if self.meet is not None:  # racing runs: each group's job done before any commits
            with contextlib.suppress(threading.BrokenBarrierError):
                self.meet.wait(timeout=2)
        outcomes, unused = group_outcomes(tasks, lines)
        for key in unused:
            shard.blob.delete(key)
        return outcomes


def _value(rng: random.Random, kind: str) -> Any:
    if kind == "int":
        return rng.randrange(-5, 5)
    if kind == "float":
        return rng.randrange(10) + 0.5
    return rng.choice("xyz")


def _write_landing(root: Path, seed: int, files: int, extras: list[tuple[str, str, int]],
                   broken: int | None) -> list[str]:
    """JSON Lines files ``00.jsonl``...: upserts, deletes, a null key now and then, and
    for each ``(column, kind, from)`` of ``extras`` a column of that kind in the files
    from ``from`` on (in some rows); file ``broken`` has no key column."""
    rng = random.Random(seed)
    names = []
    for f in range(files):
        rows: list[object] = []
        if f == broken:
            rows = [{"id": 1, "offset": 1, "v": "a"}]
        for _ in range(rng.randrange(0, 12) if f != broken else 0):
            row: dict[str, Any] = {"key": rng.randrange(8), "offset": rng.randrange(6)}
            if rng.random() < 0.1:
                row["key"] = None
            if rng.random() < 0.2:
                row["__deleted"] = True
            else:
                row["v"] = rng.choice("abc")
                for column, kind, start in extras:
                    if f >= start and rng.random() < 0.7:
                        row[column] = _value(rng, kind)
            rows.append(row)
        names.append(write_jsonl(root, f"{f:02d}.jsonl", rows).name)
    return names


def _ingest(shard: Shard, landing: Path, request: IngestRequest, engine: object) -> str | None:
    """The run's error message, or None."""
    try:
        ingest(shard, str(landing), request, engine=engine)  # type: ignore[arg-type]
    except IngestError as exc:
        return str(exc)
    return None


def _drained(lines: list[str]) -> dict[int, list[BucketResult]]:
    """The bucket results of a group run, by file index."""
    out: dict[int, list[BucketResult]] = {}
    for line in lines:
        index, _, rest = line.partition("|")
        if rest.startswith("bucket:"):
            out.setdefault(int(index), []).append(BucketResult.from_json(rest[len("bucket:"):]))
    return out


def _same_shards(grouped: Shard, local: Shard) -> None:
    assert grouped.state().upper == local.state().upper
    assert dict(grouped.state().ingested_files) == dict(local.state().ingested_files)
    assert contents(grouped) == contents(local)
    assert list(grouped.errors()) == list(local.errors())
    assert list(ShardTable(grouped).late_records()) == list(ShardTable(local).late_records())


extras_st = st.lists(
    st.tuples(st.sampled_from(["w", "u"]), st.sampled_from(["int", "float", "str"]),
              st.integers(0, 9)),
    max_size=3,
)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), files=st.integers(2, 10), extras=extras_st,
       broken=st.one_of(st.none(), st.integers(0, 9)), slices=st.integers(1, 3),
       buckets=st.integers(1, 4), bound=st.integers(2, 6),
       scope=st.sampled_from(["batch", "global"]), missing=st.sampled_from(["null", "keep"]))
def test_groups_equal_the_in_process_engine_file_by_file(
    tmp_path_factory: pytest.TempPathFactory, seed: int, files: int,
    extras: list[tuple[str, str, int]], broken: int | None, slices: int, buckets: int,
    bound: int, scope: str, missing: str,
) -> None:
    landing = tmp_path_factory.mktemp("landing")
    _write_landing(landing, seed, files, extras, broken)
    request = IngestRequest(buckets=buckets, order_scope=scope, missing=missing,
                            inline_threshold=64, maintain=False)
    grouped, local = memory_shard("s"), memory_shard("s")
    engine = GroupedInProcess(slices, bound, seed=seed)
    assert _ingest(grouped, landing, request, engine) == _ingest(local, landing, request,
                                                                 InProcessEngine())
    _same_shards(grouped, local)
    assert unreferenced_blobs(grouped) == set()
    if broken is not None and broken < files:  # fixed: the rest goes in too
        (landing / f"{broken:02d}.jsonl").unlink()
        assert _ingest(grouped, landing, request, engine) == _ingest(
            local, landing, request, InProcessEngine())
        _same_shards(grouped, local)
        assert unreferenced_blobs(grouped) == set()


def test_a_group_runs_again_from_a_file_whose_schema_it_could_not_stand_for(
    tmp_path: Path,
) -> None:
    # 02 adds "w" as integers; 05 has floats in it: read with the group's first schema
    # (no "w") they would type it float64, but after 02 they are values of an integer
    # column that do not convert (error rows). So the first group ends before 05, and
    # a second group starts there.
    landing = tmp_path / "landing"
    landing.mkdir()
    for f in range(8):
        rows: list[dict[str, Any]] = [{"key": k, "offset": f, "v": f"{f}"} for k in range(4)]
        if f >= 2:
            rows[0]["w"] = 2.5 if f == 5 else f
        write_jsonl(landing, f"{f:02d}.jsonl", rows)
    request = IngestRequest(buckets=2, maintain=False)
    engine = GroupedInProcess(slices=2, bound=100)
    grouped, local = memory_shard(), memory_shard()
    ingest(grouped, str(landing), request, engine=engine)
    ingest(local, str(landing), request)
    assert engine.groups == [8, 3]  # files 00-04, then 05-07
    first = _drained(engine.lines[0])  # the first group drained 00-04 only, and did so
    assert sorted(first) == [0, 1, 2, 3, 4]
    assert all(r.failure is None for results in first.values() for r in results)
    _same_shards(grouped, local)
    assert [e["file"] for e in grouped.errors()] == ["05.jsonl"]
    assert unreferenced_blobs(grouped) == set()


def test_a_file_error_after_a_schema_change_in_its_group_is_checked_again(
    tmp_path: Path,
) -> None:
    # 01 adds "c" as integers; 03's "c" holds JSON objects, a file-level problem when
    # "c" is inferred (the group's first schema) but only error rows in an integer
    # column: 03 is not refused, it is run again after 02 and its rows are errors.
    landing = tmp_path / "landing"
    landing.mkdir()
    for f in range(5):
        rows: list[dict[str, Any]] = [{"key": k, "offset": f} for k in range(3)]
        if f >= 1:
            for row in rows:
                row["c"] = {"o": 1} if f == 3 else f
        write_jsonl(landing, f"{f:02d}.jsonl", rows)
    request = IngestRequest(buckets=2, maintain=False)
    engine = GroupedInProcess(slices=2, bound=100)
    grouped, local = memory_shard(), memory_shard()
    ingest(grouped, str(landing), request, engine=engine)
    ingest(local, str(landing), request)
    assert engine.groups == [5, 2]
    first = _drained(engine.lines[0])  # the first group drained 00-02 only, and did so
    assert sorted(first) == [0, 1, 2]
    assert all(r.failure is None for results in first.values() for r in results)
    _same_shards(grouped, local)
    assert {e["file"] for e in grouped.errors()} == {"03.jsonl"}


def test_a_failed_bucket_commits_the_files_before_it_and_reruns_from_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bucket step that fails in a group (say a part a concurrent GC removed) leaves
    the files before it committed and the driver runs that file on its own."""
    import upsert_core.ingest.tasks as tasks_module

    landing = tmp_path / "landing"
    landing.mkdir()
    for f in range(6):
        write_jsonl(landing, f"{f:02d}.jsonl",
                    [{"key": k, "offset": f, "v": f"{f}-{k}"} for k in range(6)])
    real = tasks_module._run_bucket  # noqa: SLF001
    failed: list[int] = []

    def flaky(task: FileTask, *args: Any, **kwargs: Any) -> None:
        if task.ts == 3 and not failed:
            failed.append(task.ts)
            from upsert_core.errors import NotReadable

            raise NotReadable("a part went missing")
        real(task, *args, **kwargs)

    monkeypatch.setattr(tasks_module, "_run_bucket", flaky)
    request = IngestRequest(buckets=2, maintain=False)
    engine = GroupedInProcess(slices=2, bound=100)
    grouped, local = memory_shard(), memory_shard()
    report = ingest(grouped, str(landing), request, engine=engine)
    ingest(local, str(landing), request)
    assert failed == [3]
    assert engine.groups == [6, 3]  # 00-02 committed, then 03-05 as a new group
    assert [f.name for f in report.files] == [f"{f:02d}.jsonl" for f in range(6)]
    _same_shards(grouped, local)
    assert unreferenced_blobs(grouped) == set()


def test_racing_groups_apply_every_file_exactly_once(tmp_path: Path) -> None:
    """Two runs grouping the same files on one shard (threads, each with its own handle
    on SQLite + local files): a group that loses a commit stops there and the loop goes
    on; every file, with its error rows, is applied once and nothing is left behind."""
    landing = tmp_path / "landing"
    landing.mkdir()
    for f in range(12):
        rows: list[object] = [{"key": (f * 3 + j) % 7, "offset": f, "v": f"{f}-{j}"}
                              for j in range(5)]
        rows.append({"key": None, "offset": f})  # one error row per file
        write_jsonl(landing, f"{f:02d}.jsonl", rows)

    def open_shard() -> Shard:
        return Shard.open(open_consensus(f"sqlite:///{tmp_path}/c.db"),
                          open_blob(f"file://{tmp_path}/blob"), "race")

    open_shard()  # created once
    request = IngestRequest(buckets=3, max_attempts=50, maintain=False)
    start, meet = threading.Barrier(2), threading.Barrier(2)
    reports: list[IngestReport] = []
    raised: list[BaseException] = []

    refused: list[int] = []  # appends that lost to the other run

    def run(seed: int) -> None:
        shard = open_shard()
        append = shard.compare_and_append

        def counted(*args: Any, **kwargs: Any) -> Any:
            result = append(*args, **kwargs)
            if not result.committed:
                refused.append(result.actual_upper)
            return result

        shard.compare_and_append = counted  # type: ignore[method-assign]
        start.wait()
        try:
            reports.append(ingest(shard, str(landing), request,
                                  engine=GroupedInProcess(2, bound=4, seed=seed, meet=meet)))
        except ConcurrentModification as exc:  # an allowed outcome for a loser
            raised.append(exc)
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            raised.append(exc)

    threads = [threading.Thread(target=run, args=(seed,)) for seed in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(isinstance(e, ConcurrentModification) for e in raised), raised
    shard = open_shard()
    ingest(shard, str(landing), request)  # completes whatever a loser left
    committed = [f.name for r in reports for f in r.files]
    assert len(committed) == len(set(committed))  # no file committed by both
    assert refused, "the runs never raced"
    assert sorted(shard.state().ingested_files.values()) == list(range(12))
    assert sorted((e["file"], e["row"]) for e in shard.errors()) == [
        (f"{f:02d}.jsonl", 6) for f in range(12)]
    assert unreferenced_blobs(shard) == set()
    single = memory_shard()
    ingest(single, str(landing), request)
    _same_shards(shard, single)


def test_a_file_changed_under_a_group_waits_with_the_files_after_it(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    for f in range(6):
        write_jsonl(landing, f"{f:02d}.jsonl", [{"key": f, "offset": 1, "v": "a"}])

    class StillWriting(GroupedInProcess):
        """A writer appends to 03.jsonl after the listing, before the group reads it."""

        def run_group(self, tasks: list[FileTask], shard: IngestShard) -> list[FileOutcome]:
            if not self.groups:
                with (landing / "03.jsonl").open("ab") as fh:
                    fh.write(b'{"key": 7, "offset": 1, "v": "late"}\n')
            return super().run_group(tasks, shard)

    shard, engine = memory_shard(), StillWriting(slices=2, bound=100)
    report = ingest(shard, str(landing), IngestRequest(buckets=2), engine=engine)
    assert [f.name for f in report.files] == ["00.jsonl", "01.jsonl", "02.jsonl"]
    assert report.pending == ["03.jsonl", "04.jsonl", "05.jsonl"]
    [warning] = report.warnings
    assert warning.startswith("03.jsonl: changed while being ingested")
    assert "left pending for the next run, with the 2 file(s) after it" in warning
    assert unreferenced_blobs(shard) == set()
    report = ingest(shard, str(landing), IngestRequest(buckets=2), engine=engine)
    assert [f.name for f in report.files] == ["03.jsonl", "04.jsonl", "05.jsonl"]
    local = memory_shard()
    ingest(local, str(landing), IngestRequest(buckets=2))
    _same_shards(shard, local)
