"""The in-process engine's bucket threads: same results as one thread, and a failing
bucket leaves none of the attempt's blobs behind (every other bucket ran and wrote)."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest

import upsert_core.ingest.tasks as tasks
from tests.ingest.helpers import memory_shard, write_jsonl
from upsert_core.errors import IngestError
from upsert_core.ingest import IngestRequest, InProcessEngine, ingest
from upsert_core.persist.read.read import snapshot


def _blobs(shard) -> set[str]:  # noqa: ANN001
    return {m.key for m in shard.blob.list_keys(f"{shard.shard_id}/")
            if "/rollup/" not in m.key}


def _files(tmp_path: Path) -> list[str]:
    out = []
    for i in range(3):
        d = tmp_path / f"f{i}"
        d.mkdir()
        write_jsonl(d, f"{i}.jsonl", [{"key": k, "offset": i, "v": f"{i}-{k}" * 40}
                                      for k in range(300) if (k + i) % 4])
        out.append(str(d))
    return out


def _rows(shard) -> list[tuple]:  # noqa: ANN001
    state = shard.state()
    table = pa.Table.from_batches(list(snapshot(shard.blob, state, state.upper - 1)))
    return sorted(zip(*(table.column(c).to_pylist() for c in ("key", "row", "diff")),
                      strict=True))


def test_threads_give_the_same_shard(tmp_path: Path) -> None:
    one, many = memory_shard(), memory_shard()
    for d in _files(tmp_path):
        ingest(one, d, IngestRequest(buckets=8), engine=InProcessEngine(threads=1))
        ingest(many, d, IngestRequest(buckets=8), engine=InProcessEngine(threads=4))
    assert _rows(one) == _rows(many)


def test_a_failing_bucket_leaves_no_blob_of_the_attempt(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    shard = memory_shard()
    files = _files(tmp_path)
    ingest(shard, files[0], IngestRequest(buckets=8), engine=InProcessEngine(threads=4))
    before = _blobs(shard)
    def failing_as(real):  # noqa: ANN001, ANN202
        def failing(blob, shard_id, bucket, *args):  # noqa: ANN001, ANN002, ANN202
            if bucket == 3:
                time.sleep(0.05)  # the other buckets write meanwhile
                raise IngestError("injected")
            return real(blob, shard_id, bucket, *args)
        return failing

    # Whichever kind of checkpoint the bucket writes (a typed base in the batch scope).
    for name in ("write_checkpoint", "write_typed_base"):
        monkeypatch.setattr(tasks, name, failing_as(getattr(tasks, name)))
    with pytest.raises(IngestError, match="injected"):
        ingest(shard, files[1], IngestRequest(buckets=8, inline_threshold=0),
               engine=InProcessEngine(threads=4))
    assert _blobs(shard) == before


@pytest.mark.parametrize("threads", [1, 4])
def test_an_unexpected_error_leaves_no_blob_of_the_attempt(
    tmp_path: Path, monkeypatch, threads: int  # noqa: ANN001
) -> None:
    # Not a platform error: it propagates out of the ingest, and before, the blobs the
    # other buckets (and the failing one) had written were left for GC's leak sweep.
    shard = memory_shard()
    files = _files(tmp_path)
    ingest(shard, files[0], IngestRequest(buckets=8), engine=InProcessEngine(threads=threads))
    before = _blobs(shard)
    def failing_as(real):  # noqa: ANN001, ANN202
        def failing(blob, shard_id, bucket, *args):  # noqa: ANN001, ANN002, ANN202
            if bucket == 3:
                raise ValueError("unexpected")
            return real(blob, shard_id, bucket, *args)
        return failing

    for name in ("write_checkpoint", "write_typed_base"):
        monkeypatch.setattr(tasks, name, failing_as(getattr(tasks, name)))
    with pytest.raises(ValueError, match="unexpected"):
        ingest(shard, files[1], IngestRequest(buckets=8, inline_threshold=0),
               engine=InProcessEngine(threads=threads))
    assert _blobs(shard) == before
