"""Replay of a bucket's base: the fast unmerged read, its fallback, and its failure.

``replay_bucket`` reads the shard's changes without the k-way merge. Updates that the
merge would have summed (here: a +1/-1 pair of one (key, row, ts) slipped into the
unmerged read) do not form a valid chain, so the bucket is replayed from the merged,
consolidated read and still ends exact; changes that do not fit the base at all raise
``InvalidUpsertState`` (the ingest then rehydrates).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

import upsert_core.ingest.replay as replay
from tests.ingest.helpers import memory_shard, write_jsonl
from upsert_core.columnar import ColumnarState, apply_changes, state_from_snapshot
from upsert_core.errors import InvalidUpsertState
from upsert_core.ingest import IngestRequest, InProcessEngine, ingest
from upsert_core.ingest.replay import replay_bucket
from upsert_core.persist.read.read import snapshot, unmerged_changes_after


def _shard_with_history(tmp_path: Path):  # noqa: ANN202 - a test helper
    shard = memory_shard()
    for i in range(3):
        d = tmp_path / f"f{i}"
        d.mkdir()
        write_jsonl(d, f"{i}.jsonl", [{"key": k, "offset": i, "v": f"{i}-{k}"}
                                      for k in range(20) if (k + i) % 3])
        ingest(shard, str(d), IngestRequest(buckets=1), engine=InProcessEngine(cache=None))
    return shard


def _live(shard, upper: int) -> dict[bytes, bytes]:  # noqa: ANN001 - a test helper
    rows = pa.Table.from_batches(list(snapshot(shard.blob, shard.state(), upper - 1)))
    return dict(zip(rows.column("key").to_pylist(), rows.column("row").to_pylist(),
                    strict=True))


def test_replay_falls_back_to_the_merged_read(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    shard = _shard_with_history(tmp_path)
    state = shard.state()
    base = state_from_snapshot(snapshot(shard.blob, state, 0))  # the state as of upper 1
    assert base.live_rows() == _live(shard, 1)

    def doubled(blob, shard_state, lower, upper):  # noqa: ANN001, ANN202
        table = unmerged_changes_after(blob, shard_state, lower, upper)
        pair = table.slice(0, 1)
        flipped = pair.set_column(3, "diff", pa.array([-pair.column("diff")[0].as_py()]))
        return pa.concat_tables([table, pair, flipped])

    with pytest.raises(InvalidUpsertState):  # the fast path alone cannot use them
        apply_changes(base, [doubled(shard.blob, state, 1, state.upper)])
    def doubled_by_part(blob, shard_state, lower, upper, copies=None):  # noqa: ANN001, ANN202
        return [(None, doubled(blob, shard_state, lower, upper))]

    monkeypatch.setattr(replay, "unmerged_changes_by_part", doubled_by_part)
    replay._memo.clear()
    caught_up, _ = replay_bucket(shard.blob, state, base, 0, 1, 1, state.upper)
    assert caught_up.live_rows() == _live(shard, state.upper)


def test_replay_of_changes_that_do_not_fit_raises(tmp_path: Path) -> None:
    shard = _shard_with_history(tmp_path)
    state = shard.state()
    replay._memo.clear()
    with pytest.raises(InvalidUpsertState):
        # The empty state is not the base as of upper 1: the first retraction misses.
        replay_bucket(shard.blob, state, ColumnarState.empty(False), 0, 1, 1, state.upper)


def _ingest_history(tmp_path: Path, shard, tag: str, key_base: int):  # noqa: ANN001, ANN202
    """A base of 40 keys at ts 0, then small files (kept on the base: replayed later),
    each ingested by a cold engine (no cache) so every step replays from the base."""
    files = [
        [{"key": key_base + k, "offset": 0, "v": f"{tag}0-{k}"} for k in range(40)],
        [{"key": key_base + 100 + k, "offset": 1, "v": f"{tag}1-{k}"} for k in range(3)],
        [{"key": key_base + 100 + k, "offset": 2, "v": f"{tag}2-{k}"} for k in range(3)],
    ]
    for i, rows in enumerate(files):
        d = tmp_path / f"{tag}{i}"
        d.mkdir()
        write_jsonl(d, f"{i}.jsonl", rows)
        ingest(shard, str(d), IngestRequest(buckets=1), engine=InProcessEngine(cache=None))


def test_replay_memo_is_not_shared_by_equally_named_shards(tmp_path: Path) -> None:
    """Two locations holding a shard of the same name, ingested by one process: the
    replay of one must never use the changes read from the other (same shard name,
    seqno and uppers). Here shard B would get A's insertions (absent keys: a valid
    chain) instead of its own, and its next file would insert a second live row for
    a key it already holds."""
    replay._memo.clear()
    a, b = memory_shard("same"), memory_shard("same")
    _ingest_history(tmp_path, a, "a", 0)
    _ingest_history(tmp_path, b, "b", 1000)
    assert a.state().seqno == b.state().seqno
    for shard in (a, b):
        snap = pa.Table.from_batches(list(snapshot(shard.blob, shard.state(),
                                                   shard.state().upper - 1)))
        keys = snap.column("key").to_pylist()
        assert len(keys) == len(set(keys)) == 43, "a key holds two live rows"
        assert all(d == 1 for d in snap.column("diff").to_pylist())


@pytest.mark.parametrize("typed", ["1", "0"])
def test_the_replay_read_by_bucket_equals_the_shards_changes_split_by_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, typed: str
) -> None:
    """Labelled parts go to their bucket whole and unlabelled ones are split by key:
    either way each bucket gets exactly its keys' changes, each once."""
    from collections import Counter

    from upsert_core.ingest.buckets import bucket_of_keys, split_rows

    monkeypatch.setenv("UPSERT_TYPED_PARTS", typed)
    shard = memory_shard()
    for i in range(4):
        d = tmp_path / f"f{i}"
        d.mkdir()
        write_jsonl(d, f"{i}.jsonl", [
            {"key": k, "offset": i, "v": f"{i}-{k}"} if (k + i) % 4 else
            {"key": k, "offset": i, "__deleted": True}
            for k in range(60)
        ])
        ingest(shard, str(d), IngestRequest(buckets=4, inline_threshold=0),
               engine=InProcessEngine(cache=None))
    state = shard.state()
    replay._memo.clear()
    got = replay._unmerged(shard.blob, state, 1, state.upper, 4)
    table = unmerged_changes_after(shard.blob, state, 1, state.upper)
    expected = split_rows(table, bucket_of_keys(table.column("key"), 4))

    def rows(tables: list[pa.Table]) -> Counter[tuple[object, ...]]:
        return Counter(
            (r["key"], r["row"], r["ts"], r["diff"])
            for t in tables for r in t.select(["key", "row", "ts", "diff"]).to_pylist()
        )

    assert set(got) <= set(range(4)) and sum(t.num_rows for ts in got.values() for t in ts)
    for bucket in range(4):
        want = [expected[bucket]] if bucket in expected else []
        assert rows(got.get(bucket, [])) == rows(want), bucket
