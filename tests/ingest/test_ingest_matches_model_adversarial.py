"""Review 5: the in-process ingest against the dict model on adversarial runs.

Beyond ``test_model`` and ``test_gc_retain_model``: enough keys that bucket bases are
kept and replayed (pending updates stay under ``REPLAY_FRACTION`` of a base), two-column
keys with nulls in key parts (error rows), null values, identical re-sends, a value
column added later, ``gc --retain`` between files, several processes (own caches, some
cold), and crashes around the commit (before it, and after it committed), each followed
by a re-run. The shard's snapshots and changes at every readable ts must equal the
model's, and ``check`` must hold.
"""

from __future__ import annotations

import datetime as dt
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.model import UpsertModel
from upsert_core.columnar import merge
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.engine import InProcessEngine
from upsert_core.ingest.verify import compare_state
from upsert_core.persist.shard import Shard

from .helpers import change_rows, memory_shard, snapshot_rows, write_jsonl, write_parquet

KEYS = ("k1", "k2")


class Crash(Exception):
    """A process dying around its commit."""


class CrashingShard:
    """A shard handle whose next commit crashes before (``"before"``) or after
    (``"after"``) the compare-and-append."""

    def __init__(self, shard: Shard) -> None:
        self._shard = shard
        self.crash: str | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._shard, name)

    def compare_and_append(self, request: Any, *, writer_id: str | None = None) -> Any:
        crash, self.crash = self.crash, None
        if crash == "before":
            raise Crash("before the commit")
        result = self._shard.compare_and_append(request, writer_id=writer_id)
        if crash == "after":
            raise Crash("after the commit")
        return result


def _ingest_through_crash(shard: CrashingShard, root: Path, request: IngestRequest,
                          engine: Any, crash: str | None) -> None:
    """Ingest the landing with ``crash`` armed; after a crash, re-run as a user would."""
    shard.crash = crash
    try:
        ingest(shard, str(root), request, engine=engine)  # type: ignore[arg-type]
    except Crash:
        ingest(shard, str(root), request, engine=engine)  # type: ignore[arg-type]


@st.composite
def source_row(draw: st.DrawFn, with_w: bool, keys: int = 12) -> dict[str, Any]:
    row: dict[str, Any] = {
        "k1": draw(st.integers(0, keys)),
        "k2": draw(st.sampled_from(["a", "b", ""])),
        "offset": draw(st.integers(0, 4)),
    }
    if draw(st.integers(0, 15)) == 0:
        row[draw(st.sampled_from(KEYS))] = None  # an error row
    if draw(st.integers(0, 4)) == 0:
        row["__deleted"] = draw(st.sampled_from([True, "TRUE", False, None]))
    else:
        row["v"] = draw(st.sampled_from(["x", "y", None]))
        if with_w and draw(st.booleans()):
            row["w"] = draw(st.sampled_from([1, None]))
    return row


@st.composite
def plans(draw: st.DrawFn, keys: int = 12) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    added = draw(st.integers(0, 8))
    files = 0
    for _ in range(draw(st.integers(2, 12))):
        kind = draw(st.sampled_from(["ingest", "ingest", "ingest", "gc", "crash", "resend"]))
        if kind == "gc" and files:
            out.append(("gc", draw(st.integers(1, 3))))
        elif kind == "resend" and files:
            out.append(("resend", draw(st.integers(0, 2))))
        else:
            rows = draw(st.lists(source_row(files >= added, keys), max_size=14))
            crash = draw(st.sampled_from(["before", "after"])) if kind == "crash" else None
            out.append(("ingest", (draw(st.integers(0, 2)), rows, crash)))
            files += 1
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=st.sampled_from([12, 400]).flatmap(plans),
       scope=st.sampled_from(["batch", "global"]), buckets=st.sampled_from([1, 2]),
       seed=st.lists(st.fixed_dictionaries({"k1": st.integers(100, 400), "k2": st.just("s"),
                                            "offset": st.just(0), "v": st.just("seed")}),
                     max_size=60))
