"""Asset checks: a run whose batch is corrupt fails the blocking checks and stops
output_shard; the blocking checks cover everything after the published watermark, so a
blocked batch stays blocked (the next run, a re-run) until a check passes over it; a
range the batch method cannot verify (GC in between) falls back to the full checks;
the full-history checks run in their own job and never block; new error rows only
warn."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from dagster import AssetCheckSeverity, DefaultScheduleStatus

from assets.checks import BLOCKING_CHECKS, FULL_CHECKS, verify_range
from tests.dagster.helpers import Platform, write_jsonl
from tests.ingest.helpers import memory_shard
from tests.ingest.test_check_batch import _big, _built, _ingest, _replace_row
from upsert_core.ingest import tasks
from upsert_core.ingest.shard_config import checkpoint_ref_name
from upsert_core.ingest.verify import STATE, check_new_batch
from upsert_core.persist.write.consolidate import UPDATE_SCHEMA


def _run(plat: Platform, partition: str | None, job: str = "feed_ingest"):  # type: ignore[no-untyped-def]
    spec = plat.spec()
    built, defs = plat.build(spec)
    result = defs.resolve_job_def(job).execute_in_process(
        partition_key=partition, instance=plat.instance, raise_on_error=False
    )
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    materialized = {e.asset_key for e in result.get_asset_materialization_events()}
    return built, result, checks, materialized


def _ingest_first_two(plat: Platform) -> list[str]:
    names = plat.write_batches(["b-01.jsonl", "b-02.jsonl", "b-03.jsonl"])
    plat.add_partitions(plat.spec(), names)
    built, result, checks, _ = _run(plat, names[1])
    assert result.success and all(c.passed for c in checks.values())
    assert set(checks) == {*BLOCKING_CHECKS, "error_rows_did_not_grow",
                           "landing_files_unchanged"}
    assert checks["state_matches_shard"].metadata["touched_buckets"].value > 0
    assert {c.metadata["method"].value for c in checks.values() if c.check_name
            in BLOCKING_CHECKS} == {"batch"}
    return names


def _problems(check: Any) -> str:
    return str(check.metadata["problems"].value)


def test_passing_checks_show_no_problems_entry(plat: Platform) -> None:
    """A passing check has nothing to list: no ``problems`` entry (the UI showed an empty
    ``problems [Show Markdown]`` on every green check); failing checks keep it (the
    tests below read it)."""
    names = plat.write_batches(["b-01.jsonl", "b-02.jsonl"])
    plat.add_partitions(plat.spec(), names)
    _, _, blocking, _ = _run(plat, names[1])
    _, _, full, _ = _run(plat, None, job="feed_full_check")
    checks = [*blocking.values(), *full.values()]
    assert {c.check_name for c in checks} == {*BLOCKING_CHECKS, *FULL_CHECKS,
                                              "error_rows_did_not_grow",
                                              "landing_files_unchanged"}
    assert all(c.passed for c in checks)
    assert [c.check_name for c in checks if "problems" in c.metadata] == []


def test_a_run_whose_changes_do_not_consolidate_is_blocked(
    plat: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = _ingest_first_two(plat)
    drain = tasks.drain_to_upper

    def doubled(*args: Any, **kwargs: Any) -> Any:
        out = drain(*args, **kwargs)
        updates = out.updates
        index = updates.schema.get_field_index("diff")
        diffs = pa.compute.multiply(updates.column("diff"), 2)
        return dataclasses.replace(out, updates=updates.set_column(index, "diff", diffs))

    monkeypatch.setattr(tasks, "drain_to_upper", doubled)
    built, result, checks, materialized = _run(plat, names[2])
    assert not result.success
    assert checks["shard_consolidated"].passed is False
    assert "must be +1 or -1" in _problems(checks["shard_consolidated"])
    assert checks["storage_invariants"].passed is True
    assert checks["shard_consolidated"].metadata["start_upper"].value == 2
    assert built.key("upsert_state") in materialized
    assert built.key("output_shard") not in materialized


def _doubling(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next ingest commits its changes with every diff doubled (not consolidated)."""
    drain = tasks.drain_to_upper

    def doubled(*args: Any, **kwargs: Any) -> Any:
        out = drain(*args, **kwargs)
        u = out.updates
        i = u.schema.get_field_index("diff")
        return dataclasses.replace(
            out, updates=u.set_column(i, "diff", pa.compute.multiply(u.column("diff"), 2)))

    monkeypatch.setattr(tasks, "drain_to_upper", doubled)


