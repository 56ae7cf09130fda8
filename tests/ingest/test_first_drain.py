"""The shard's first file without encoded rows (``ingest.first_drain``) against the
encoded path: validation, the bucket step's drain, the parts and whole ingests."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.debezium_events import event, write_events_parquet
from upsert_core.columnar import ColumnarState, drain_to_upper
from upsert_core.columnar.derived_rows import as_row_array
from upsert_core.ingest import IngestReport, IngestRequest, ingest
from upsert_core.ingest import tasks as tasks_module
from upsert_core.ingest.first_drain import drain_into_empty, rows_deferred, with_encoded_rows
from upsert_core.ingest.tasks import FileTask, bucketed, part_values
from upsert_core.landing import SourceSchema, list_landing, validate_file
from upsert_core.landing import validate as validate_module
from upsert_core.landing.chunks import CHUNK_ROWS_ENV, STREAM_BYTES_ENV
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.state import BlobPart
from upsert_core.persist.write.parts import rows_of_values

from .helpers import change_rows, memory_shard, snapshot_rows

_FLOATS = st.one_of(st.none(), st.sampled_from([0.0, -0.0, math.nan, 1.5, -2.25, math.inf]))


@st.composite
def first_files(draw: st.DrawFn) -> pa.Table:
    n = draw(st.integers(1, 40))
    keys = draw(st.lists(st.one_of(st.none(), st.integers(0, 12)), min_size=n, max_size=n))
    return pa.table({
        "key": pa.array(keys, pa.int64()),
        "offset": pa.array(draw(st.lists(st.integers(0, 6), min_size=n, max_size=n)), pa.int64()),
        "__deleted": pa.array(draw(st.lists(st.booleans(), min_size=n, max_size=n))),
        "v_str": pa.array(draw(st.lists(st.one_of(st.none(), st.text(max_size=4)),
                                        min_size=n, max_size=n)), pa.string()),
        "v_float": pa.array(draw(st.lists(_FLOATS, min_size=n, max_size=n)), pa.float64()),
        "v_last": pa.array(draw(st.lists(st.one_of(st.none(), st.integers(-3, 3)),
                                         min_size=n, max_size=n)), pa.int64()),
    })


def _schema() -> SourceSchema:
    return SourceSchema(key=("key",), order="offset", deleted="__deleted")


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=first_files())
def test_the_first_drain_equals_the_encoded_drain(tmp_path: Path, table: pa.Table) -> None:
    for old in tmp_path.iterdir():
        old.unlink()
    pq.write_table(table, tmp_path / "0.parquet")
    [file] = list_landing(tmp_path.as_uri())
    encoded = validate_file(file, _schema())
    deferred = validate_file(file, _schema(), encode_rows=False)
    assert deferred.rows_deferred == bool(len(encoded)) and not encoded.rows_deferred
    assert deferred.keys == encoded.keys
    assert deferred.errors == encoded.errors
    assert np.array_equal(deferred.orders, encoded.orders)
    assert np.array_equal(deferred.positions, encoded.positions)
    assert np.array_equal(deferred.deletes, encoded.deletes)
    schema = encoded.schema
    assert deferred.schema == schema
    if not len(encoded):
        return

    rows_e, rows_d = bucketed(encoded, 1), bucketed(deferred, 1)
    assert rows_deferred(rows_d) and not rows_deferred(rows_e)
    restored = with_encoded_rows(rows_d, schema)
    for name in ("bucket", "key", "row", "deleted", "order", "position"):
        assert restored.column(name).equals(rows_e.column(name)), name

    empty = ColumnarState.empty(keeps_orders=False)
    drained = drain_to_upper(empty, rows_e, 0)
    first = drain_into_empty(rows_d, schema)
    assert drained.retractions == 0
    assert first.winners == drained.winners == drained.applied
    assert first.keys.cast(pa.binary()).equals(drained.updates.column("key").combine_chunks())
    assert rows_of_values(first.values.columns).equals(
        drained.updates.column("row").combine_chunks())
    values = part_values(schema, rows_e, drained.updates, drained.sources)
    assert rows_of_values(first.values.columns).equals(rows_of_values(values.columns))
    assert np.array_equal(first.state.hi, drained.state.hi)
    assert np.array_equal(first.state.lo, drained.state.lo)
    assert as_row_array(first.state.rows).equals(as_row_array(drained.state.rows).cast(
        as_row_array(first.state.rows).type))


def _landing(root: Path) -> None:
    rng = np.random.default_rng(7)
    for i, n in enumerate((300, 120, 80)):
        keys = rng.integers(0, 150, n)
        pq.write_table(pa.table({
            "key": pa.array(keys, pa.int64()),
            "offset": pa.array(rng.integers(0, 1000, n), pa.int64()),
            "__deleted": pa.array(rng.random(n) < 0.15),
            "v": pa.array([None if k % 9 == 0 else f"v{k}" for k in keys]),
            "w": pa.array(np.where(rng.random(n) < 0.1, -0.0, rng.random(n))),
        }), root / f"{i:03d}.parquet", row_group_size=40)


def _ingest(root: Path, monkeypatch: pytest.MonkeyPatch, *, defer: bool, streamed: bool,
            reports: list[IngestReport] | None = None) -> Shard:
    with monkeypatch.context() as env:
        if not defer:
            env.setattr(FileTask, "defers_rows", property(lambda self: False))
        env.setenv(STREAM_BYTES_ENV, "0" if streamed else str(1 << 40))
        env.setenv(CHUNK_ROWS_ENV, "50")
        env.setenv("UPSERT_INGEST_MEMORY_MB", "0")
        shard = memory_shard()
        report = ingest(shard, root.as_uri(), IngestRequest(buckets=3))
    if reports is not None:
        reports.append(report)
    return shard


def _part_bytes(shard: Shard) -> list[bytes]:
    out: list[bytes] = []
    for batch in shard.state().batches:
        if batch.lower == 0:
            for part in batch.parts:
                data = shard.blob.get(part.key) if isinstance(part, BlobPart) else part.data
                assert data is not None
                out.append(data)
    return sorted(out)


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_a_first_file_ingests_the_same_shard_without_encoded_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, streamed: bool
) -> None:
    _landing(tmp_path)
    plain = _ingest(tmp_path, monkeypatch, defer=False, streamed=streamed)
    drained: list[int] = []
    real = tasks_module.drain_into_empty

    def counted(rows: pa.Table, schema: SourceSchema) -> object:
        drained.append(rows.num_rows)
        return real(rows, schema)

    monkeypatch.setattr(tasks_module, "drain_into_empty", counted)
    deferred = _ingest(tmp_path, monkeypatch, defer=True, streamed=streamed)
    assert len(drained) == 3 and sum(drained) > 0  # every bucket of the first file
    assert deferred.state().upper == plain.state().upper == 3
    for ts in range(3):
        assert snapshot_rows(deferred, ts) == snapshot_rows(plain, ts)
        assert change_rows(deferred, ts) == change_rows(plain, ts)
    assert _part_bytes(deferred) == _part_bytes(plain)  # the same parts, byte for byte
    assert deferred.check().ok


def test_a_chunk_that_must_be_encoded_reads_the_file_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _landing(tmp_path)
    reports: list[IngestReport] = []
    plain = _ingest(tmp_path, monkeypatch, defer=False, streamed=True, reports=reports)
    calls: list[bool] = []
    real = validate_module.encodes_in_bulk

    def second_chunk_declines(columns: list[pa.Array]) -> bool:
        calls.append(True)
        return real(columns) and len(calls) != 2

    monkeypatch.setattr(validate_module, "encodes_in_bulk", second_chunk_declines)
    retried: list[bool] = []
    original = tasks_module.RowsNotDeferred.__init__

    def noting(self: Exception, *args: object) -> None:
        retried.append(True)
        original(self, *args)

    monkeypatch.setattr(tasks_module.RowsNotDeferred, "__init__", noting)
    deferred = _ingest(tmp_path, monkeypatch, defer=True, streamed=True, reports=reports)
    assert retried == [True]
    # The report counts every read: the discarded attempt's chunks too.
    once, again = (r.files[0].landing_bytes_read - r.files[0].digest_bytes_read
                   for r in reports)
    assert again > once
    for ts in range(3):
        assert snapshot_rows(deferred, ts) == snapshot_rows(plain, ts)
        assert change_rows(deferred, ts) == change_rows(plain, ts)
    assert deferred.check().ok


def test_a_streamed_first_file_whose_chunks_evolve_the_schema_reads_encoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Debezium Parquet file's columns are those of the events kept so far: a first
    # chunk of deletes only has the key and order columns, a later chunk adds after's.
    # The spill keeps only the base columns of chunks that differ, so deferred rows would
    # reach the bucket step without their values: the file must be read encoded.
    image = pa.struct([("id", pa.int64()), ("v", pa.string())])
    events = [event("d", i, before={"id": i, "v": None}) for i in range(1, 4)]
    events += [event("c", i, after={"id": i % 5, "v": f"v{i}"}) for i in range(4, 12)]
    write_events_parquet(tmp_path, "0001.parquet", events, image=image,
                         source=pa.struct([("lsn", pa.int64())]))
    shards = []
    for stream_bytes in (str(1 << 40), "0"):
        monkeypatch.setenv(STREAM_BYTES_ENV, stream_bytes)
        monkeypatch.setenv(CHUNK_ROWS_ENV, "3")
        shard = memory_shard()
        ingest(shard, str(tmp_path), IngestRequest(key=("id",), envelope="debezium", buckets=2))
        assert shard.check().ok
        shards.append(shard)
    whole, streamed = shards
    assert snapshot_rows(streamed, 0) == snapshot_rows(whole, 0)
    assert len(snapshot_rows(streamed, 0)) == 5
