"""Part bases: a bucket drained from an empty state (batch order scope) keeps its one
typed part as its checkpoint base instead of storing the state a second time, and a
later ingest loads it, encoding only the rows a batch touches. Everything a shard
answers is the same as with columnar checkpoints (``UPSERT_PART_BASES=0``)."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from upsert_core.columnar.derived_rows import DerivedRows, as_row_array, take_rows
from upsert_core.errors import ConfigError
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.checkpoint import CheckpointUnusable, is_part_base, load_checkpoint
from upsert_core.ingest.shard_config import CHECKPOINT_REF_PREFIX, ShardIngestConfig
from upsert_core.ingest.verify import compare_state
from upsert_core.landing import decode_row
from upsert_core.order_scope import OrderScope
from upsert_core.persist.keys import checkpoint_prefix
from upsert_core.persist.read.typed_read import open_typed_snapshot
from upsert_core.persist.shard import Shard
from upsert_core.persist.write.parts import rows_of_values
from upsert_core.shard_table import ShardTable, typed_bases

from .helpers import change_rows, memory_shard, schema_of, snapshot_rows, write_jsonl

BUCKETS = 2


def _request(scope: str = "batch", **kw: object) -> IngestRequest:
    # inline_threshold 0: every part is a blob, as for any file of real size.
    return IngestRequest(order_scope=scope, buckets=BUCKETS, inline_threshold=0, **kw)


def _files(root: Path, batches: int, seed: int = 7, rows_per_batch: int = 60) -> None:
    rng = random.Random(seed)
    write_jsonl(root, "000.jsonl", [
        {"key": k, "offset": 0, "v": f"v{k}", "f": rng.choice([0.5, -0.0, None, 2.0])}
        for k in range(200)
    ])
    for b in range(1, batches + 1):
        rows = []
        for i in range(rows_per_batch):
            key = rng.randrange(260)
            if rng.random() < 0.2:
                rows.append({"key": key, "offset": b * 100 + i, "__deleted": True})
            else:
                rows.append({"key": key, "offset": b * 100 + i,
                             "v": rng.choice([f"v{key}", f"w{b}"]),
                             "f": rng.choice([0.5, 0.0, float("nan"), None])})
        write_jsonl(root, f"{b:03d}.jsonl", rows)


def _refs(shard: Shard) -> dict[int, str]:
    return dict(ShardIngestConfig.read(shard.state().config).checkpoint_refs)


def _history(shard: Shard) -> list[tuple[object, object]]:
    upper = shard.state().upper
    return [(snapshot_rows(shard, ts), change_rows(shard, ts)) for ts in range(upper)]


def test_an_initial_load_stores_each_row_once(tmp_path: Path) -> None:
    _files(tmp_path, 0)
    shard = memory_shard()
    ingest(shard, str(tmp_path), _request())
    refs = _refs(shard)
    assert set(refs) == set(range(BUCKETS))
    parts = {p.key for b in shard.state().batches for p in b.parts}
    assert all(is_part_base(ref, shard.shard_id) and ref in parts for ref in refs.values())
    assert not list(shard.blob.list_keys(checkpoint_prefix(shard.shard_id)))
    assert compare_state(shard).ok
    assert shard.check().ok


@pytest.mark.parametrize(("batches", "sliced"), [(1, False), (6, False), (6, True)])
def test_batches_on_part_bases_match_columnar_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batches: int, sliced: bool
) -> None:
    if sliced:  # the slice-at-a-time paths that keep >2 GiB string columns whole
        monkeypatch.setattr("upsert_core.columnar.derived_rows.ENCODE_ROWS", 7)
        monkeypatch.setattr("upsert_core.ingest.typed_base.SLICE_ROWS", 5)
    _files(tmp_path, batches)
    ours = memory_shard()
    report = ingest(ours, str(tmp_path), _request())
    assert report.rehydrations == []
    monkeypatch.setenv("UPSERT_PART_BASES", "0")
    theirs = memory_shard()
    ingest(theirs, str(tmp_path), _request())
    assert not any(is_part_base(r, theirs.shard_id) for r in _refs(theirs).values())
    assert _history(ours) == _history(theirs)
    assert compare_state(ours).ok
    assert ours.check().ok


def test_a_new_base_is_written_as_typed_values(tmp_path: Path) -> None:
    _files(tmp_path, 6)
    shard = memory_shard()
    ingest(shard, str(tmp_path), _request())
    prefix = checkpoint_prefix(shard.shard_id)
    typed = [r for r in _refs(shard).values() if r.startswith(prefix)]
    assert typed and all(r.endswith(".parquet") for r in typed)
    assert not [m.key for m in shard.blob.list_keys(prefix) if m.key.endswith(".arrow")]
    assert compare_state(shard).ok


def test_a_shard_with_columnar_checkpoints_moves_to_typed_bases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Today's format (columnar checkpoints) keeps working and is upgraded: the next
    new base a bucket writes is typed, decoded from the encoded rows."""
    _files(tmp_path, 6)
    files = sorted(tmp_path.iterdir())
    old_half, new_half = tmp_path / "old", tmp_path / "new"
    old_half.mkdir()
    new_half.mkdir()
    for i, path in enumerate(files):
        path.rename((old_half if i < 3 else new_half) / path.name)
    shard, model = memory_shard(), memory_shard("m")
    monkeypatch.setenv("UPSERT_PART_BASES", "0")
    for target in (shard, model):
        ingest(target, str(old_half), _request())
    assert not any(is_part_base(r, shard.shard_id) or r.endswith(".parquet")
                   for r in _refs(shard).values())
    ingest(model, str(new_half), _request())
    monkeypatch.delenv("UPSERT_PART_BASES")
    report = ingest(shard, str(new_half), _request())
    assert report.rehydrations == []
    assert any(r.endswith(".parquet") for r in _refs(shard).values())
    assert _history(shard) == _history(model)
    assert compare_state(shard).ok
    assert shard.check().ok


