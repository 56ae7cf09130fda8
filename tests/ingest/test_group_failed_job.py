"""A group whose job fails as a whole (``GroupEngine.run_group`` returns no outcome) is
not tried again from the file after its first: its files run one by one, and groups
resume after them. Otherwise a file that kills the job fails every group that holds it,
once per file before it (each reading the rest of the group again, its blobs left to
GC), before the run reaches it (found by review of issue 24)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.ingest.helpers import contents, memory_shard, write_jsonl
from upsert_core.errors import IngestError
from upsert_core.ingest import FileOutcome, FileTask, IngestRequest, InProcessEngine, ingest
from upsert_core.ingest.shard_api import IngestShard
from upsert_core.landing import LandingFile


class FailingGroups(InProcessEngine):
    """The in-process engine as a group engine of at most ``bound`` files whose group
    jobs fail as a whole while they hold ``poison`` (or, without one, the first
    ``fail_first`` times), and whose own run of ``poison`` fails."""

    def __init__(self, bound: int, poison: str | None = None, fail_first: int = 0) -> None:
        super().__init__(threads=1)
        self.bound, self.poison, self.fail_first = bound, poison, fail_first
        self.groups: list[list[str]] = []

    def group_size(self, files: Sequence[LandingFile], envelope: str) -> int:
        n = min(len(files), self.bound)
        return n if n >= 2 else 0

    def run_group(self, tasks: list[FileTask], shard: IngestShard) -> list[FileOutcome]:
        names = [t.file.name for t in tasks]
        self.groups.append(names)
        if self.poison in names or len(self.groups) <= self.fail_first:
            return []
        # Each task on its own, committed in order by the driver: a chain of one.
        return [self.run_file(tasks[0], shard)]

    def run_file(self, task: FileTask, shard: IngestShard) -> FileOutcome:
        if task.file.name == self.poison:
            raise IngestError(f"{self.poison}: the job failed: the worker crashed")
        return super().run_file(task, shard)


def _landing(root: Path, files: int) -> list[str]:
    return [write_jsonl(root, f"{f:02d}.jsonl", [{"key": f % 3, "offset": f, "v": f"{f}"}]).name
            for f in range(files)]


def test_a_file_that_fails_every_group_holding_it_costs_one_failed_group(
    tmp_path: Path,
) -> None:
    names = _landing(tmp_path, 10)
    engine = FailingGroups(bound=100, poison="07.jsonl")
    shard = memory_shard()
    with pytest.raises(IngestError, match="^07.jsonl: the job failed"):
        ingest(shard, str(tmp_path), IngestRequest(buckets=2, maintain=False), engine=engine)
    assert engine.groups == [names]  # not one failed group per file before 07
    assert sorted(shard.state().ingested_files) == names[:7]


def test_groups_resume_after_the_files_of_a_failed_one(tmp_path: Path) -> None:
    names = _landing(tmp_path, 10)
    engine = FailingGroups(bound=4, fail_first=1)
    shard = memory_shard()
    request = IngestRequest(buckets=2, maintain=False)
    report = ingest(shard, str(tmp_path), request, engine=engine)
    assert engine.groups[0] == names[:4]  # failed: 00-03 one by one
    assert engine.groups[1][0] == "04.jsonl"  # then groups again
    assert [f.name for f in report.files] == names
    reference = memory_shard()
    ingest(reference, str(tmp_path), request)
    assert contents(shard) == contents(reference)
