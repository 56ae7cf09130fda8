"""The pieces of a group (``ingest.group``) against the driver's own planning: the tasks a
group plans before any commit, advanced by the results of the files before them, are
the tasks the driver plans for the same files one by one after each commit; the
schema chain admits exactly the files that read the same with the group's first
schema as after the files before them."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.ingest.helpers import memory_shard, write_jsonl
from upsert_core.ingest import FileOutcome, FileTask, IngestRequest, InProcessEngine, ingest
from upsert_core.ingest.group import (
    BucketEntries,
    GroupChain,
    SchemaChain,
    Verdict,
    extends,
    group_tasks,
)
from upsert_core.ingest.outcome import FileRead
from upsert_core.ingest.shard_api import IngestShard
from upsert_core.landing import SourceSchema
from upsert_core.landing.schema import LogicalType


class Recording(InProcessEngine):
    """The in-process engine, keeping every task it ran and its outcome."""

    def __init__(self) -> None:
        super().__init__(threads=1)
        self.runs: list[tuple[FileTask, FileOutcome]] = []

    def run_file(self, task: FileTask, shard: IngestShard) -> FileOutcome:
        outcome = super().run_file(task, shard)
        self.runs.append((task, outcome))
        return outcome


@pytest.mark.parametrize("scope", ["batch", "global"])
def test_a_groups_tasks_are_the_tasks_the_driver_plans_after_each_commit(
    tmp_path: Path, scope: str
) -> None:
    rng = random.Random(4)
    for f in range(8):  # few keys per file: some buckets have no rows in some files
        rows = [{"key": rng.randrange(30), "offset": rng.randrange(5), "v": f"{f}"}
                for _ in range(rng.randrange(0, 4))]
        write_jsonl(tmp_path, f"{f:02d}.jsonl", rows)
    shard = memory_shard()
    engine = Recording()
    request = IngestRequest(buckets=5, order_scope=scope, maintain=False)
    ingest(shard, str(tmp_path), request, engine=engine, through="01.jsonl")
    ingest(shard, str(tmp_path), request, engine=engine)  # planned one by one
    sequential = engine.runs[2:]
    first = sequential[0][0]
    tasks = group_tasks(first, [task.file for task, _ in sequential])
    chain = GroupChain(tasks)
    for k, (planned, outcome) in enumerate(sequential):
        predicted = chain.task(k)
        assert predicted.file == planned.file and predicted.ts == planned.ts
        assert predicted.checkpoints_current == planned.checkpoints_current
        assert sorted(predicted.history) == sorted(planned.history)
        for bucket in range(5):
            assert BucketEntries.of(predicted, bucket) == BucketEntries.of(planned, bucket)
        chain.advance(outcome.buckets)
        if k + 1 < len(tasks):  # the nonce each next task's history names is its own
            assert tasks[k + 1].history[planned.ts + 1] == tasks[k].commit_nonce


def test_the_first_commit_of_a_global_shard_records_no_tombstones_for_every_bucket(
    tmp_path: Path,
) -> None:
    write_jsonl(tmp_path, "00.jsonl", [{"key": 1, "offset": 1}])
    write_jsonl(tmp_path, "01.jsonl", [{"key": 2, "offset": 1}])
    shard = memory_shard()
    engine = Recording()
    ingest(shard, str(tmp_path), IngestRequest(buckets=4, order_scope="global"),
           engine=engine)
    (first, outcome), (second, _) = engine.runs
    tasks = group_tasks(first, [first.file, second.file])
    assert first.tombstones == {}
    idle = set(range(4)) - {r.bucket for r in outcome.buckets}
    assert idle
    assert {b: tasks[1].tombstones.get(b) for b in idle} == {b: "" for b in idle}
    assert {b: second.tombstones.get(b) for b in idle} == {b: "" for b in idle}


def _schema(*columns: tuple[str, LogicalType]) -> SourceSchema:
    return SourceSchema(columns=columns)


KEY = ("key", LogicalType.INT64)
OFFSET = ("offset", LogicalType.INT64)
W_INT = ("w", LogicalType.INT64)
W_FLOAT = ("w", LogicalType.FLOAT64)
U = ("u", LogicalType.STRING)


def _read(schema: SourceSchema | None = None, *, error: str | None = None,
          changed: str | None = None) -> FileRead:
    return FileRead(schema_json=None if schema is None else schema.to_json(),
                    file_error=error, changed=changed)


def test_extends_means_the_same_columns_first_in_order_and_type() -> None:
    base = _schema(KEY, OFFSET)
    assert extends(base, base)
    assert extends(_schema(KEY, OFFSET, W_INT, U), _schema(KEY, OFFSET, W_INT))
    assert not extends(_schema(KEY, OFFSET, U, W_INT), _schema(KEY, OFFSET, W_INT))
    assert not extends(_schema(KEY, OFFSET, W_FLOAT), _schema(KEY, OFFSET, W_INT))
    assert not extends(_schema(KEY, OFFSET), _schema(KEY, OFFSET, W_INT))
    assert not extends(SourceSchema(key=("id",), columns=(KEY, OFFSET)), base)


def test_the_schema_chain_admits_files_that_read_the_same_after_the_ones_before() -> None:
    start = _schema(KEY, OFFSET)
    chain = SchemaChain(start.to_json(), lenient=True)
    assert chain.admit(_read(start)) is Verdict.APPLY
    assert chain.admit(_read(_schema(KEY, OFFSET, W_INT))) is Verdict.APPLY  # adds w
    assert chain.admit(_read(_schema(KEY, OFFSET, W_INT, U))) is Verdict.APPLY  # adds u
    # Adds nothing to the first schema: read after them, w and u are null and last.
    assert chain.admit(_read(start)) is Verdict.APPLY
    assert chain.current == _schema(KEY, OFFSET, W_INT, U)
    # Only u, not w: after them its u would be the fourth column, not the third.
    assert chain.admit(_read(_schema(KEY, OFFSET, U))) is Verdict.AGAIN
    assert chain.admit(_read(_schema(KEY, OFFSET, W_FLOAT, U))) is Verdict.AGAIN
    # A file-level problem is the file's own only while nothing evolved before it.
    assert chain.admit(_read(error="f: missing key column 'key'")) is Verdict.AGAIN
    fresh = SchemaChain(start.to_json())
    assert fresh.admit(_read(error="f: missing key column 'key'")) is Verdict.ERROR
    assert fresh.admit(_read(changed="f: changed")) is Verdict.CHANGED


def test_without_leniency_a_file_lacking_the_added_columns_ends_the_group() -> None:
    start = _schema(KEY, OFFSET)
    chain = SchemaChain(start.to_json(), lenient=False)  # --missing keep, value checks
    assert chain.admit(_read(_schema(KEY, OFFSET, W_INT))) is Verdict.APPLY
    assert chain.admit(_read(start)) is Verdict.AGAIN
