"""``persist.maintenance.relabel``: a batch's labelled parts rewritten for another bucket count hold
exactly the same updates, each new part labelled ``b'/M`` with only keys of ``b'``, in
the format and with the value columns its source had; unlabelled parts and parts
already labelled for ``M`` are kept as they are. And the commit: only on the planned
spine, fencing every other writer."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from upsert_core.errors import WriterFenced
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.maintenance.relabel import (
    RelabelStats,
    Relayout,
    commit_relayout,
    relabel_batch,
)
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.state import BlobPart, HollowBatch, Part
from upsert_core.persist.write.append import AppendRequest
from upsert_core.persist.write.buckets import bucket_of_keys
from upsert_core.persist.write.consolidate import UPDATE_SCHEMA
from upsert_core.persist.write.parts import (
    VALUE_PREFIX,
    OpenPart,
    read_part_table,
    rows_of_values,
    write_parts,
)

SHARD = "s"
FIELDS = [pa.field("a", pa.int64()), pa.field("b", pa.string()), pa.field("c", pa.string())]

updates = st.lists(
    st.tuples(st.binary(min_size=16, max_size=16), st.integers(0, 3), st.integers(0, 9),
              st.sampled_from(["x", "yy", None]), st.sampled_from([1, -1, 2])),
    min_size=0, max_size=40,
)


def _part_table(rows: list[tuple[bytes, int, int, str | None, int]], columns: int
                ) -> tuple[pa.Table, pa.Table]:
    """Updates and their values (the first ``columns`` fields: older parts have fewer)."""
    fields = FIELDS[:columns]
    values = pa.table([pa.array([r[1] for r in rows], pa.int64()),
                       pa.array([r[3] for r in rows], pa.string()),
                       pa.array(["c"] * len(rows), pa.string())][:columns],
                      schema=pa.schema(fields))
    encoded = rows_of_values(values.columns) if rows else pa.array([], pa.binary())
    table = pa.table([pa.array([r[0] for r in rows], pa.binary()), encoded,
                      pa.array([r[2] for r in rows], pa.int64()),
                      pa.array([r[4] for r in rows], pa.int64())], schema=UPDATE_SCHEMA)
    return table, values


def _write(blob: MemoryBlob, rows: list[tuple[bytes, int, int, str | None, int]],
           buckets: int | None, fmt: int, columns: int, inline: int) -> list[Part]:
    """``rows`` as parts: one per bucket of ``buckets`` (unlabelled when None)."""
    table, values = _part_table(rows, columns)
    if not table.num_rows:
        return []
    groups = {None: list(range(table.num_rows))} if buckets is None else {}
    if buckets is not None:
        for i, b in enumerate(bucket_of_keys(table.column("key"), buckets).tolist()):
            groups.setdefault(b, []).append(i)
    parts: list[Part] = []
    for b, at in groups.items():
        index = pa.array(at, pa.int64())
        parts.extend(write_parts(
            blob, SHARD, table.take(index), values=None if fmt == 1 else values.take(index),
            bucket=None if b is None else (b, buckets), values_only=fmt == 3,
            inline_threshold=inline, part_rows=7,
        ))
    return parts


def _updates(blob: MemoryBlob, parts: tuple[Part, ...]) -> Counter[tuple[object, ...]]:
    out: Counter[tuple[object, ...]] = Counter()
    for part in parts:
        table = read_part_table(blob, part, shard=SHARD)
        out.update(zip(*(table.column(n).to_pylist() for n in UPDATE_SCHEMA.names),
                       strict=True))
    return out


@settings(max_examples=150, deadline=None)
@given(labelled=updates, plain=updates, old=st.sampled_from([1, 2, 3, 4, 16]),
       new=st.sampled_from([1, 2, 4, 6, 8, 16]), fmt=st.sampled_from([1, 2, 3]),
       older_fmt=st.sampled_from([1, 2, 3]), inline=st.sampled_from([0, 4096]),
       split=st.integers(0, 40))
def test_a_relabelled_batch_holds_the_same_updates_under_the_new_labels(
    labelled: list[tuple[bytes, int, int, str | None, int]],
    plain: list[tuple[bytes, int, int, str | None, int]],
    old: int, new: int, fmt: int, older_fmt: int, inline: int, split: int,
) -> None:
    blob = MemoryBlob()
    # Two generations of labelled parts (the older with a column fewer, maybe another
    # format), and plain parts that claim no bucket.
    parts = [*_write(blob, labelled[:split], old, older_fmt, 2, inline),
             *_write(blob, labelled[split:], old, fmt, 3, inline),
             *_write(blob, plain, None, 1, 3, inline)]
    batch = HollowBatch(3, 5, 2, tuple(parts))
    stats = RelabelStats()
    result = relabel_batch(blob, SHARD, batch, new, inline_threshold=inline, part_rows=5,
                           stats=stats)
    assert (result.lower, result.upper, result.since) == (3, 5, 2)
    assert _updates(blob, result.parts) == _updates(blob, batch.parts)
    assert result.num_updates == batch.num_updates
    formats = ({older_fmt} if labelled[:split] else set()) | (
        {fmt} if labelled[split:] else set())
    moved = 0
    for part in result.parts:
        opened = OpenPart(blob, part, shard=SHARD)
        try:
            label = opened.layout.bucket
            if part in batch.parts:  # kept: unlabelled, or already of the new count
                assert label is None or label[1] == new
                continue
            moved += part.num_updates
            assert label is not None and label[1] == new
            table = opened.read_whole([*UPDATE_SCHEMA.names,
                                       *(VALUE_PREFIX + v.name for v in opened.layout.values)])
            assert set(bucket_of_keys(table.column("key"), new).tolist()) <= {label[0]}
            if opened.layout.values:  # the values still encode the rows
                values = [table.column(VALUE_PREFIX + v.name) for v in opened.layout.values]
                assert rows_of_values(values).to_pylist() == table.column("row").to_pylist()
            # Values-only only where a source was; value columns only where one had.
            assert opened.layout.derived_rows <= (3 in formats)
            assert bool(opened.layout.values) <= bool(formats - {1})
        finally:
            opened.close()
    if old == new or not labelled:
        assert result is batch and stats.parts_read == 0
    else:
        assert moved == stats.updates == len(labelled)
        assert set(stats.new_blobs) == {p.key for p in result.parts
                                        if p not in batch.parts and isinstance(p, BlobPart)}


def test_the_commit_needs_the_planned_spine_and_fences_every_other_writer() -> None:
    shard = Shard.open(MemoryConsensus(), MemoryBlob(), SHARD, inline_threshold=0)
    table, _ = _part_table([(bytes(16), 1, 0, "x", 1)], 3)
    shard.append(table, 0)
    other = Shard.open(shard.consensus, shard.blob, SHARD)
    other_id = other.writer_id()
    me = shard.writer_id()
    state = shard.state()
    batch = state.batches[0]
    layout = Relayout(state.upper, state.batches, (batch,), {"x.y": "1", "gone": None})
    shard.append(table.set_column(2, "ts", pa.array([1], pa.int64())), 1)  # moves the upper
    result = commit_relayout(shard.machine, layout, writer_id=me, now_ms=lambda: 1)
    assert not result.committed and not result.proposed
    state = shard.state()
    layout = Relayout(state.upper, state.batches, state.batches, {"x.y": "1", "gone": None})
    result = commit_relayout(shard.machine, layout, writer_id=me, now_ms=lambda: 1)
    assert result.committed and result.state.config.get("x.y") == "1"
    assert set(result.state.writers) == {me}  # the other writer is fenced
    with pytest.raises(WriterFenced):
        other.compare_and_append(_append_request(other))
    stranger = "0123456789ab.1.0123456789abcdef"
    with pytest.raises(WriterFenced):
        commit_relayout(shard.machine, Relayout(state.upper, result.state.batches,
                                                result.state.batches, {"x.y": "2"}),
                        writer_id=stranger, now_ms=lambda: 1)
    assert other_id not in shard.state().writers


def _append_request(shard: Shard) -> AppendRequest:
    upper = shard.upper
    return AppendRequest(HollowBatch(upper, upper + 1, 0, ()), upper)
