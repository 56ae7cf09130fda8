"""The split read steps (``ingest.split_steps``), run in this process as the Spark
engine's split path runs them in tasks: the shard, its error rows (file row numbers
included) and the counts equal the in-process engine's whole-file read, on random JSON
Lines and Parquet files cut anywhere; splits that disagree on the schema, or a split
with a file-level problem, fall back to the whole file instead of guessing. The splits'
block digests make the file's ledger record, the one the whole-file read records, with
no second read, and the record catches a file rewritten under its name."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.ingest.helpers import contents, memory_shard, write_jsonl
from upsert_core.errors import IngestError
from upsert_core.ingest import FileOutcome, FileTask, IngestReport, IngestRequest, ingest
from upsert_core.ingest.engine import InProcessEngine
from upsert_core.ingest.ledger import recorded
from upsert_core.ingest.shard_api import IngestShard
from upsert_core.ingest.split_steps import (
    Fallback,
    SplitMeta,
    bucket_rows,
    gather_read,
    read_split_step,
)
from upsert_core.ingest.tasks import ROWS_SCHEMA, run_bucket
from upsert_core.landing import LandingFile, digest, list_landing
from upsert_core.landing.splits import plan_splits


class SplitInProcess:
    """Reads each file as splits of ``split_bytes`` (in a shuffled order), gathers the
    read and the buckets' rows as the Spark engine's shuffle does, and drains each
    bucket with the one bucket step; falls back to the whole-file engine when told."""

    def __init__(self, split_bytes: int, seed: int = 0) -> None:
        self.split_bytes = split_bytes
        self.rng = random.Random(seed)
        self.fallbacks: list[str] = []
        self.split_files = 0

    def run_file(self, task: FileTask, shard: IngestShard) -> FileOutcome:
        splits = plan_splits(task.file, self.split_bytes)
        self.rng.shuffle(splits)
        reads = [read_split_step(task, s) for s in splits]
        metas = [m for m, _, _ in reads]
        got = gather_read(task, metas, [e for _, e, _ in reads], shard.blob)
        if isinstance(got, Fallback):
            self.fallbacks.append(got.reason)
            return InProcessEngine(cache=None).run_file(task, shard)
        self.split_files += 1
        read, expected = got
        outcome = FileOutcome(read=read)
        if read.changed or read.file_error:
            return outcome
        for bucket in expected:
            pieces = [groups.get(bucket, _empty()) for _, _, groups in reads]
            rows = bucket_rows(task, metas, pieces)
            assert isinstance(rows, tuple)
            outcome.buckets.append(run_bucket(task, bucket, rows[0], shard.blob, None, rows[1]))
        return outcome


def _empty() -> pa.Table:
    return ROWS_SCHEMA.empty_table()


def _counts(report: IngestReport) -> list[tuple[str, int, int, int, int, int]]:
    return [(f.name, f.ts, f.rows_read, f.inserts, f.retractions, f.errors) for f in report.files]


VALUE = st.one_of(st.none(), st.sampled_from(["a", "b", "c"]), st.integers(0, 3),
                  st.sampled_from([1.5, True, "x\ny"]))
ROW = st.one_of(
    st.fixed_dictionaries(
        {"key": st.integers(0, 12), "offset": st.integers(0, 6)},
        optional={"v": VALUE, "__deleted": st.sampled_from([True, False, "TRUE", "maybe"]),
                  "w": st.integers(0, 9)},
    ),
    st.sampled_from([{"key": None, "offset": 1}, {"key": 1, "offset": None}, "{broken",
                     "", "[]", {"key": "7", "offset": 2}]),
)


@settings(max_examples=40, deadline=None)
@given(files=st.lists(st.lists(ROW, max_size=30), min_size=1, max_size=3),
       split_bytes=st.integers(20, 600), buckets=st.integers(1, 4),
       scope=st.sampled_from(["batch", "global"]))
def test_split_reads_equal_the_whole_file_read(
    tmp_path_factory: pytest.TempPathFactory, files: list[list[object]], split_bytes: int,
    buckets: int, scope: str,
) -> None:
    landing = tmp_path_factory.mktemp("landing")
    for i, rows in enumerate(files):
        write_jsonl(landing, f"{i:02d}.jsonl", [r if isinstance(r, str) else json.dumps(r)
                                                for r in rows])
    request = IngestRequest(buckets=buckets, order_scope=scope)
    split = memory_shard("split")
    whole = memory_shard("whole")
    try:
        whole_report = ingest(whole, str(landing), request, engine=InProcessEngine(cache=None))
    except IngestError as exc:
        with pytest.raises(IngestError) as caught:
            ingest(split, str(landing), request, engine=SplitInProcess(split_bytes))
        assert str(caught.value) == str(exc)
        return
    split_report = ingest(split, str(landing), request, engine=SplitInProcess(split_bytes))
    assert _counts(split_report) == _counts(whole_report)
    assert contents(split) == contents(whole)
    assert list(split.errors()) == list(whole.errors())


def test_parquet_row_groups_with_error_rows_in_several_splits(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    rng = random.Random(5)
    n = 2000
    keys = [None if i % 151 == 7 else rng.randrange(300) for i in range(n)]
    table = pa.table({"key": pa.array(keys, pa.int64()),
                      "offset": pa.array([rng.randrange(20) for _ in range(n)], pa.int64()),
                      "v": [rng.choice(["a", "b", "c"]) for _ in range(n)]})
    pq.write_table(table, landing / "00.parquet", row_group_size=250)
    engine = SplitInProcess(split_bytes=(landing / "00.parquet").stat().st_size // 6)
    request = IngestRequest(buckets=8)
    split, whole = memory_shard("split"), memory_shard("whole")
    assert _counts(ingest(split, str(landing), request, engine=engine)) == _counts(
        ingest(whole, str(landing), request))
    assert engine.split_files == 1 and not engine.fallbacks
    assert contents(split) == contents(whole)
    errors = list(split.errors())
    assert errors == list(whole.errors())
    assert [e["row"] for e in errors] == [i + 1 for i in range(n) if i % 151 == 7]


def test_splits_that_type_a_new_column_differently_fall_back_to_the_whole_file(
    tmp_path: Path,
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    rows = [{"key": i, "offset": 1, "v": i} for i in range(40)]
    rows += [{"key": i, "offset": 1, "v": i + 0.5} for i in range(40, 80)]  # float64 whole
    write_jsonl(landing, "00.jsonl", rows)
    engine = SplitInProcess(split_bytes=400)
    split, whole = memory_shard("split"), memory_shard("whole")
    ingest(split, str(landing), IngestRequest(buckets=2), engine=engine)
    ingest(whole, str(landing), IngestRequest(buckets=2))
    assert engine.fallbacks == [f"the {len(plan_splits(_file(landing), 400))} splits evolve"
                                " the schema differently"]
    assert contents(split) == contents(whole)


def test_a_split_without_the_key_column_falls_back_and_the_rows_are_error_rows(
    tmp_path: Path,
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    rows: list[object] = [{"key": i, "offset": 1} for i in range(30)]
    rows += [{"offset": 2, "v": "no key"} for _ in range(30)]  # a whole split of them
    write_jsonl(landing, "00.jsonl", rows)
    engine = SplitInProcess(split_bytes=300)
    split, whole = memory_shard("split"), memory_shard("whole")
    ingest(split, str(landing), IngestRequest(buckets=2), engine=engine)
    ingest(whole, str(landing), IngestRequest(buckets=2))
    assert engine.fallbacks and "missing key column 'key'" in engine.fallbacks[0]
    assert list(split.errors()) == list(whole.errors())
    assert len(list(split.errors())) == 30


def _file(landing: Path) -> LandingFile:
    return list_landing(str(landing))[0]


def test_a_missing_or_repeated_split_is_refused(tmp_path: Path) -> None:
    task = FileTask(shard_id="s", ts=0, file=_file_of(tmp_path), schema_json="{}",
                    order_scope="batch", buckets=1)
    metas = [SplitMeta(0, 3), SplitMeta(2, 3)]
    with pytest.raises(IngestError, match=r"got splits \[0, 2\] of 3"):
        gather_read(task, metas, [_empty(), _empty()], memory_shard().blob)
    with pytest.raises(IngestError, match=r"got splits \[0, 0\] of 1"):
        bucket_rows(task, [SplitMeta(0, 1), SplitMeta(0, 1)], [_empty(), _empty()])


def _file_of(tmp_path: Path) -> LandingFile:
    write_jsonl(tmp_path, "f.jsonl", [{"key": 1, "offset": 1}])
    return _file(tmp_path)


def _landing_file(landing: Path, fmt: str) -> Path:
    """A file of about 200 KB (8 row groups for Parquet)."""
    rng = random.Random(3)
    n = 6000
    table = pa.table({"key": pa.array(range(n), pa.int64()),
                      "offset": pa.array([rng.randrange(20) for _ in range(n)], pa.int64()),
                      "v": [f"value {rng.randrange(10 ** 6):06d}" for _ in range(n)]})
    if fmt == "parquet":
        pq.write_table(table, landing / "00.parquet", row_group_size=n // 8,
                       compression="none")
    else:
        write_jsonl(landing, "00.jsonl", table.to_pylist())
    return landing / f"00.{fmt}"


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_the_splits_digest_the_file_as_they_read_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    monkeypatch.setattr(digest, "MIN_BLOCK_BYTES", 1024)  # many blocks, several per split
    landing = tmp_path / "landing"
    landing.mkdir()
    path = _landing_file(landing, fmt)
    size = path.stat().st_size
    engine = SplitInProcess(split_bytes=size // 4)
    split, whole = memory_shard("split"), memory_shard("whole")
    [read] = ingest(split, str(landing), IngestRequest(buckets=4), engine=engine).files
    assert engine.split_files == 1 and not engine.fallbacks
    ingest(whole, str(landing), IngestRequest(buckets=4))
    record = recorded(split.state(), path.name)
    assert record is not None and record == recorded(whole.state(), path.name)
    assert record.kind.block == 1024
    assert read.digest_bytes_read == 0  # nothing read again for the record
    assert size <= read.landing_bytes_read <= 1.1 * size

    # The record catches a rewrite of the same size; touching the file is silent.
    data = bytearray(path.read_bytes())
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 5_000_000_000))
    assert ingest(split, str(landing), IngestRequest(), engine=engine).warnings == []
    at = data.index(b"value ") + 6
    data[at:at + 1] = b"X"  # one byte of one value: JSON and uncompressed Parquet alike
    path.write_bytes(bytes(data))
    write_jsonl(landing, "01.jsonl", [{"key": 1, "offset": 99, "v": "later"}])
    report = ingest(split, str(landing), IngestRequest(), engine=engine)
    assert report.rewritten == [path.name]
    assert [f.name for f in report.files] == ["01.jsonl"]
