"""``rebucket``: a shard's bucket count changes, and nothing else does.

The model-based driver (``random_histories``) interleaves ingests (both order scopes,
three file formats, part formats 1-3, row errors, late rows), ``gc`` and ``gc --retain``,
lost checkpoints and rebuckets up and down, and after every step compares every
readable time's snapshot and changes with the dict model, the error collection,
``check`` and (after a rebucket) the upsert state, tombstone sets and part labels
(``compare_state``). The other tests pin what the driver cannot reach: a shard with
nothing to rebucket, the layout left behind, and writers racing a rebucket either way.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings

import upsert_core.ingest.rebucket as rebucket_module
from tests.model import UpsertModel
from upsert_core.errors import (
    ConcurrentModification,
    ConfigError,
    CorruptData,
)
from upsert_core.ingest import IngestRequest, InProcessEngine, ingest
from upsert_core.ingest.engine import Engine
from upsert_core.ingest.rebucket import rebucket
from upsert_core.ingest.shard_config import (
    CHECKPOINT_BASE_PREFIX,
    CHECKPOINT_REF_PREFIX,
    TOMBSTONES_REF_PREFIX,
    ShardIngestConfig,
)
from upsert_core.ingest.tombstones import TombstonesLost
from upsert_core.ingest.verify import compare_state
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.read.typed_read import open_typed_snapshot
from upsert_core.persist.shard import Shard
from upsert_core.persist.testing import unreferenced_blobs
from upsert_core.persist.write.parts import OpenPart
from upsert_core.row_view import RowView
from upsert_core.shard_table import snapshot_schema, typed_bases

from .helpers import change_rows, memory_shard, snapshot_rows, write_jsonl
from .random_histories import History, histories, run_history

# --- the model-based driver ---------------------------------------------------------------


@settings(max_examples=40)
@given(history=histories(rebucket_one_in=3))
def test_random_histories_with_rebuckets_match_the_model(history: History) -> None:
    run_history(history, memory_shard)


@settings(max_examples=40)
@given(history=histories(max_steps=10, scopes=("global",), lose_one_in=4,
                         rebucket_one_in=3, buckets=(1, 2, 4)))
def test_rebucketed_global_scope_buckets_remember_tombstones(history: History) -> None:
    # Deletes and late rows of deleted keys, rebuckets and rebuilds of every bucket,
    # often: a tombstone that did not move with its key to its new bucket would let a
    # late row the model skips back in.
    run_history(history, memory_shard)


@settings(max_examples=6)
@given(history=histories(max_steps=4, rebucket_one_in=2))
def test_random_rebuckets_on_the_embedded_stores(history: History) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        run_history(history, lambda: Shard.open(open_consensus(f"sqlite:///{root}/c.db"),
                                                open_blob(f"file://{root}/blob"), "h"),
                    check_every_step=False)


# --- a fixed history ----------------------------------------------------------------------


def _rows(batch: int, keys: int = 60) -> list[dict[str, Any]]:
    """Upserts, deletes and a late row of ``keys`` keys: the same for model and shard."""
    out: list[dict[str, Any]] = []
    for k in range(keys):
        if (k + batch) % 7 == 0:
            out.append({"key": k, "offset": 10 * batch + 1, "__deleted": True})
        elif (k * batch) % 3 != 1:
            out.append({"key": k, "offset": 10 * batch + k % 5, "v": f"{batch}-{k}"})
    out.append({"key": 1, "offset": 0, "v": "late"})  # global scope: late for key 1
    out.append({"key": None, "offset": batch})  # an error row
    return out


class Landing:
    """A landing directory and the model of what its files do, side by side."""

    def __init__(self, root: Path, scope: str) -> None:
        self.root, self.scope = root, scope
        self.model = UpsertModel(scope)
        self.files = 0

    def add(self, rows: list[dict[str, Any]] | None = None) -> None:
        rows = _rows(self.files) if rows is None else rows
        write_jsonl(self.root, f"f{self.files:03d}.jsonl", rows)
        self.model.apply(rows)
        self.files += 1

    def ingest(self, shard: Shard, engine: Engine | None = None, **request: Any) -> Any:
        return ingest(shard, str(self.root),
                      IngestRequest(order_scope=self.scope, inline_threshold=0, **request),
                      engine=engine or InProcessEngine(cache="new"))


def assert_matches(shard: Shard, landing: Landing) -> None:
    """Every readable time's snapshot and changes, the error rows (each once), ``check``
    and the upsert state (``compare_state``) against ``landing``'s model."""
    model = landing.model
    state = shard.state()
    assert state.upper == model.upper
    for ts in range(state.since, state.upper):
        assert snapshot_rows(shard, ts) == model.rows(ts), ts
        assert change_rows(shard, ts) == model.row_changes(ts), ts
    assert sorted((e["file"], e["row"]) for e in shard.errors()) == sorted(
        (f"f{ts:03d}.jsonl", row) for ts, row, _ in model.errors)
    assert shard.check().ok
    comparison = compare_state(shard)
    assert comparison.ok, comparison.problems


