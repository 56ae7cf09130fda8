"""compare_and_append: success, upper mismatch, duplicate files, races, retries."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from tests.persist.writer_helpers import compare_and_append, registered_writer
from upsert_core.errors import InvalidUsage, UpsertPlatformError
from upsert_core.persist.location import Blob, Consensus
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.location.unreliable import FaultRates, UnreliableConsensus
from upsert_core.persist.read.read import read_all, snapshot
from upsert_core.persist.state.machine import Machine
from upsert_core.persist.state.state import HollowBatch
from upsert_core.persist.state.state_versions import StateVersions
from upsert_core.persist.write.append import delete_uncommitted
from upsert_core.persist.write.parts import read_error_part, write_batch, write_error_batch

from .test_parts import key, rows_of, updates_table

SHARD = "appends"


def new_machine(consensus: Consensus, blob: Blob) -> Machine:
    versions = StateVersions(consensus, blob, SHARD)
    versions.maybe_init_shard()
    return Machine(versions, rollup_every=4)


def one_row_batch(blob: Blob, ts: int, name: str) -> HollowBatch:
    rows = updates_table([(key(ts % 5), name.encode(), ts, 1)])
    return write_batch(blob, SHARD, rows, ts, ts + 1, inline_threshold=0)


def test_append_commits_batch_files_errors_and_config_in_one_state() -> None:
    blob = MemoryBlob()
    machine = new_machine(MemoryConsensus(), blob)
    registered_writer(machine)
    seqno = machine.state().seqno
    batch = one_row_batch(blob, 0, "f1")
    errors = write_error_batch(
        blob, SHARD, 0, pa.table({"file": ["f1"], "row": [2], "reason": ["null key"]})
    )
    result = compare_and_append(
        machine, batch, 0, ingested_files={"f1": 0}, errors=[errors],
        config_updates={"key": "id"},
    )
    assert result.committed and result.actual_upper == 1 and not result.upper_mismatch
    state = machine.state()
    assert state.seqno == seqno + 1  # one transition for everything
    assert state.batches == (batch,)
    assert dict(state.ingested_files) == {"f1": 0}
    assert state.errors == (errors,)
    assert dict(state.config) == {"key": "id", "commit_time.0": "0"}  # now_ms: 0
    assert rows_of(read_all(snapshot(blob, state, 0))) == [(key(0), b"f1", 0, 1)]
    assert read_error_part(blob, state.errors[0].part).column("reason").to_pylist() == [
        "null key"
    ]


def test_upper_mismatch_is_a_value_and_the_caller_deletes_its_parts() -> None:
    blob = MemoryBlob()
    consensus = MemoryConsensus()
    winner, loser = new_machine(consensus, blob), new_machine(consensus, blob)
    registered_writer(loser)
    loser.state()  # cache the state: the loser is about to be stale
    assert compare_and_append(winner, one_row_batch(blob, 0, "w"), 0).committed
    batch = one_row_batch(blob, 0, "l")
    errors = write_error_batch(
        blob, SHARD, 0, pa.table({"file": ["l"], "row": [1], "reason": ["x"]}),
        inline_threshold=0,
    )
    before = winner.state().seqno
    result = compare_and_append(loser, batch, 0, ingested_files={"l": 0}, errors=[errors])
    assert not result.committed and result.upper_mismatch
    assert result.actual_upper == 1 and result.state.seqno == before
    assert winner.state().seqno == before and "l" not in winner.state().ingested_files
    assert delete_uncommitted(blob, batch, [errors]) == 2
    referenced = set(winner.state().referenced_blob_keys())
    assert {m.key for m in blob.list_keys(f"{SHARD}/part/")} == referenced


def test_already_ingested_file_is_reported_and_never_applied_twice() -> None:
    blob = MemoryBlob()
    machine = new_machine(MemoryConsensus(), blob)
    assert compare_and_append(machine, one_row_batch(blob, 0, "a"), 0,
                              ingested_files={"a": 0}).committed
    again = one_row_batch(blob, 1, "a")
    result = compare_and_append(machine, again, 1, ingested_files={"b": 1, "a": 1})
    assert not result.committed and not result.upper_mismatch
    assert result.duplicate_files == ("a",)
    assert result.actual_upper == 1
    assert dict(machine.state().ingested_files) == {"a": 0}


def test_repeating_a_committed_append_reports_committed_without_reapplying() -> None:
    blob = MemoryBlob()
    machine = new_machine(MemoryConsensus(), blob)
    batch = one_row_batch(blob, 0, "a")
    assert compare_and_append(machine, batch, 0, ingested_files={"a": 0}).committed
    seqno = machine.state().seqno
    again = compare_and_append(machine, batch, 0, ingested_files={"a": 0})
    assert again.committed and again.actual_upper == 1
    assert machine.state().seqno == seqno and machine.state().batches == (batch,)


@pytest.mark.parametrize(
    ("lower", "upper", "expected", "files", "message"),
    [
        (1, 2, 0, {}, "must start at the expected upper"),
        (0, 0, 0, {}, "must start at the expected upper and be non-empty"),
        (0, 1, 0, {"f": 1}, "outside the batch"),
    ],
)
def test_malformed_requests_raise_invalid_usage(
    lower: int, upper: int, expected: int, files: dict[str, int], message: str
) -> None:
    machine = new_machine(MemoryConsensus(), MemoryBlob())
    batch = HollowBatch(lower=lower, upper=upper, since=0, parts=())
    with pytest.raises(InvalidUsage, match=message):
        compare_and_append(machine, batch, expected, ingested_files=files)


def test_racing_writers_each_ingest_their_files_exactly_once() -> None:
    blob = MemoryBlob()
    consensus = MemoryConsensus()
    new_machine(consensus, blob)
    files = [f"f{i:02d}" for i in range(24)]
    failures: list[BaseException] = []

    def writer(mine: list[str]) -> None:
        machine = Machine(StateVersions(consensus, blob, SHARD), rollup_every=4)
        try:
            for name in mine:
                while True:
                    upper = machine.state().upper
                    if name in machine.state().ingested_files:
                        break
                    batch = one_row_batch(blob, upper, name)
                    result = compare_and_append(machine, batch, upper,
                                                ingested_files={name: upper})
                    if result.committed:
                        break
                    delete_uncommitted(blob, batch)
        except BaseException as exc:  # surfaced by the assertion below
            failures.append(exc)

    # Three writers share each file, so every file is contended.
    threads = [threading.Thread(target=writer, args=(files[i::2] + files,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    state = Machine(StateVersions(consensus, blob, SHARD)).state()
    assert sorted(state.ingested_files) == files
    assert state.upper == len(files)
    rows = rows_of(read_all(snapshot(blob, state, state.upper - 1)))
    assert sorted(r for _, r, _, _ in rows) == sorted(f.encode() for f in files)
    assert {m.key for m in blob.list_keys(f"{SHARD}/part/")} == set(
        state.referenced_blob_keys()
    )


def test_retrying_the_same_append_after_store_failures_applies_it_once() -> None:
    blob = MemoryBlob()
    inner = MemoryConsensus()
    new_machine(inner, blob)
    flaky = UnreliableConsensus(inner, seed=7, rates=FaultRates(0.1, 0.1, 0.3))
    # One attempt per location call: indeterminate outcomes escape to the caller, who
    # must retry the same append without applying it twice.
    machine = Machine(StateVersions(flaky, blob, SHARD, location_attempts=1), rollup_every=4)
    for i in range(20):
        name = f"file{i}"
        with flaky.reliable():
            upper = machine.state().upper
        batch = one_row_batch(blob, upper, name)
        while True:
            try:
                result = compare_and_append(machine, batch, upper, ingested_files={name: upper})
            except UpsertPlatformError:
                continue  # may or may not have committed: retry the very same append
            assert result.committed  # a single writer never loses its upper
            break
    with flaky.reliable():
        state = machine.state()
    assert sum(flaky.injected.values()) > 0
    assert state.upper == 20 and len(state.batches) == 20
    assert dict(state.ingested_files) == {f"file{i}": i for i in range(20)}