def test_each_batch_of_a_fresh_process_loads_the_part_base(tmp_path: Path) -> None:
    """One ingest per file, without the state cache: every load reads the base."""
    _files(tmp_path, 3)
    files = sorted(tmp_path.iterdir())
    shard = memory_shard()
    model = memory_shard("m")
    for i, path in enumerate(files):
        step = tmp_path / f"step{i}"
        step.mkdir()
        (step / path.name).write_bytes(path.read_bytes())
        for target in (shard, model):
            ingest(target, str(step), _request())
    assert _history(shard) == _history(model)
    assert compare_state(shard).ok


def test_the_global_scope_writes_columnar_checkpoints(tmp_path: Path) -> None:
    _files(tmp_path, 0)
    shard = memory_shard()
    ingest(shard, str(tmp_path), _request("global"))
    refs = _refs(shard)
    assert refs and not any(is_part_base(r, shard.shard_id) for r in refs.values() if r)


def test_a_part_base_is_unusable_for_another_bucket_or_scope(tmp_path: Path) -> None:
    _files(tmp_path, 0)
    shard = memory_shard()
    ingest(shard, str(tmp_path), _request())
    ref0 = _refs(shard)[0]
    state = load_checkpoint(shard.blob, ref0, shard.shard_id, 0, BUCKETS, OrderScope.BATCH)
    assert isinstance(state.rows, DerivedRows) and len(state) > 0
    with pytest.raises(CheckpointUnusable, match="bucket 1 of 2"):
        load_checkpoint(shard.blob, ref0, shard.shard_id, 1, BUCKETS, OrderScope.BATCH)
    with pytest.raises(CheckpointUnusable, match="order scope"):
        load_checkpoint(shard.blob, ref0, shard.shard_id, 0, BUCKETS, OrderScope.GLOBAL)


def test_a_swapped_part_base_is_rebuilt_not_trusted(tmp_path: Path) -> None:
    """A ref pointing at another bucket's part (a bug, a hand edit) is refused and the
    bucket rebuilt from the shard: the answers stay right."""
    _files(tmp_path, 2)
    first = tmp_path / "first"
    first.mkdir()
    for name in ("000.jsonl",):
        (first / name).write_bytes((tmp_path / name).read_bytes())
        (tmp_path / name).unlink()
    shard, model = memory_shard(), memory_shard("m")
    for target in (shard, model):
        ingest(target, str(first), _request())
    refs = _refs(shard)
    state = shard.state()
    swapped = {f"{CHECKPOINT_REF_PREFIX}0": refs[1], f"{CHECKPOINT_REF_PREFIX}1": refs[0]}
    from upsert_core.persist.state.state import HollowBatch
    from upsert_core.persist.write.append import AppendRequest
    assert shard.compare_and_append(AppendRequest(
        HollowBatch(state.upper, state.upper + 1, 0, ()), state.upper,
        config_updates=swapped,
    )).committed
    assert model.compare_and_append(AppendRequest(
        HollowBatch(state.upper, state.upper + 1, 0, ()), state.upper,
    )).committed
    report = ingest(shard, str(tmp_path), _request())
    ingest(model, str(tmp_path), _request())
    assert report.rehydrations
    assert _history(shard) == _history(model)


def test_gc_keeps_a_part_base_the_compaction_replaced(tmp_path: Path) -> None:
    _files(tmp_path, 3)
    shard = memory_shard()
    ingest(shard, str(tmp_path), _request(maintain=False))
    shard.gc(retain=1, leak_grace_ms=0)
    for ref in _refs(shard).values():
        if ref:
            assert shard.blob.get(ref) is not None, ref
    assert compare_state(shard).ok
    assert shard.check().ok