def labels(shard: Shard) -> set[int | None]:
    """The bucket counts the shard's parts are labelled with (None: unlabelled)."""
    found: set[int | None] = set()
    for batch in shard.state().batches:
        for part in batch.parts:
            opened = OpenPart(shard.blob, part, shard=shard.shard_id)
            found.add(None if opened.layout.bucket is None else opened.layout.bucket[1])
            opened.close()
    return found


def _bucket_entries(shard: Shard) -> set[int]:
    prefixes = (CHECKPOINT_REF_PREFIX, CHECKPOINT_BASE_PREFIX, TOMBSTONES_REF_PREFIX)
    return {int(name.rsplit(".", 1)[1]) for name in shard.state().config
            if name.startswith(prefixes)}


@pytest.fixture
def landing(tmp_path: Path) -> Iterator[Landing]:
    (tmp_path / "landing").mkdir()
    yield Landing(tmp_path / "landing", "global")


def test_a_shard_no_ingest_created_has_no_buckets_to_change() -> None:
    shard = memory_shard()
    with pytest.raises(ConfigError, match="no ingest yet"):
        rebucket(shard, 8)


def test_the_count_it_has_changes_nothing(landing: Landing) -> None:
    shard = memory_shard()
    landing.add()
    landing.ingest(shard, buckets=4)
    seqno = shard.state().seqno
    report = rebucket(shard, 4)
    assert not report.changed and report.buckets_before == 4
    assert shard.state().seqno == seqno  # nothing written, no writer registered


@pytest.mark.parametrize("scope", ["batch", "global"])
@pytest.mark.parametrize(("first", "then"), [(4, 16), (8, 3), (6, 1)])
def test_the_shard_is_what_a_shard_of_the_new_count_would_be(
    tmp_path: Path, scope: str, first: int, then: int
) -> None:
    land = Landing(tmp_path, scope)
    shard = memory_shard()
    for _ in range(4):
        land.add()
        land.ingest(shard, buckets=first)
    shard.gc(leak_grace_ms=0)  # compaction: batches of several ingests
    land.add()
    land.ingest(shard)
    report = rebucket(shard, then)
    assert report.changed and report.buckets_before == first and report.buckets == then
    assert report.batches == len(shard.state().batches)
    # Held in memory at a time: the old buckets of one residue modulo the gcd.
    assert report.parts_read > 0 and math.gcd(first, then) >= 1
    assert labels(shard) == {then}
    assert max(_bucket_entries(shard)) == then - 1
    stored = ShardIngestConfig.read(shard.state().config)
    assert stored.options is not None and stored.options.buckets == then
    assert stored.checkpoints_current(shard.upper)
    assert stored.live_rows_at(shard.upper) == sum(land.model.rows(shard.upper - 1).values())
    assert_matches(shard, land)
    # A latest read stays typed (one count; in the batch scope, the new bases).
    state = shard.state()
    fields = list(snapshot_schema(RowView.of(stored.options)))
    typed = open_typed_snapshot(shard.blob, state, state.upper - 1, fields,
                                typed_bases(state))
    assert typed is not None and typed.buckets == then
    typed.close()
    # Further ingests run on the new count, with it named or not. Every key comes back
    # with an old order: in the global scope, late for each key deleted at a later one
    # (its tombstone moved to its new bucket), or a change in the batch scope.
    land.add([{"key": k, "offset": 2, "v": "old"} for k in range(60)])
    land.ingest(shard, buckets=then)
    land.add()
    report_ = land.ingest(shard)
    assert not report_.rehydrations
    assert_matches(shard, land)
    with pytest.raises(ConfigError, match="upsertctl rebucket --buckets"):
        land.add()
        land.ingest(shard, buckets=first if first != then else then + 1)
    shard.gc(leak_grace_ms=0)
    assert unreferenced_blobs(shard) == set()


