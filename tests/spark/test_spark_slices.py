"""The Spark engine's slices, run in this process (no JVM): however slices and workers
split the buckets (modulo assignment, claims in any order, a worker claiming the
buckets it holds), every bucket runs exactly once and the shard equals the in-process
engine's; only slice 0 writes the error part; the driver turns task errors and missing
or duplicated buckets into a file error; a task runs with the collector off and leaves
its heap frozen."""

from __future__ import annotations

import gc
import random
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

import resources.spark_ingest as si
from resources.spark_ingest import outcome_of, run_slice
from tests.ingest.helpers import contents, memory_shard, write_jsonl
from upsert_core.errors import IngestError
from upsert_core.ingest import FileOutcome, FileTask, IngestRequest, ingest
from upsert_core.ingest.shard_api import IngestShard
from upsert_core.ingest.statecache import StateCache
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.codec_state import encode_state
from upsert_core.persist.testing import unreferenced_blobs

pytestmark = pytest.mark.spark

Order = Callable[[int], list[int]]


class SlicedInProcess:
    """Runs a file's slices one after another in this process, each slice on the
    "worker" (cache) ``worker_of`` says, in the order ``order`` gives, like the Spark
    engine would (claims in a fresh directory, or modulo assignment)."""

    def __init__(self, slices: int, order: Order, *, claims: bool, workers: int = 2) -> None:
        self.slices = slices
        self.order = order
        self.claims = claims
        self.caches = [StateCache() for _ in range(workers)]
        self.rng = random.Random(3)
        self.loaded: list[str] = []

    def run_file(self, task: FileTask, shard: IngestShard) -> FileOutcome:
        shipped = FileTask(**{**task.__dict__, "shard_state": None,
                              "shard_state_bytes": encode_state(task.load_shard_state())})
        url = si.blob_url_of(shard.blob)
        lines: list[str] = []
        with tempfile.TemporaryDirectory() as claims:
            for index in self.order(self.slices):
                cache = self.rng.choice(self.caches)
                si._cache = cache  # noqa: SLF001 - this slice's "worker"
                try:
                    lines += run_slice(shipped, url, {}, index, self.slices,
                                       claims if self.claims else None)
                finally:
                    si._cache = None  # noqa: SLF001
        outcome = outcome_of(task, lines)
        self.loaded += [b.loaded for b in outcome.buckets]
        return outcome


def _landing(root: Path, files: int = 4, seed: int = 2) -> None:
    rng = random.Random(seed)
    for i in range(files):
        rows: list[object] = [{"key": None, "offset": 1}]  # one error row per file
        for _ in range(40):
            row: dict[str, object] = {"key": rng.randrange(30), "offset": rng.randrange(9)}
            if rng.random() < 0.2:
                row["__deleted"] = True
            else:
                row["v"] = rng.choice("abc")
            rows.append(row)
        write_jsonl(root, f"{i:02d}.jsonl", rows)


def _shard(tmp_path: Path) -> Shard:
    return Shard.open(
        open_consensus(f"sqlite:///{tmp_path}/c.db"), open_blob(f"file://{tmp_path}/blob"), "s"
    )