def test_adversarial_runs_match_model(plan: list[tuple[str, Any]], scope: str,
                                      buckets: int, seed: list[dict[str, Any]]) -> None:
    """With 400 keys and a seed file, small files keep their bucket's base for several
    files, so cold loads and cached states are caught up by replay."""
    shard = CrashingShard(memory_shard())
    model = UpsertModel(scope, key=KEYS)
    # Process 2 has no cache: every file it ingests loads checkpoints cold.
    engines = [InProcessEngine(cache="new"), InProcessEngine(cache="new"),
               InProcessEngine(cache=None)]
    request = IngestRequest(key=KEYS, order_scope=scope, buckets=buckets)
    sent: list[list[dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)

        def add(process: int, rows: list[dict[str, Any]], crash: str | None) -> None:
            write_jsonl(root, f"{len(sent):04d}.jsonl", rows)
            sent.append(rows)
            model.apply(rows)
            _ingest_through_crash(shard, root, request, engines[process], crash)

        for kind, arg in [("ingest", (0, seed, None)), *plan]:
            if kind == "gc":
                shard.gc(retain=arg, leak_grace_ms=0)
            elif kind == "resend":  # the last file again (identical rows, same orders)
                add(arg, sent[-1], None)
            else:
                add(*arg)
            state = shard.state()
            assert state.upper == model.upper
            for ts in range(state.since, state.upper):
                assert snapshot_rows(shard, ts) == model.rows(ts), f"snapshot at {ts}"  # type: ignore[arg-type]
                if ts > state.since:
                    assert change_rows(shard, ts) == model.row_changes(ts), f"changes at {ts}"  # type: ignore[arg-type]
            assert state.num_errors() == len(model.errors)
    report = shard.check()
    assert report.ok, report.problems
    assert not compare_state(shard._shard).problems


EPOCH = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


@st.composite
def parquet_file(
    draw: st.DrawFn, with_w: bool, first: bool
) -> tuple[pa.Table, list[dict[str, Any]]]:
    """A Parquet batch with a timestamp order column (ties at the microsecond), a float
    value column written as int64 in some files (it widens), and column ``w`` in later
    ones; and the same rows as the model reads them."""
    n = draw(st.integers(0, 10))
    k1 = draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))
    k2 = draw(st.lists(st.sampled_from([EPOCH, EPOCH + dt.timedelta(microseconds=1)]),
                       min_size=n, max_size=n))
    at = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    deleted = draw(st.lists(st.sampled_from([None, False, True]), min_size=n, max_size=n))
    x = draw(st.lists(st.sampled_from([None, 1, 2]), min_size=n, max_size=n))
    as_int = not first and draw(st.booleans())  # the first file fixes x as float64
    columns: dict[str, pa.Array] = {
        "k1": pa.array(k1, pa.int64()),
        "k2": pa.array(k2, pa.timestamp("us", tz="UTC")),
        "offset": pa.array([EPOCH + dt.timedelta(seconds=s) for s in at],
                           pa.timestamp("us", tz="UTC")),
        "__deleted": pa.array(deleted, pa.bool_()),
        "x": pa.array(x, pa.int64()) if as_int else pa.array(
            [None if v is None else float(v) for v in x], pa.float64()),
    }
    w = None
    if with_w:
        w = draw(st.lists(st.sampled_from([None, "p"]), min_size=n, max_size=n))
        columns["w"] = pa.array(w, pa.string())
    rows = []
    for i in range(n):
        row: dict[str, Any] = {
            "k1": k1[i], "k2": k2[i], "offset": EPOCH + dt.timedelta(seconds=at[i]),
            "__deleted": deleted[i], "x": None if x[i] is None else float(x[i]),
        }
        if w is not None:
            row["w"] = w[i]
        rows.append(row)
    return pa.table(columns), rows


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), scope=st.sampled_from(["batch", "global"]),
       cold=st.lists(st.booleans(), min_size=8, max_size=8))
def test_parquet_timestamp_orders_match_model(data: st.DataObject, scope: str,
                                              cold: list[bool]) -> None:
    files = data.draw(st.integers(1, 8))
    added = data.draw(st.integers(0, files))
    shard = memory_shard()
    model = UpsertModel(scope, key=KEYS)
    warm = InProcessEngine(cache="new")
    request = IngestRequest(key=KEYS, order_scope=scope, buckets=2)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i in range(files):
            table, rows = data.draw(parquet_file(i >= added, i == 0))
            write_parquet(root, f"{i:04d}.parquet", table)
            model.apply(rows)
            engine = InProcessEngine(cache=None) if cold[i] else warm
            ingest(shard, str(root), request, engine=engine)
            state = shard.state()
            for ts in range(state.upper):
                assert snapshot_rows(shard, ts) == model.rows(ts), f"snapshot at {ts}"
                assert change_rows(shard, ts) == model.row_changes(ts), f"changes at {ts}"
    assert not compare_state(shard).problems


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=st.sampled_from([12, 400]).flatmap(plans), scope=st.sampled_from(["batch", "global"]),
       fold=st.sampled_from([(0, 0.0), (2, 0.1)]))
def test_overlay_folds_and_blob_parts_match_model(plan: list[tuple[str, Any]], scope: str,
                                                  fold: tuple[int, float]) -> None:
    """The same runs with the overlay folded early and every part written as a blob."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(merge, "FOLD_MIN_KEYS", fold[0])
        mp.setattr(merge, "FOLD_FRACTION", fold[1])
        shard = CrashingShard(memory_shard())
        model = UpsertModel(scope, key=KEYS)
        engines = [InProcessEngine(cache="new"), InProcessEngine(cache="new"),
                   InProcessEngine(cache=None)]
        request = IngestRequest(key=KEYS, order_scope=scope, buckets=3, inline_threshold=0)
        n = 0
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            last: list[dict[str, Any]] = []
            for kind, arg in plan:
                if kind == "gc":
                    shard.gc(retain=arg, leak_grace_ms=0)
                    continue
                process, rows, crash = (arg, last, None) if kind == "resend" else arg
                write_jsonl(root, f"{n:04d}.jsonl", rows)
                n += 1
                last = rows
                model.apply(rows)
                _ingest_through_crash(shard, root, request, engines[process], crash)
                state = shard.state()
                for ts in range(state.since, state.upper):
                    assert snapshot_rows(shard, ts) == model.rows(ts), f"snapshot at {ts}"  # type: ignore[arg-type]
                    if ts > state.since:
                        assert change_rows(shard, ts) == model.row_changes(ts)  # type: ignore[arg-type]
        assert not compare_state(shard._shard).problems
