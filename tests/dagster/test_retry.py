"""Runs of one shard: a lost race is retried by the asset's RetryPolicy (a step retry the
UI shows), and the retry applies only what is still pending; the files the first
attempt committed count as the run's and its blocking checks cover them; the shard's
writers share a concurrency pool, limited to 1 by the instance configuration users
get."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from dagster import AssetKey, DagsterEventType, DagsterRunStatus
from dagster._core.errors import DagsterExecutionInterruptedError

from assets import factory
from assets.factory import shard_pool
from resources.stores import SqliteConsensus
from tests.dagster.helpers import Platform, shard_contents
from upsert_core.errors import ConcurrentModification
from upsert_core.ingest import InProcessEngine, ingest, tasks
from upsert_core.persist.location import Consensus

REPO = Path(__file__).resolve().parents[2]
#: consensus path -> how many commits of the marked file are still to lose
_LOSSES: dict[str, int] = {}


class _LosingConsensus:
    """Loses the first compare-and-set that commits ``marker`` (another writer won)."""

    def __init__(self, inner: Consensus, path: str, marker: bytes) -> None:
        self._inner, self._path, self._marker = inner, path, marker

    def compare_and_set(self, key: str, expected: Any, new: Any) -> Any:
        if _LOSSES.get(self._path, 0) > 0 and self._marker in new.data:
            _LOSSES[self._path] -= 1
            raise ConcurrentModification(f"shard {key}: concurrently modified (test)")
        return self._inner.compare_and_set(key, expected, new)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class LosingConsensus(SqliteConsensus):
    marker: str

    def open(self) -> Consensus:
        return _LosingConsensus(super().open(), self.path, self.marker.encode())  # type: ignore[return-value]


def test_lost_race_is_retried_by_the_retry_policy(plat: Platform) -> None:
    names = plat.write_batches(["b-01.jsonl", "b-02.jsonl"])
    spec = plat.spec()
    built, _ = plat.build(spec)
    plat.add_partitions(spec, names)
    resources = plat.resources()
    consensus = LosingConsensus(path=resources["consensus"].path, marker=names[1])
    _LOSSES[consensus.path] = 1
    from orchestration.definitions import build_definitions

    defs = build_definitions([spec], {**resources, "consensus": consensus})
    result = defs.resolve_job_def("feed_ingest").execute_in_process(
        partition_key=names[1], instance=plat.instance
    )
    assert result.success and _LOSSES[consensus.path] == 0
    types = [e.event_type for e in result.all_events if e.step_key == "feed__upsert_state"]
    assert DagsterEventType.STEP_UP_FOR_RETRY in types and DagsterEventType.STEP_RESTARTED in types
    # b-01 was committed by the first attempt; the retry applied only b-02.
    reference = plat.shard(stores="reference")
    ingest(reference, str(plat.landing), spec.request(), engine=InProcessEngine())
    assert shard_contents(plat.shard()) == shard_contents(reference)
    key = AssetKey(["feed", "upsert_state"])
    assert plat.instance.get_materialized_partitions(key) == set(names)


def test_an_interrupted_ingest_is_not_retried(
    plat: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C or SIGTERM reaching a run (Dagster raises DagsterExecutionInterruptedError in
    the step) stops it: a retry policy on the asset made Dagster restart the interrupted
    ingest, so a stopped ``dagster dev`` kept a run going, with a new Spark driver the
    signal had not reached (issue 23)."""
    names = plat.write_batches(["b-01.jsonl"])
    spec = plat.spec()
    plat.add_partitions(spec, names)
    ingest_through, calls = factory.ingest_through, []

    def interrupted_once(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise DagsterExecutionInterruptedError
        return ingest_through(*args, **kwargs)

    monkeypatch.setattr(factory, "ingest_through", interrupted_once)
    from orchestration.definitions import build_definitions

    defs = build_definitions([spec], plat.resources())
    with contextlib.suppress(DagsterExecutionInterruptedError):
        defs.resolve_job_def("feed_ingest").execute_in_process(
            partition_key=names[0], instance=plat.instance, raise_on_error=False)
    assert calls == [1]  # one attempt, no retry
    [run] = plat.instance.get_runs()
    assert run.status == DagsterRunStatus.FAILURE
    types = {e.dagster_event.event_type for e in plat.instance.all_logs(run.run_id)
             if e.dagster_event is not None}
    assert DagsterEventType.STEP_UP_FOR_RETRY not in types
    assert not plat.instance.get_materialized_partitions(AssetKey(["feed", "upsert_state"]))


def test_the_checks_cover_what_the_first_attempt_committed(
    plat: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = plat.write_batches(["b-01.jsonl", "b-02.jsonl"])
    spec = plat.spec()
    plat.add_partitions(spec, names)
    resources = plat.resources()
    consensus = LosingConsensus(path=resources["consensus"].path, marker=names[1])
    _LOSSES[consensus.path] = 1
    # The first file of the run (committed by the first attempt) is corrupt.
    drain, calls = tasks.drain_to_upper, []

    def doubled_once(*args: Any, **kwargs: Any) -> Any:
        out = drain(*args, **kwargs)
        calls.append(1)
        if len(calls) > 1:
            return out
        u = out.updates
        i = u.schema.get_field_index("diff")
        return dataclasses.replace(
            out, updates=u.set_column(i, "diff", pa.compute.multiply(u.column("diff"), 2)))

    monkeypatch.setattr(tasks, "drain_to_upper", doubled_once)
    # The shard's first file is drained from its values (ingest.first_drain), not by
    # drain_to_upper: make it take the encoded path so the corruption reaches it.
    monkeypatch.setattr(tasks.FileTask, "defers_rows", property(lambda self: False))
    from orchestration.definitions import build_definitions

    defs = build_definitions([spec], {**resources, "consensus": consensus})
    result = defs.resolve_job_def("feed_ingest").execute_in_process(
        partition_key=names[1], instance=plat.instance, raise_on_error=False)
    assert _LOSSES[consensus.path] == 0  # the race was lost and retried
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    meta = checks["shard_consolidated"].metadata
    assert (meta["start_upper"].value, meta["upper"].value) == (0, 2)
    assert meta["run_start_upper"].value == 0  # the run's, not the retry's (1)
    assert checks["shard_consolidated"].passed is False
    assert not plat.instance.get_materialized_partitions(AssetKey(["feed", "output_shard"]))
    # b-01 is labelled as this run's (its first attempt committed it).
    [event] = [r.asset_materialization for r in plat.instance.fetch_materializations(
        AssetKey(["feed", "upsert_state"]), limit=10).records
        if r.asset_materialization and r.asset_materialization.partition == names[0]]
    assert event.metadata["applied_by"].value == "this run"


def test_shard_writers_share_a_pool_limited_to_one() -> None:
    from orchestration.definitions import defs

    graph = defs.resolve_asset_graph()
    pools = {name: graph.assets_def_for_key(AssetKey(["demo", name])).op.pool
             for name in ("upsert_state", "rollup_gc")}
    assert set(pools.values()) == {shard_pool("demo")} == {"upsert-shard-demo"}
    for config in ("deploy/dagster.yaml", "deploy/dagster-dev.yaml"):
        text = yaml.safe_load((REPO / config).read_text())
        assert text["concurrency"]["pools"]["default_limit"] == 1, config


def test_runs_claim_the_pool_on_the_users_instance(plat: Platform) -> None:
    """The demo's instance configuration loads, and a run takes (and frees) its pool slot."""
    from dagster import DagsterInstance
    from dagster._core.instance.ref import InstanceRef

    home = plat.root / "dev_home"  # in memory: SQLite commits are fsync-bound
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "deploy/dagster-dev.yaml").read_text())
    names = plat.write_batches(["b-01.jsonl"])
    spec = plat.spec()
    _, defs = plat.build(spec)
    with DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        instance.add_dynamic_partitions(spec.partitions_name, names)
        result = defs.resolve_job_def("feed_ingest").execute_in_process(
            partition_key=names[0], instance=instance
        )
        assert result.success
        info = instance.event_log_storage.get_concurrency_info(shard_pool("feed"))
        assert info.slot_count == 1 and not info.active_slot_count
    assert dict(plat.shard().state().ingested_files) == {"b-01.jsonl": 0}