# --- DerivedRows --------------------------------------------------------------------

VALUES = st.lists(
    st.tuples(
        st.integers(-(2**63), 2**63 - 1),
        st.one_of(st.none(), st.text(max_size=5)),
        st.one_of(st.none(), st.floats(allow_nan=True), st.just(-0.0)),
    ),
    min_size=0, max_size=40,
)


def _chunked(array: pa.Array, cuts: list[int]) -> pa.ChunkedArray:
    """``array`` in chunks cut at ``cuts`` (as a Parquet read of a big column gives)."""
    edges = sorted({0, len(array), *(c % (len(array) + 1) for c in cuts)})
    return pa.chunked_array(
        [array.slice(a, b - a) for a, b in zip(edges, edges[1:], strict=False)] or [array],
        array.type,
    )


@settings(max_examples=80, deadline=None)
@given(VALUES, st.lists(st.one_of(st.none(), st.integers(0, 39)), max_size=30),
       st.lists(st.integers(0, 40), max_size=4))
def test_derived_rows_take_what_the_encoded_rows_hold(
    rows: list[tuple[int, str | None, float | None]], picks: list[int | None],
    cuts: list[int],
) -> None:
    columns = [
        pa.array([r[0] for r in rows], pa.int64()),
        pa.array([r[1] for r in rows], pa.string()),
        pa.array([r[2] for r in rows], pa.float64()),
    ]
    derived = DerivedRows(pa.table([_chunked(c, cuts) for c in columns],
                                   names=["k", "s", "f"]))
    encoded = rows_of_values(columns).cast(pa.large_binary())
    picks = [p if p is None else p % max(len(rows), 1) for p in picks] if rows else [
        None for _ in picks]
    index = pa.array(picks, pa.int64())
    assert derived.take(index).equals(encoded.take(index))
    assert len(derived) == len(rows) and derived.null_count == 0
    assert as_row_array(derived).equals(encoded)
    assert derived.take(index).equals(encoded.take(index))  # from the kept encoding
    assert np.array_equal(derived.is_null().to_numpy(zero_copy_only=False),
                          np.zeros(len(rows), bool))


@settings(max_examples=80, deadline=None)
@given(VALUES, VALUES, st.data(), st.lists(st.integers(0, 40), max_size=4),
       st.booleans())
def test_merged_derived_rows_hold_what_merged_encoded_rows_hold(
    base: list[tuple[int, str | None, float | None]],
    changes: list[tuple[int, str | None, float | None]],
    data: st.DataObject, cuts: list[int], with_null: bool,
) -> None:
    def columns(rows: list[tuple[int, str | None, float | None]]) -> list[pa.Array]:
        return [pa.array([r[0] for r in rows], pa.int64()),
                pa.array([r[1] for r in rows], pa.string()),
                pa.array([r[2] for r in rows], pa.float64())]

    derived = DerivedRows(pa.table([_chunked(c, cuts) for c in columns(base)],
                                   names=["k", "s", "f"]))
    change_rows = rows_of_values(columns(changes)).cast(pa.large_binary())
    if with_null and changes:  # a tombstone among the changes
        change_rows = pa.concat_arrays([change_rows, pa.nulls(1, pa.large_binary())])
    total = len(base) + len(change_rows)
    sources = np.array(data.draw(st.lists(st.integers(0, max(total - 1, 0)), max_size=50)
                                 if total else st.just([])), np.int64)
    merged = derived.merged(change_rows, sources)
    both = pa.concat_arrays([rows_of_values(columns(base)).cast(pa.large_binary()),
                             change_rows])
    expected = both.take(pa.array(sources, pa.int64()))
    if expected.null_count:
        assert merged is None  # a tombstone cannot be derived: the caller encodes
        return
    assert merged is not None
    assert as_row_array(merged).equals(expected)
    # Merging into rows already encoded is the caller's job.
    derived.materialize()
    assert derived.merged(change_rows, sources) is None


# --- latest reads start at the base ------------------------------------------------


def _canon(row: dict[str, object]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((c, repr(v)) for c, v in row.items() if v is not None))


def _rows(table: pa.Table) -> Counter[tuple[tuple[str, str], ...]]:
    return Counter(_canon(row) for row in table.to_pylist())


def _merged_rows(shard: Shard, ts: int) -> Counter[tuple[tuple[str, str], ...]]:
    """The snapshot through the merged read (no typed read, no base), decoded."""
    schema = schema_of(shard)
    out: Counter[tuple[tuple[str, str], ...]] = Counter()
    for batch in shard.snapshot(ts):
        for row, diff in zip(batch.column("row").to_pylist(),
                             batch.column("diff").to_pylist(), strict=True):
            out[_canon(decode_row(schema, row))] += diff
    return +out