@pytest.mark.parametrize(
    ("slices", "claims", "order"),
    [
        (2, False, lambda n: list(range(n))),
        (3, False, lambda n: list(reversed(range(n)))),
        (2, True, lambda n: list(range(n))),
        (4, True, lambda n: list(reversed(range(n)))),
    ],
)
def test_slices_equal_the_in_process_engine(
    tmp_path: Path, slices: int, claims: bool, order: Order
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    _landing(landing)
    shard = _shard(tmp_path)
    engine = SlicedInProcess(slices, order, claims=claims)
    request = IngestRequest(buckets=4)
    report = ingest(shard, str(landing), request, engine=engine)
    local = memory_shard("local")
    local_report = ingest(local, str(landing), request)
    assert [(f.name, f.inserts, f.retractions, f.errors) for f in report.files] == [
        (f.name, f.inserts, f.retractions, f.errors) for f in local_report.files
    ]
    assert contents(shard) == contents(local)
    assert list(shard.errors()) == list(local.errors())  # written once, by slice 0
    assert unreferenced_blobs(shard) == set()


def test_a_worker_claims_the_buckets_whose_state_it_holds(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    _landing(landing, files=1)
    shard = _shard(tmp_path)
    request = IngestRequest(buckets=4)
    engine = SlicedInProcess(2, lambda n: [0, 1], claims=True, workers=1)
    ingest(shard, str(landing), request, engine=engine)  # worker 0 now holds all 4
    holder, other = engine.caches[0], StateCache()
    write_jsonl(landing, "09.jsonl", [{"key": k, "offset": 50, "v": "z"} for k in range(30)])

    class TwoWorkers(SlicedInProcess):
        def run_file(self, task: FileTask, shard: IngestShard) -> FileOutcome:
            shipped = FileTask(**{**task.__dict__, "shard_state": None,
                                  "shard_state_bytes": encode_state(task.load_shard_state())})
            url = si.blob_url_of(shard.blob)
            with tempfile.TemporaryDirectory() as claims:
                # The holder claims its share before the other slice runs at all.
                si._cache = holder  # noqa: SLF001
                si._claim_cached(task, si._Claims(claims, 0, 2), holder)  # noqa: SLF001
                si._cache = other  # noqa: SLF001
                lines = run_slice(shipped, url, {}, 1, 2, claims)
                si._cache = holder  # noqa: SLF001
                lines += run_slice(shipped, url, {}, 0, 2, claims)
                si._cache = None  # noqa: SLF001
            outcome = outcome_of(task, lines)
            self.loaded += [f"{b.bucket}:{b.loaded}" for b in outcome.buckets]
            return outcome

    second = TwoWorkers(2, lambda n: [], claims=True)
    ingest(shard, str(landing), request, engine=second)
    from_cache = [x for x in second.loaded if x.endswith(":cache")]
    assert len(from_cache) == 2  # a fair share (4 buckets / 2 slices) stays with the holder
    assert len(second.loaded) == 4  # every bucket ran once
    local = memory_shard("local")
    ingest(local, str(landing), request)
    assert contents(shard) == contents(local)


def _task() -> FileTask:
    from upsert_core.landing import LandingFile

    file = LandingFile(name="f.jsonl", root="file:///nowhere", size=1)
    return FileTask(shard_id="s", ts=1, file=file, schema_json="{}", order_scope="batch",
                    buckets=2)


def test_the_driver_turns_task_problems_into_one_file_error() -> None:
    task = _task()
    read = '{"schema": null, "rows_read": 3, "good_rows": 3, "errors": null, ' \
           '"bytes_written": 0, "new_blobs": ["e1"], "file_error": null}'
    bucket = '{{"bucket": {b}, "parts": [], "checkpoint": "", "inserts": 1, ' \
             '"retractions": 0, "bytes_written": 0, "rehydrated": null, "warnings": [], ' \
             '"new_blobs": ["b{b}"], "failure": null}}'
    ok = [f"read:{read}", "expect:[0, 1]", f"bucket:{bucket.format(b=0)}",
          f"bucket:{bucket.format(b=1)}"]
    assert outcome_of(task, ok).read.file_error is None

    errored = outcome_of(task, [*ok[:3], "error:f.jsonl: OSError: disk gone"])
    assert errored.read.file_error == "f.jsonl: OSError: disk gone"
    assert sorted(errored.new_blobs) == ["b0", "e1"]  # all of it gets deleted

    missing = outcome_of(task, ok[:3])
    assert missing.read.file_error is not None and "expected [0, 1]" in missing.read.file_error
    doubled = outcome_of(task, [*ok, f"bucket:{bucket.format(b=1)}"])
    assert doubled.read.file_error is not None
    assert "ran buckets [0, 1, 1]" in doubled.read.file_error

    with pytest.raises(IngestError, match="returned 0 read results"):
        outcome_of(task, ok[1:])


def test_a_task_runs_without_the_collector_and_freezes_its_heap() -> None:
    gc.unfreeze()
    before = gc.get_freeze_count()
    assert gc.isenabled()
    with si._frozen_after():  # noqa: SLF001
        assert not gc.isenabled()
        kept = [[i] for i in range(1000)]
    assert gc.isenabled()
    assert gc.get_freeze_count() >= before + len(kept)
    gc.unfreeze()
    gc.disable()
    try:
        with si._frozen_after():  # noqa: SLF001
            pass
        assert not gc.isenabled()  # a caller's disabled collector stays disabled
    finally:
        gc.enable()
        gc.unfreeze()


def test_a_file_that_changes_between_slices_is_left_pending_whole(tmp_path: Path) -> None:
    """Slice 0 reads the listed version; the file then grows before slice 1 reads it:
    slice 1 reports ``changed``, nothing of the file is committed (not even slice 0's
    buckets), and the next run ingests the whole file."""
    landing = tmp_path / "landing"
    landing.mkdir()
    path = write_jsonl(landing, "a.jsonl", [{"key": k, "offset": 1} for k in range(20)])

    def between_slices(slices: int) -> list[int]:
        def order():  # type: ignore[no-untyped-def]
            yield 0
            with path.open("ab") as fh:
                fh.write(b'{"key": 99, "offset": 1}\n')
            yield from range(1, slices)

        return order()  # type: ignore[no-any-return]

    shard = _shard(tmp_path)
    engine = SlicedInProcess(2, between_slices, claims=False)
    report = ingest(shard, str(landing), IngestRequest(buckets=4), engine=engine)
    assert report.files == [] and report.pending == ["a.jsonl"]
    assert report.warnings[0].startswith("a.jsonl: changed while being ingested")
    assert shard.state().upper == 0 and unreferenced_blobs(shard) == set()

    report = ingest(shard, str(landing), IngestRequest(buckets=4))
    assert [f.name for f in report.files] == ["a.jsonl"] and report.rows_read == 21