# --- racing writers -----------------------------------------------------------------------


class RebucketMidway:
    """An in-process engine that, once, runs a rebucket of the shard (through another
    handle on the same stores) after the file's steps ran and before the driver
    commits: the ingest planned on the old layout."""

    def __init__(self, other: Shard, buckets: int) -> None:
        self.inner = InProcessEngine(cache="new")
        self.other, self.buckets, self.done = other, buckets, False

    def run_file(self, task: Any, shard: Any) -> Any:
        outcome = self.inner.run_file(task, shard)
        if not self.done:
            self.done = True
            assert rebucket(self.other, self.buckets).changed
        return outcome


def test_an_ingest_planned_on_the_old_count_is_fenced_and_redoes_its_file(
    tmp_path: Path, landing: Landing
) -> None:
    root = tmp_path / "stores"
    root.mkdir()

    def handle() -> Shard:
        return Shard.open(open_consensus(f"sqlite:///{root}/c.db"),
                          open_blob(f"file://{root}/blob"), "s")

    shard = handle()
    landing.add()
    landing.ingest(shard, buckets=4)
    landing.add()
    report = landing.ingest(shard, engine=RebucketMidway(handle(), 16))
    assert [f.name for f in report.files] == ["f001.jsonl"]
    assert report.files[0].attempts == 2  # its first attempt was fenced
    assert any("redoing it as a new writer" in w for w in report.warnings)
    assert labels(shard) == {16}
    assert_matches(shard, landing)
    shard.gc(leak_grace_ms=0)
    assert unreferenced_blobs(shard) == set()


def _ingest_before_commits(
    monkeypatch: pytest.MonkeyPatch, landing: Landing, shard: Shard, times: int
) -> None:
    """Make an ingest commit between the rebucket's plan and its commit, ``times``
    times (its first attempts lose the race)."""
    real = rebucket_module.commit_relayout
    calls: list[int] = []

    def ingest_first(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) <= times:
            landing.add()
            landing.ingest(shard)
        return real(*args, **kwargs)

    monkeypatch.setattr(rebucket_module, "commit_relayout", ingest_first)


def test_a_rebucket_that_loses_to_an_ingest_plans_again(
    landing: Landing, monkeypatch: pytest.MonkeyPatch
) -> None:
    shard = memory_shard()
    landing.add()
    landing.ingest(shard, buckets=2)
    _ingest_before_commits(monkeypatch, landing, shard, 1)
    report = rebucket(shard, 8)
    assert report.changed and report.attempts == 2 and report.upper == 2
    assert labels(shard) == {8}
    assert_matches(shard, landing)
    # The first plan's checkpoints were deleted and its relabelled batch reused:
    # nothing is left over, even before a GC.
    assert unreferenced_blobs(shard) == set()


def test_a_rebucket_that_keeps_losing_fails_clearly_and_changes_nothing(
    landing: Landing, monkeypatch: pytest.MonkeyPatch
) -> None:
    shard = memory_shard()
    landing.add()
    landing.ingest(shard, buckets=2)
    _ingest_before_commits(monkeypatch, landing, shard, 2)
    with pytest.raises(ConcurrentModification, match="concurrently modified"):
        rebucket(shard, 8, max_attempts=2)
    monkeypatch.undo()
    assert labels(shard) == {2}
    stored = ShardIngestConfig.read(shard.state().config).options
    assert stored is not None and stored.buckets == 2
    assert_matches(shard, landing)
    assert not shard.state().writers  # the rebucket's registration was released
    # What the lost attempts wrote is gone already: nothing of it is referenced.
    assert unreferenced_blobs(shard) == set()