def test_a_typed_snapshot_reads_the_base_instead_of_the_history_before_it(
    tmp_path: Path,
) -> None:
    _files(tmp_path, 6)
    shard = memory_shard()
    ingest(shard, str(tmp_path), _request(maintain=False))
    state = shard.state()
    bases = typed_bases(state)
    assert bases, "no bucket has a base to read"
    table = ShardTable(shard)
    fields = list(table.schema)
    for ts in range(state.upper):
        typed = open_typed_snapshot(shard.blob, state, ts, fields, bases)
        assert typed is not None
        try:
            used = {b for b in typed.bucket_ids
                    if typed._groups[b][0].part.where.endswith(bases[b].key)} if bases else set()
        finally:
            typed.close()
        expected = {b for b, base in bases.items() if base.upper - 1 <= ts}
        assert used == expected, (ts, used, expected)
        assert _rows(table.snapshot(ts)) == _merged_rows(shard, ts), ts


def test_a_base_that_cannot_be_read_is_not_used(tmp_path: Path) -> None:
    _files(tmp_path, 6)
    shard = memory_shard()
    ingest(shard, str(tmp_path), _request(maintain=False))
    state = shard.state()
    bases = typed_bases(state)
    expected = _rows(ShardTable(shard).snapshot())
    for base in bases.values():
        if base.key.startswith(checkpoint_prefix(shard.shard_id)):
            shard.blob.delete(base.key)  # a checkpoint, not shard data: reads go on
    assert _rows(ShardTable(shard).snapshot()) == expected


def test_take_rows_across_chunks_in_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chunk-by-chunk take (for string columns over 2 GiB) gives Arrow's answer,
    also when the index is taken a slice at a time."""
    monkeypatch.setattr("upsert_core.columnar.derived_rows.ENCODE_ROWS", 7)
    values = pa.array([f"s{i}" if i % 5 else None for i in range(100)], pa.string())
    column = _chunked(values, [13, 50, 51, 99])
    at = np.array(random.Random(3).choices(range(100), k=60), np.int64)
    assert take_rows(column, at).combine_chunks().equals(values.take(pa.array(at)))
    assert take_rows(values, at).combine_chunks().equals(values.take(pa.array(at)))
    derived = DerivedRows(pa.table({"k": pa.array(range(100), pa.int64()), "s": column}))
    encoded = rows_of_values([pa.array(range(100), pa.int64()), values]).cast(pa.large_binary())
    assert derived.take(pa.array(at)).equals(encoded.take(pa.array(at)))
    assert derived.materialize().equals(encoded)


def test_a_malformed_part_bases_setting_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UPSERT_PART_BASES", "maybe")
    with pytest.raises(ConfigError, match="UPSERT_PART_BASES='maybe': use 1"):
        IngestRequest()


def test_a_base_is_read_with_batches_compaction_merged_across_it(tmp_path: Path) -> None:
    """Automatic compaction merges batches from both sides of a base's upper; the
    typed read still starts at the base and reads the merged batch from the upper on,
    and every retained time reads as the merged (base-free) read does."""
    (tmp_path / "all").mkdir()
    _files(tmp_path / "all", 24, rows_per_batch=8)  # bases outlive several batches
    landing = tmp_path / "landing"
    landing.mkdir()
    shard = memory_shard()
    spanned = 0
    for file in sorted((tmp_path / "all").iterdir()):
        file.rename(landing / file.name)
        ingest(shard, str(landing), _request())  # with its maintenance (compaction)
        state = shard.state()
        typed = open_typed_snapshot(shard.blob, state, state.upper - 1,
                                    list(ShardTable(shard).schema), typed_bases(state))
        assert typed is not None
        try:
            spans = [m for b in typed.bucket_ids for m in typed._groups[b]
                     if m.floor > m.batch.lower]
        finally:
            typed.close()
        if spans:
            spanned += 1
            table = ShardTable(shard)
            for ts in range(state.since, state.upper):
                assert _rows(table.snapshot(ts)) == _merged_rows(shard, ts), (state.upper, ts)
    assert spanned >= 2, "batches spanned a base's upper too rarely: the case is not exercised"


def test_compare_state_counts_a_part_base_in_its_checkpoint_bytes(tmp_path: Path) -> None:
    _files(tmp_path, 0)
    shard = memory_shard()
    ingest(shard, str(tmp_path), _request())
    refs = _refs(shard)
    assert refs and all(not r.startswith(checkpoint_prefix("s")) for r in refs.values())
    sizes = {m.key: m.size_in_bytes for m in shard.blob.list_keys("s/")}
    compared = compare_state(shard)
    assert compared.ok
    assert compared.checkpoint_bytes == sum(sizes[r] for r in refs.values()) > 0
