"""The typed snapshot (``persist.read.typed_read`` behind ``ShardTable``) against the merged read.

The ingest writes typed, bucket-labelled parts, and compaction keeps them so; the typed
read must return, at every readable time, exactly the rows the merged read decodes
(and the dict model holds): through updates, deletes, re-sends, a column added later,
compaction, GC with ``--retain``, parts that are not typed (``Shard.append``), and a
GC that deletes parts under a read that has started.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import upsert_core.shard_table as shard_table
from tests.model import UpsertModel
from upsert_core.errors import ConfigError, CorruptData
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.options import TYPED_PARTS_ENV, typed_parts_from_env
from upsert_core.ingest.part_typer import SchemaTyper, part_typer
from upsert_core.ingest.verify import compare_state
from upsert_core.persist.location.blob_local import LocalBlob
from upsert_core.persist.location.consensus_sql import SqlConsensus
from upsert_core.persist.read.typed_read import BUCKETS_AHEAD, open_typed_snapshot
from upsert_core.persist.shard import Shard
from upsert_core.persist.testing import typed_parts
from upsert_core.persist.write.parts import OpenPart
from upsert_core.shard_table import ShardTable

from .helpers import write_jsonl

BUCKETS = 3


def _bag(table: pa.Table) -> Counter[tuple[tuple[str, Any], ...]]:
    return Counter(
        tuple(sorted((k, v) for k, v in row.items() if v is not None))
        for row in table.to_pylist()
    )


@contextmanager
def _merged_only() -> Iterator[None]:
    with mock.patch.object(shard_table, "open_typed_snapshot", lambda *args: None):
        yield


def _typed_used(shard: Shard, as_of: int) -> bool:
    reader = ShardTable(shard)
    state = shard.state()
    opened = open_typed_snapshot(shard.blob, state, as_of, list(reader.schema))
    if opened is None:
        return False
    opened.close()
    return True


def _shard(root: Path, name: str = "t") -> Shard:
    return Shard.open(SqlConsensus(f"sqlite:///{root}/c.db"), LocalBlob(root / "blob"), name)


def _ingest_one(
    shard: Shard, landing: Path, index: int, rows: list[dict[str, Any]],
    buckets: int = BUCKETS,
) -> None:
    write_jsonl(landing, f"{index:03d}.jsonl", rows)
    report = ingest(shard, str(landing), IngestRequest(buckets=buckets, inline_threshold=256))
    assert report.upper == index + 1 and not report.pending, report


def _history_shard(root: Path, files: int, keys: int, buckets: int) -> Shard:
    """A shard of ``files`` ingests over keys ``0..keys`` (file ``i`` writes every
    ``i + 1``-th key), so buckets hold several parts."""
    landing = root / "landing"
    landing.mkdir()
    shard = _shard(root)
    for i in range(files):
        _ingest_one(shard, landing, i,
                    [{"key": k, "offset": i, "v": f"{i}-{k}"} for k in range(0, keys, i + 1)],
                    buckets=buckets)
    return shard


def _assert_same_at_every_time(shard: Shard, model_at: dict[int, Counter[Any]] | None) -> None:
    state = shard.state()
    reader = ShardTable(shard)
    for as_of in range(state.since, state.upper):
        typed = reader.snapshot(as_of)
        with _merged_only():
            merged = reader.snapshot(as_of)
        assert typed.schema == merged.schema == reader.schema
        assert _bag(typed) == _bag(merged), f"as of {as_of}"
        if model_at is not None and as_of in model_at:
            assert _bag(typed) == model_at[as_of], f"as of {as_of}"


rows_strategy = st.lists(
    st.fixed_dictionaries(
        {"key": st.integers(0, 7), "offset": st.integers(0, 3)},
        optional={
            "v": st.one_of(st.none(), st.text(max_size=3)),
            "x": st.floats(allow_nan=False, allow_infinity=False),
            "__deleted": st.booleans(),
        },
    ),
    min_size=1,
    max_size=12,
)


def _all_parts_typed(shard: Shard) -> bool:
    return all(typed_parts(shard))


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    files=st.lists(rows_strategy, min_size=1, max_size=5),
    actions=st.lists(st.sampled_from(["none", "compact", "compact_all", "gc1", "plain_next",
                                      "gc1_typer", "compact_all_typer"]),
                     min_size=5, max_size=5),
    added_at=st.integers(0, 5),
)
def test_typed_snapshot_equals_merged_read_and_model(
    tmp_path_factory: pytest.TempPathFactory, files: list[list[dict[str, Any]]],
    actions: list[str], added_at: int,
) -> None:
    """Also with plain parts in the mix (an ingest with ``UPSERT_TYPED_PARTS=0``) and
    compactions that type them (``part_typer``)."""
    root = tmp_path_factory.mktemp("typed")
    landing = root / "landing"
    landing.mkdir()
    shard = _shard(root)
    model = UpsertModel("batch")
    expected: dict[int, Counter[Any]] = {}
    plain = False
    for index, rows in enumerate(files):
        if index >= added_at:  # a column the shard gains partway
            rows = [{**row, "extra": index} for row in rows]
        with mock.patch.dict("os.environ", {TYPED_PARTS_ENV: "0" if plain else "1"}):
            _ingest_one(shard, landing, index, rows)
        plain = False
        model.apply(rows)
        expected[index] = Counter(
            tuple(sorted((k, v) for k, v in row if v is not None))
            for row in model.rows(index).elements()
        )
        action = actions[index]
        typer = part_typer(shard)
        if action == "compact":
            shard.compact()
        elif action == "compact_all":
            shard.compact(merge_all=True)
        elif action == "compact_all_typer":
            shard.compact(merge_all=True, typer=typer)
        elif action == "gc1":
            shard.gc(retain=1)
        elif action == "gc1_typer":
            shard.gc(retain=1, typer=typer)
        elif action == "plain_next":
            plain = True
        if _all_parts_typed(shard):
            assert _typed_used(shard, shard.state().upper - 1), "the typed read was not used"
    _assert_same_at_every_time(shard, expected)


def test_gc_with_the_ingests_typer_upgrades_a_plain_shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard written with plain parts (before typed parts, or with the setting off)
    gains the typed layout when GC's compaction rewrites it with ``part_typer``."""
    landing = tmp_path / "landing"
    landing.mkdir()
    shard = _shard(tmp_path)
    monkeypatch.setenv(TYPED_PARTS_ENV, "0")
    for i in range(3):
        rows = [{"key": k, "offset": i, "v": f"{i}-{k}"} for k in range(0, 90, i + 1)]
        if i == 2:
            rows = [{**row, "later": 1.5} for row in rows]
        _ingest_one(shard, landing, i, rows)
    want = _bag(ShardTable(shard).snapshot())
    assert part_typer(shard) is None  # the setting is off: nothing to type with
    shard.gc(retain=1, typer=part_typer(shard))
    assert not _all_parts_typed(shard)
    monkeypatch.setenv(TYPED_PARTS_ENV, "1")
    _ingest_one(shard, landing, 3, [{"key": 5, "offset": 3, "v": "new"}])
    want = _bag(ShardTable(shard).snapshot())
    shard.gc(retain=1, typer=part_typer(shard))
    assert _all_parts_typed(shard) and _typed_used(shard, shard.state().upper - 1)
    assert _bag(ShardTable(shard).snapshot()) == want
    assert shard.check().problems == []
    assert compare_state(shard).problems == []  # includes the typed parts' checks