def blocked_b02(plat: Platform, monkeypatch: pytest.MonkeyPatch) -> Any:
    """b-01 published; b-02 applied corrupt, its checks failed: not published."""
    names = plat.write_batches(["b-01.jsonl", "b-02.jsonl", "b-03.jsonl"])
    plat.add_partitions(plat.spec(), names)
    built, result, _, _ = _run(plat, "b-01.jsonl")
    assert result.success
    with monkeypatch.context() as m:
        _doubling(m)
        built, result, checks, _ = _run(plat, "b-02.jsonl")
    assert not result.success and checks["shard_consolidated"].passed is False
    out = built.key("output_shard")
    assert plat.instance.get_materialized_partitions(out) == {"b-01.jsonl"}
    return built, out


def test_a_blocked_batch_stays_unpublished_until_a_check_covers_it(
    plat: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    built, out = blocked_b02(plat, monkeypatch)
    # The next run's own batch (b-03) is fine, but its checks start at the published
    # watermark (1): they cover b-02 again, fail, and publish nothing.
    _, result, checks, _ = _run(plat, "b-03.jsonl")
    assert not result.success
    meta = checks["shard_consolidated"].metadata
    assert (meta["start_upper"].value, meta["upper"].value) == (1, 3)
    assert meta["run_start_upper"].value == 2 and meta["published_upper"].value == 1
    assert checks["shard_consolidated"].passed is False
    assert "the files are applied (upsert_state) but not published" in str(
        checks["shard_consolidated"].description)
    # Re-running the blocked partition (a no-op ingest) checks [1, 2), not nothing.
    _, result, checks, _ = _run(plat, "b-02.jsonl")
    meta = checks["shard_consolidated"].metadata
    assert (meta["start_upper"].value, meta["upper"].value) == (1, 3)
    assert not result.success and checks["shard_consolidated"].passed is False
    assert plat.instance.get_materialized_partitions(out) == {"b-01.jsonl"}
    assert plat.instance.get_materialized_partitions(built.key("upsert_state")) == {
        "b-01.jsonl", "b-02.jsonl", "b-03.jsonl"}  # applied, all of them


def test_output_shard_alone_does_not_publish_unchecked_partitions(plat: Platform) -> None:
    names = plat.write_batches(["b-01.jsonl", "b-02.jsonl"])
    spec = plat.spec()
    plat.add_partitions(spec, names)
    built, defs = plat.build(spec)
    assert defs.resolve_job_def("feed_ingest").execute_in_process(
        partition_key=names[0], instance=plat.instance).success
    from upsert_core.ingest import ingest

    ingest(plat.shard(), str(plat.landing), spec.request())  # b-02, by the CLI
    from dagster import materialize

    result = materialize([*built.assets], selection=[built.key("output_shard")],
                         partition_key=names[1], instance=plat.instance,
                         resources=plat.resources(), raise_on_error=False)
    assert not result.success
    assert plat.instance.get_materialized_partitions(built.key("output_shard")) == {
        names[0]}


@pytest.mark.parametrize("scope", ["batch", "global"])
def test_a_range_gc_made_unverifiable_gets_the_full_checks(tmp_path: Path, scope: str) -> None:
    """A GC between the ingest and its checks truncates the state diffs the batch
    method needs: the blocking result is then the full checks', which still see a
    corrupt checkpoint, and say so."""
    # Columnar checkpoints: the corruption below replaces one with a valid one.
    shard = _built(tmp_path, scope, part_bases=False)
    start = _ingest(shard, tmp_path, scope, {"04.jsonl": _big(4), "05.jsonl": _big(5)},
                    part_bases=False)
    upper = shard.state().upper
    assert verify_range(shard, start, upper)[1] == "batch"
    _replace_row(shard, shard.state().config[checkpoint_ref_name(2)])
    shard.gc()
    assert check_new_batch(shard, start).notes  # the batch method cannot verify
    report, method = verify_range(shard, start, upper)
    assert method.startswith("full (") and "truncated" in method, method
    assert report.of_kind(STATE), (report.problems, report.notes)


@pytest.mark.parametrize("scope", ["batch", "global"])
@pytest.mark.parametrize("retain", [None, 1, 3])
def test_after_gc_retain_checks_pass_and_say_how(tmp_path: Path, scope: str,
                                                 retain: int | None) -> None:
    """A bucket untouched for runs, GC with --retain between: no false positive, and
    a range the batch method could not verify is verified by the full checks."""
    shard = memory_shard()
    _ingest(shard, tmp_path, scope, {"00.jsonl": _big(0)})
    for i in range(1, 6):  # small runs touching only key 1's bucket
        _ingest(shard, tmp_path, scope, {f"{i:02}.jsonl": [{"key": 1, "offset": i}]})
        shard.gc(retain=retain)
    start = _ingest(shard, tmp_path, scope, {"50.jsonl": [
        {"key": k, "offset": 50, "v": "new"} for k in range(2, 40)]})
    report, method = verify_range(shard, start, shard.state().upper)
    assert report.ok, report.problems
    assert (method == "batch") == (not check_new_batch(shard, start).notes), method
    # A watermark before since (e.g. a shard the CLI filled and GC'd before Dagster):
    if shard.state().since > 0:
        report, method = verify_range(shard, 0, shard.state().upper)
        assert report.ok and method.startswith("full (the range starts at ts 0"), method


def test_a_run_whose_checkpoint_is_lost_is_blocked(
    plat: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = _ingest_first_two(plat)
    lost: list[str] = []

    def losing(write: Any) -> Any:
        def write_then_lose(blob: Any, *args: Any) -> tuple[str, int]:
            key, size = write(blob, *args)
            blob.delete(key)
            lost.append(key)
            return key, size
        return write_then_lose

    # Whichever kind of checkpoint the bucket writes (a typed base in the batch scope).
    for name in ("write_checkpoint", "write_typed_base"):
        monkeypatch.setattr(tasks, name, losing(getattr(tasks, name)))
    built, result, checks, materialized = _run(plat, names[2])
    assert lost and not result.success
    assert checks["state_matches_shard"].passed is False
    assert lost[0] in _problems(checks["state_matches_shard"])
    assert checks["shard_consolidated"].passed is True
    assert built.key("output_shard") not in materialized


def test_full_checks_run_in_their_own_job_and_never_block(plat: Platform) -> None:
    names = _ingest_first_two(plat)
    shard = plat.shard()
    live = shard.snapshot_table().to_pylist()[0]
    # A second live row for an existing key, appended behind the ingest's back.
    upper = shard.state().upper
    bad = pa.Table.from_pylist(
        [{"key": live["key"], "row": live["row"] + b"x", "ts": upper, "diff": 1}],
        schema=UPDATE_SCHEMA,
    )
    assert shard.append(bad, upper).committed

    # A no-op ingest commits nothing, but its blocking checks cover everything after
    # the published watermark (2), the foreign batch included: blocked, not published.
    built, result, checks, materialized = _run(plat, names[0])
    assert not result.success and not set(checks) & set(FULL_CHECKS)
    meta = checks["state_matches_shard"].metadata
    assert (meta["start_upper"].value, meta["upper"].value) == (2, 3)
    assert checks["state_matches_shard"].passed is False
    assert "something other than the ingest" in _problems(checks["state_matches_shard"])
    assert "upsertctl check --shard feed" in str(checks["state_matches_shard"].description)
    assert built.key("output_shard") not in materialized

    built, result, checks, materialized = _run(plat, None, job="feed_full_check")
    assert set(checks) == set(FULL_CHECKS)
    assert result.success and not materialized  # non-blocking; no asset runs
    assert checks["full_shard_consolidated"].passed is False
    assert "live rows at ts" in _problems(checks["full_shard_consolidated"])
    assert checks["full_state_matches_shard"].passed is False
    assert checks["full_storage_invariants"].passed is True

    _, defs = plat.build(plat.spec())
    specs = {s.name: s for d in defs.asset_checks or [] for s in d.check_specs}
    assert {n: specs[n].blocking for n in (*BLOCKING_CHECKS, *FULL_CHECKS)} == {
        **dict.fromkeys(BLOCKING_CHECKS, True), **dict.fromkeys(FULL_CHECKS, False)
    }
    schedule = defs.resolve_schedule_def("feed_full_check_schedule")
    assert schedule.job_name == "feed_full_check"
    assert schedule.default_status == DefaultScheduleStatus.STOPPED


def test_new_error_rows_warn_without_blocking(plat: Platform) -> None:
    names = plat.write_batches(["b-01.jsonl", "b-02.jsonl", "b-03.jsonl"])
    plat.add_partitions(plat.spec(), names)
    built, result, checks, materialized = _run(plat, names[1])
    assert checks["error_rows_did_not_grow"].passed is True

    built, result, checks, materialized = _run(plat, names[2])  # b-03 has a null key
    assert result.success
    warn = checks["error_rows_did_not_grow"]
    assert warn.passed is False and warn.severity == AssetCheckSeverity.WARN
    assert warn.metadata["new_error_rows"].value == 1
    assert warn.metadata["since_ts"].value == 2
    assert checks["storage_invariants"].metadata["new_error_parts"].value == 1
    assert built.key("output_shard") in materialized


def test_a_rewritten_landing_file_fails_a_non_blocking_check_naming_it(plat: Platform) -> None:
    names = plat.write_batches(["b-01.jsonl", "b-02.jsonl"])
    plat.add_partitions(plat.spec(), names)
    _, _, checks, _ = _run(plat, names[0])
    assert checks["landing_files_unchanged"].passed is True
    assert "problems" not in checks["landing_files_unchanged"].metadata

    write_jsonl(plat.landing / "b-01.jsonl", [{"key": "a", "offset": 9, "v": "again"}])
    built, result, checks, materialized = _run(plat, names[1])
    assert result.success
    check = checks["landing_files_unchanged"]
    assert check.passed is False and check.severity == AssetCheckSeverity.ERROR
    assert check.metadata["rewritten_files"].value == ["b-01.jsonl"]
    assert "b-01.jsonl: rewritten since it was ingested" in _problems(check)
    assert "b-01.jsonl" in (check.description or "")
    assert built.key("output_shard") in materialized  # not blocking: b-02 is published
    assert all(checks[name].passed for name in BLOCKING_CHECKS)
    state = plat.shard().state()
    assert state.ingested_files == {"b-01.jsonl": 0, "b-02.jsonl": 1}


def test_a_shard_ingested_before_records_were_kept_passes_the_rewritten_check(
    plat: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    from upsert_core.ingest import pipeline

    names = plat.write_batches(["b-01.jsonl", "b-02.jsonl"])
    plat.add_partitions(plat.spec(), names)
    with monkeypatch.context() as old:  # an older version recorded names only
        old.setattr(pipeline, "with_ledger", lambda request, file: request)
        _run(plat, names[0])
    write_jsonl(plat.landing / "b-01.jsonl", [{"key": "a", "offset": 9, "v": "again"}])
    _, result, checks, _ = _run(plat, names[1])
    assert result.success and checks["landing_files_unchanged"].passed is True


def test_output_shard_row_count_is_the_published_one(
    plat: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``output_shard`` is the shard *as published* (through the upper its checks
    verified). A batch committed after the checks ran (``upsertctl ingest`` meanwhile)
    is not published, so its rows must not be in the published ``dagster/row_count``."""
    import assets.checks as checks_module
    from upsert_core.ingest import ingest
    from upsert_core.shard_table import ShardTable

    names = plat.write_batches(["b-01.jsonl"])
    plat.add_partitions(plat.spec(), names)
    verify = checks_module.verify_range

    def then_the_cli_ingests(*args: Any, **kwargs: Any) -> Any:
        out = verify(*args, **kwargs)
        write_jsonl(plat.landing / "b-02.jsonl",  # two new keys: more live rows
                    [{"key": "x", "offset": 1, "v": "x"}, {"key": "y", "offset": 1, "v": "y"}])
        ingest(plat.shard(), str(plat.landing), plat.spec().request())
        return out

    monkeypatch.setattr(checks_module, "verify_range", then_the_cli_ingests)
    built, result, _, _ = _run(plat, "b-01.jsonl")
    assert result.success
    [out] = [e.materialization for e in result.get_asset_materialization_events()
             if e.asset_key == built.key("output_shard")]
    assert out.metadata["published_upper"].value == 1
    assert plat.shard().state().upper == 2
    published_rows = ShardTable(plat.shard()).snapshot(0).num_rows
    assert published_rows != ShardTable(plat.shard()).snapshot().num_rows
    row_count = out.metadata.get("dagster/row_count")
    assert row_count is None or row_count.value == published_rows