def test_a_part_gone_under_a_moving_shard_makes_it_plan_again(
    landing: Landing, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As a concurrent GC deleting the parts only states older than its truncation
    # referenced: the read fails, the shard has moved, so the rebucket plans again; on
    # a shard that did not move the same failure is reported.
    shard = memory_shard()
    landing.add()
    landing.ingest(shard, buckets=2)
    real = rebucket_module.relabel_batch
    calls: list[int] = []

    def lost_part(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            landing.add()
            landing.ingest(shard)  # the shard moves on
            raise CorruptData("part p is referenced by the state but missing")
        return real(*args, **kwargs)

    monkeypatch.setattr(rebucket_module, "relabel_batch", lost_part)
    report = rebucket(shard, 4)
    assert report.changed and report.attempts == 2 and labels(shard) == {4}
    assert_matches(shard, landing)

    def always_lost(*args: Any, **kwargs: Any) -> Any:
        raise CorruptData("part p is referenced by the state but missing")

    monkeypatch.setattr(rebucket_module, "relabel_batch", always_lost)
    with pytest.raises(CorruptData, match="missing"):
        rebucket(shard, 8)
    assert labels(shard) == {4} and not shard.state().writers
    assert unreferenced_blobs(shard) == set()


def test_parts_gone_under_a_shard_that_keeps_moving_is_a_lost_race(
    landing: Landing, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Real processes caught it (an ingest, `gc` in a loop, rebuckets): every attempt
    # found a part a concurrent GC had rightly deleted, the last one too. The shard
    # moved under each of them, so nothing is corrupt: it is a race the rebucket lost
    # ("concurrently modified"), not "missing from the blob store", which tells an
    # operator to restore a backup of a healthy shard.
    shard = memory_shard()
    landing.add()
    landing.ingest(shard, buckets=2)
    landing.add()
    landing.ingest(shard)
    real = rebucket_module.relabel_batch
    calls: list[int] = []

    def moved_then_lost(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) % 2 == 0:  # the second batch of each attempt
            landing.add()
            landing.ingest(shard)  # the shard moves on
            raise CorruptData("part p is referenced by the state but missing")
        return real(*args, **kwargs)

    monkeypatch.setattr(rebucket_module, "relabel_batch", moved_then_lost)
    with pytest.raises(ConcurrentModification, match="concurrently modified"):
        rebucket(shard, 4, max_attempts=2)
    monkeypatch.undo()
    assert labels(shard) == {2} and not shard.state().writers
    assert_matches(shard, landing)
    # What its attempts relabelled is gone already, as for any lost race.
    assert unreferenced_blobs(shard) == set()


def test_tombstones_gone_under_a_moving_shard_make_it_plan_again(
    landing: Landing, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As an ingest that replaced a bucket's tombstone set, and a GC that deleted the old
    # one, while the rebucket loaded it (CI caught it with real processes racing): the
    # shard has moved, so the rebucket plans again; on a shard that did not move the
    # same loss is reported, never taken for an empty set.
    shard = memory_shard()
    landing.add()
    landing.ingest(shard, buckets=2)
    landing.add([{"key": k, "offset": 10_000 + k, "__deleted": True} for k in range(40)])
    landing.ingest(shard)
    real = rebucket_module.load_bucket_state
    calls: list[int] = []

    def moved_then_lost(task: Any, bucket: int, blob: Any) -> Any:
        calls.append(bucket)
        if len(calls) == 1:
            landing.add([{"key": k, "offset": 20_000 + k, "__deleted": True}
                         for k in range(40, 80)])
            landing.ingest(shard)  # the shard moves on
            raise TombstonesLost(f"shard s: the tombstones of bucket {bucket} are missing")
        return real(task, bucket, blob)

    monkeypatch.setattr(rebucket_module, "load_bucket_state", moved_then_lost)
    report = rebucket(shard, 4)
    assert report.changed and report.attempts == 2 and labels(shard) == {4}
    assert_matches(shard, landing)

    def lost(task: Any, bucket: int, blob: Any) -> Any:
        raise TombstonesLost(f"shard s: the tombstones of bucket {bucket} are missing")

    monkeypatch.setattr(rebucket_module, "load_bucket_state", lost)
    with pytest.raises(TombstonesLost, match="tombstones of bucket"):
        rebucket(shard, 8)
    assert labels(shard) == {4} and not shard.state().writers
    assert unreferenced_blobs(shard) == set()