def test_untyped_parts_fall_back_to_the_merged_read(tmp_path: Path) -> None:
    """A part without value columns (a plain ``Shard.append``) or a run compacted with
    one keeps every read correct, through the merged read."""
    landing = tmp_path / "landing"
    landing.mkdir()
    shard = _shard(tmp_path)
    _ingest_one(shard, landing, 0, [{"key": k, "offset": 1, "v": f"a{k}"} for k in range(20)])
    assert _typed_used(shard, 0)
    typed = ShardTable(shard).snapshot()
    # An empty append moves the upper with a part-less batch: still typed.
    assert shard.append(pa.table({
        "key": pa.array([], pa.binary()), "row": pa.array([], pa.binary()),
        "ts": pa.array([], pa.int64()), "diff": pa.array([], pa.int64()),
    }), 1).committed
    assert _typed_used(shard, 1)
    # A plain part re-sending one row with diff 0 effect: +1 and -1 of an existing row.
    plain = shard.snapshot_table(1).slice(0, 1)
    twice = pa.concat_tables([
        plain.set_column(3, "diff", pa.array([1], pa.int64())).set_column(
            2, "ts", pa.array([2], pa.int64())),
        plain.set_column(3, "diff", pa.array([-1], pa.int64())).set_column(
            2, "ts", pa.array([2], pa.int64())),
    ])
    assert shard.append(twice, 2).committed
    assert not _typed_used(shard, 2)
    assert _bag(ShardTable(shard).snapshot(2)) == _bag(typed)
    shard.compact(merge_all=True)
    assert not _typed_used(shard, shard.state().upper - 1)
    _assert_same_at_every_time(shard, None)


