"""A group: several pending files of one run ingested by one engine job, still applied
one timestamp each and committed one compare-and-append each, in name order.

An engine that runs a group (the Spark engine: ``resources/spark_group.py``) gets one
:class:`FileTask` per file, all planned before any of them commits: the first by the
driver against the shard (``pipeline.plan_file``), each next one from the one before
it by :func:`group_tasks` as the shard will be once the file before it commits: the
next ``ts``, a fresh commit nonce, the commit history with the nonce before it, current
checkpoints. What a task cannot know before the files before it ran, it learns in the
job:

- the buckets' checkpoint references, bases and tombstone sets: the steps of a bucket
  run one after the other in one task, and each file's task is the template with the
  entries the results before it will have committed (:class:`GroupChain`, which the
  driver replays to check every commit against the shard it commits on);
- the buckets' states: carried from step to step in memory (``tasks.Carry``); a
  bucket's first step in the group loads it as of the first file's ``ts``, which the
  shard has committed, as for a file of its own;
- the schema: every file of a group is validated against the schema the group started
  with. That is what validating it after the files before it would give as long as the
  schema they evolved is a prefix of the one it evolves on its own: validation appends
  a file's new columns in file order and types the columns it knows, so a file that
  itself types every column the files before it added, in the same order and with the
  same types, reads the same either way; so does a file that adds nothing to the
  group's first schema, with a caveat (:class:`SchemaChain`). :class:`SchemaChain`
  admits files while that holds; the first file for which it does not (or whose
  file-level error may be an artefact of the schema it was validated with) ends the
  group before it, and the driver runs it again against the shard as it then is.

Invariants:

- A group applies a prefix of its files: every step of file ``k`` runs on the state the
  steps of files ``< k`` left, and the driver commits file after file, so a run killed
  (or a commit lost to another writer) after ``k`` commits leaves exactly the first
  ``k`` files applied, each with its error rows and late rows once; the blobs of the
  files it did not commit are deleted (or, for a killed run, left to GC as those of
  any dead writer).
- A file's bucket steps and error part are the ones a run of that file alone would
  write at the same ``ts`` on the same shard (same inputs to the same ``run_bucket``),
  so the shard after a group is the shard after the same files one by one.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from enum import Enum

from upsert_core.ingest.outcome import BucketResult, FileRead
from upsert_core.ingest.shard_config import recent_history
from upsert_core.ingest.tasks import FileTask
from upsert_core.landing import LandingFile, SourceSchema
from upsert_core.order_scope import OrderScope


def tombstones_after(task: FileTask, results: Iterable[BucketResult]) -> dict[int, str]:
    """The tombstone references the commit of ``task`` with ``results`` records: the
    buckets that wrote a set, and on a global-scope shard's first commit, none for every
    other bucket (so a later rebuild of a bucket that never ran knows it has nothing to
    forget)."""
    refs: dict[int, str] = {}
    if task.ts == 0 and task.scope is OrderScope.GLOBAL:
        refs = {b: "" for b in range(task.buckets)}
    refs.update({r.bucket: r.tombstones for r in results if r.tombstones is not None})
    return refs


def group_tasks(first: FileTask, files: Sequence[LandingFile]) -> list[FileTask]:
    """The tasks of a group: ``first`` (planned for ``files[0]``) and, for every next
    file, the task the driver would plan for it once the file before it committed,
    but with the per-bucket entries of ``first`` (see :class:`GroupChain`)."""
    tasks = [first]
    for file in files[1:]:
        before = tasks[-1]
        tasks.append(replace(
            before,
            ts=before.ts + 1,
            file=file,
            checkpoints_current=True,
            tombstones={**before.tombstones, **tombstones_after(before, ())},
            commit_nonce=uuid.uuid4().hex,
            history=recent_history(before.history, before.ts + 1, before.commit_nonce),
            shard_state=None,
            shard_state_bytes=None,
        ))
    return tasks


@dataclass(frozen=True)
class BucketEntries:
    """What a commit records for one bucket and a step reads back from its task."""

    checkpoint: str
    base: str | None
    tombstones: str | None

    @classmethod
    def of(cls, task: FileTask, bucket: int) -> BucketEntries:
        return cls(task.checkpoints.get(bucket) or "", task.bases.get(bucket),
                   task.tombstones.get(bucket))


class GroupChain:
    """The tasks of a group's files as its steps see them: file ``k``'s task is its
    template (:func:`group_tasks`) with the per-bucket entries that the results of
    the files before it record (:meth:`advance`) when they commit."""

    def __init__(self, tasks: Sequence[FileTask]) -> None:
        self.tasks = list(tasks)
        self.checkpoints: dict[int, str] = {}
        self.bases: dict[int, str] = {}
        self.tombstones: dict[int, str] = {}

    def task(self, k: int) -> FileTask:
        template = self.tasks[k]
        if not (self.checkpoints or self.bases or self.tombstones):
            return template
        return replace(
            template,
            checkpoints={**template.checkpoints, **self.checkpoints},
            bases={**template.bases, **self.bases},
            tombstones={**template.tombstones, **self.tombstones},
        )

    def advance(self, results: Iterable[BucketResult]) -> None:
        """Take in the results of the next file (as its commit records them; the
        templates already hold what a commit records for the buckets it did not run)."""
        done = list(results)
        for r in done:
            self.checkpoints[r.bucket] = r.checkpoint or ""
            if r.base is not None:
                self.bases[r.bucket] = r.base
        self.tombstones.update(
            {r.bucket: r.tombstones for r in done if r.tombstones is not None})


class Verdict(Enum):
    """What a group does with a file once it is read (:meth:`SchemaChain.admit`)."""

    APPLY = "apply"
    ERROR = "error"  # a file-level problem it has whatever the files before it: stop there
    CHANGED = "changed"  # it changed while being read: it and the files after it wait
    AGAIN = "again"  # the group ends before it: run it again on the shard as it then is


class SchemaChain:
    """Which files of a group stand as read against the group's first schema, and the
    schema each is applied with (:attr:`current` after :meth:`admit`; see the module
    docstring).

    Besides a file whose schema extends the one before it, a file that adds nothing to
    the group's first schema (a 0-byte file, a file of only those columns, columns
    null throughout) stands too, applied with the schema the group has evolved
    (``lenient``: unless missing values are kept or value checks run). Read after the
    files before it, every column they added would be null in all its rows, and last
    in the schema, so its rows encode the same (the codec trims trailing nulls); its
    parts take those columns' values by decoding its rows with that schema
    (``tasks.part_values``). Where missing values are kept, a column a file lacks is
    marked missing only when the schema has it, and a value check may reject a null:
    there such a file ends the group like any other."""

    def __init__(self, start_json: str, *, lenient: bool = False) -> None:
        self.start = SourceSchema.from_json(start_json)
        self.current = self.start
        self.lenient = lenient

    @property
    def current_json(self) -> str:
        return self.current.to_json()

    def admit(self, read: FileRead) -> Verdict:
        if read.changed is not None:
            return Verdict.CHANGED
        if read.file_error is not None:
            # SUBTLE: read against the group's first schema, a file can fail where it
            # would not after the files before it (a column they typed is only inferred
            # here): trusted only when nothing before it evolved the schema.
            return Verdict.ERROR if self.current == self.start else Verdict.AGAIN
        if read.schema_json is None:
            return Verdict.AGAIN
        evolved = SourceSchema.from_json(read.schema_json)
        if self.lenient and evolved == self.start:
            return Verdict.APPLY
        if not extends(evolved, self.current):
            return Verdict.AGAIN
        self.current = evolved
        return Verdict.APPLY

    @classmethod
    def of(cls, first: FileTask) -> SchemaChain:
        """The chain of a group whose first task is ``first``."""
        return cls(first.schema_json, lenient=not first.keeps and not first.value_checks)


def extends(schema: SourceSchema, before: SourceSchema) -> bool:
    """Whether ``schema`` is ``before`` with columns appended (same options, the same
    columns first, in the same order and with the same types)."""
    n = len(before.columns)
    return (replace(schema, columns=schema.columns[:n]) == before
            and len(schema.columns) >= n)