def test_a_gc_under_a_streaming_typed_read_neither_repeats_nor_loses_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shard = _history_shard(tmp_path, 3, 200, 4 * BUCKETS_AHEAD)  # more than read ahead
    want = _bag(ShardTable(shard).snapshot())
    reader = ShardTable(shard).to_batches()
    seen = [reader.read_next_batch()]  # the first bucket is out, a few are read ahead
    # Compact and GC: the state the read started from loses its parts...
    shard.compact(merge_all=True)
    shard.gc()
    real = OpenPart.read_row_group
    calls = []

    def vanished(self: OpenPart, *args: Any, **kwargs: Any) -> pa.Table:
        calls.append(1)
        if len(calls) == 1:  # ...which the next bucket's read meets
            raise CorruptData(f"{self.where} went missing from the blob store")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(OpenPart, "read_row_group", vanished)
    seen.extend(reader)
    assert calls, "the read never met the missing part"
    assert _bag(pa.Table.from_batches(seen)) == want


def test_a_missing_part_of_the_current_state_is_reported(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    shard = _shard(tmp_path)
    _ingest_one(shard, landing, 0, [{"key": k, "offset": 1, "v": "x" * 40} for k in range(200)])
    part = shard.state().batches[0].parts[0]
    shard.blob.delete(part.key)  # type: ignore[union-attr]
    with pytest.raises(CorruptData, match="missing"):
        ShardTable(shard).snapshot()


@pytest.mark.parametrize("typed", [True, False])
@pytest.mark.parametrize("count", [1, 3, 8])
def test_bucket_selections_split_the_snapshot_without_overlap(
    tmp_path: Path, typed: bool, count: int
) -> None:
    """``snapshot_of_buckets`` (one Spark task's share): the shares of tasks 0..count-1
    are disjoint and together the snapshot, by the typed read and the merged one."""
    shard = _history_shard(tmp_path, 2, 60, 4)
    reader = ShardTable(shard)
    want = reader.snapshot()
    view = reader.row_view()
    shares = []
    for index in range(count):
        selection = shard_table.BucketSelection(4, index, count)
        if typed:
            batches = list(reader.snapshot_of_buckets(1, view, selection))
        else:
            with _merged_only():
                batches = list(reader.snapshot_of_buckets(1, view, selection))
        shares.append(pa.Table.from_batches(batches, schema=reader.schema))
    keys = [set(t.column("key").to_pylist()) for t in shares]
    assert sum(len(k) for k in keys) == len(set().union(*keys)) == want.num_rows
    assert _bag(pa.concat_tables(shares)) == _bag(want)
    if count == 8:
        assert not any(keys[4:])  # only 4 buckets: tasks 4..7 have no work


def test_typed_parts_can_be_turned_off_for_older_readers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``UPSERT_TYPED_PARTS=0``: parts carry exactly the four update columns (what
    releases before typed parts accept); snapshots take the merged read, same rows."""
    monkeypatch.setenv(TYPED_PARTS_ENV, "0")
    landing = tmp_path / "landing"
    landing.mkdir()
    shard = _shard(tmp_path)
    rows = [{"key": k, "offset": 1, "v": "x" * 40} for k in range(100)]
    _ingest_one(shard, landing, 0, rows)
    for part in shard.state().batches[0].parts:
        opened = OpenPart(shard.blob, part)
        assert opened.layout.values == () and opened.metadata.schema.to_arrow_schema().names == [
            "key", "row", "ts", "diff"]
        opened.close()
    assert not _typed_used(shard, 0)
    assert ShardTable(shard).snapshot().num_rows == 100
    monkeypatch.setenv(TYPED_PARTS_ENV, "1")
    _ingest_one(shard, landing, 1, [{"key": 1, "offset": 2, "v": "y"}])
    assert not _typed_used(shard, 1)  # the first batch's parts are still plain
    assert ShardTable(shard).snapshot().num_rows == 100


@pytest.mark.parametrize("text, want", [("", True), ("1", True), ("on", True), ("0", False),
                                        ("False", False)])
def test_typed_parts_setting(text: str, want: bool) -> None:
    assert typed_parts_from_env({TYPED_PARTS_ENV: text}) is want


def test_a_typo_in_the_typed_parts_setting_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=TYPED_PARTS_ENV):
        typed_parts_from_env({TYPED_PARTS_ENV: "nope"})


def test_a_second_gc_while_the_read_reopens_is_retried_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reopen on the fresh state can meet a missing part as well (GC ran again):
    it is retried like any other restart, not reported."""
    shard = _history_shard(tmp_path, 2, 200, 4 * BUCKETS_AHEAD)
    want = _bag(ShardTable(shard).snapshot())
    reader = ShardTable(shard).to_batches()
    seen = [reader.read_next_batch()]
    shard.compact(merge_all=True)
    shard.gc()
    real_read, real_open = OpenPart.read_row_group, shard_table.open_typed_snapshot
    calls: list[str] = []

    def vanished(self: OpenPart, *args: Any, **kwargs: Any) -> pa.Table:
        calls.append("read")
        if calls.count("read") == 1:
            raise CorruptData(f"{self.where} went missing from the blob store")
        return real_read(self, *args, **kwargs)

    def reopen(*args: Any) -> Any:
        calls.append("open")
        if calls.count("open") == 1:
            # Another writer moves the head on: the state being reopened is stale again.
            empty = pa.table({"key": pa.array([], pa.binary()), "row": pa.array([], pa.binary()),
                              "ts": pa.array([], pa.int64()), "diff": pa.array([], pa.int64())})
            assert shard.append(empty, shard.state().upper).committed
            raise CorruptData("a part went missing while the read reopened")
        return real_open(*args)

    monkeypatch.setattr(OpenPart, "read_row_group", vanished)
    monkeypatch.setattr(shard_table, "open_typed_snapshot", reopen)
    seen.extend(reader)
    assert calls.count("open") == 2
    assert _bag(pa.Table.from_batches(seen)) == want


def test_gc_keeps_a_shard_plain_while_its_ingests_write_plain_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GC run without ``UPSERT_TYPED_PARTS=0`` (another host, a cron job) must not type
    a shard whose ingests still write plain parts for older readers."""
    monkeypatch.setenv(TYPED_PARTS_ENV, "0")
    shard = _history_shard(tmp_path, 3, 50, 4)
    monkeypatch.delenv(TYPED_PARTS_ENV)
    assert part_typer(shard) is None
    shard.gc(retain=1, typer=part_typer(shard))
    for batch in shard.state().batches:
        for part in batch.parts:
            opened = OpenPart(shard.blob, part)
            assert opened.layout.values == ()
            opened.close()


def _at(updates: pa.Table, ts: int) -> pa.Table:
    return updates.set_column(2, "ts", pa.array([ts] * updates.num_rows, pa.int64()))


def test_a_typer_merge_reads_each_unlabelled_part_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain, unlabelled parts (older shards, ``Shard.append``) are decoded once each and
    split by bucket, not once per bucket; past the row cap the run stays plain."""
    import upsert_core.persist.maintenance.compact as compact

    shard = _history_shard(tmp_path, 1, 40, 8)
    rows = shard.snapshot_table(0)
    more = rows.set_column(2, "ts", pa.array([1] * rows.num_rows, pa.int64()))
    assert shard.append(more, 1).committed  # an unlabelled part: every row twice now
    assert shard.append(_at(more.slice(0, 3), 2), 2).committed
    assert part_typer(shard) is None  # the newest part is plain: GC would leave it so
    schema = ShardTable(shard).source_schema()
    assert schema is not None
    typer = SchemaTyper(schema, 8)
    decoded: list[int] = []

    class Counting:
        buckets, fields, values_only = typer.buckets, typer.fields, typer.values_only

        def values(self, column: Any) -> pa.Table:
            decoded.append(len(column))
            return typer.values(column)

    want = _bag(ShardTable(shard).snapshot())
    monkeypatch.setattr(compact, "UNLABELLED_TYPED_MAX_ROWS", 10_000)
    shard.compact(merge_all=True, typer=Counting())
    assert sorted(decoded) == [3, rows.num_rows]
    assert _all_parts_typed(shard) and _bag(ShardTable(shard).snapshot()) == want
    upper = shard.state().upper
    assert shard.append(_at(more.slice(0, 5), upper), upper).committed
    monkeypatch.setattr(compact, "UNLABELLED_TYPED_MAX_ROWS", 4)
    shard.compact(merge_all=True, typer=Counting())
    assert not _all_parts_typed(shard) and _bag(ShardTable(shard).snapshot()) != Counter()


def test_a_typer_older_than_the_newest_column_still_types(tmp_path: Path) -> None:
    """A typer made before an ingest added a column (GC racing an ingest) merges with
    the parts' longer column list instead of leaving the run plain."""
    landing = tmp_path / "landing"
    landing.mkdir()
    shard = _shard(tmp_path)
    _ingest_one(shard, landing, 0, [{"key": k, "offset": 0, "v": "a"} for k in range(30)])
    typer = part_typer(shard)
    _ingest_one(shard, landing, 1, [{"key": k, "offset": 1, "v": "b", "new": k}
                                    for k in range(0, 30, 2)])
    want = _bag(ShardTable(shard).snapshot())
    shard.compact(merge_all=True, typer=typer)
    assert _all_parts_typed(shard) and _typed_used(shard, shard.state().upper - 1)
    assert _bag(ShardTable(shard).snapshot()) == want
