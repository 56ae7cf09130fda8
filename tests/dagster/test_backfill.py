"""A backfill is ONE run: partitions selected in any order (and added to Dagster in any
order) leave the shard identical to one sequential ingest, with every partition
materialized at the ts its file went in at."""

from __future__ import annotations

import random

import pytest
from dagster import AssetKey, DagsterEventType

from orchestration.backfill import find_source, main, run_backfill, select_partitions
from tests.dagster.helpers import Platform, shard_contents, write_jsonl
from upsert_core.ingest import InProcessEngine, ingest


def _partition_ts(plat: Platform, key: AssetKey) -> dict[str, int]:
    """Each materialized partition of ``key`` -> the ``ts`` of its latest materialization."""
    records = plat.instance.fetch_materializations(key, limit=1000).records
    found: dict[str, int] = {}
    for record in reversed(records):  # oldest first, so the latest wins
        event = record.asset_materialization
        assert event is not None and event.partition is not None
        found[event.partition] = int(event.metadata["ts"].value)  # type: ignore[arg-type]
    return found


def test_shuffled_single_run_backfill_equals_sequential_ingest(plat: Platform) -> None:
    names = plat.write_batches()
    spec = plat.spec()
    reference = plat.shard(stores="reference")
    ingest(reference, str(plat.landing), spec.request(), engine=InProcessEngine())
    expected = shard_contents(reference)
    assert expected["upper"] == len(names)

    order = list(names)
    random.Random(7).shuffle(order)
    assert order != sorted(order)
    # Partitions added out of name order: the run's key range is not in name order.
    plat.add_partitions(spec, order)
    _, defs = plat.build(spec)
    res = plat.resources()
    assert select_partitions(spec, res["consensus"], res["blob_store"]) == names

    runs = run_backfill(defs, spec, order, instance=plat.instance)
    assert [r.partition for r in runs] == names and all(r.success for r in runs)
    assert len({r.run_id for r in runs}) == 1  # one run for the whole backfill
    assert [r.status for r in runs] == [f"applied at ts {i}" for i in range(len(names))]
    assert shard_contents(plat.shard()) == expected
    assert select_partitions(spec, res["consensus"], res["blob_store"]) == []
    assert plat.shard().check().ok
    for asset in ("source_snapshot", "upsert_state", "output_shard"):
        assert plat.instance.get_materialized_partitions(AssetKey(["feed", asset])) == set(names)
    state_ts = _partition_ts(plat, AssetKey(["feed", "upsert_state"]))
    assert state_ts == {n: i for i, n in enumerate(names)}
    assert _partition_ts(plat, AssetKey(["feed", "output_shard"])) == state_ts
    # Each partition's events carry its own file and figures, never a count of the run
    # (Dagster copies a result's metadata onto every partition of a backfill run).
    for asset in ("source_snapshot", "upsert_state"):
        records = plat.instance.fetch_materializations(AssetKey(["feed", asset]),
                                                       limit=1000).records
        for record in records:
            event = record.asset_materialization
            assert event is not None
            assert not {"files_applied", "partitions", "pending_through"} & set(event.metadata)
            if asset == "source_snapshot":
                assert event.metadata["file"].value == event.partition
    [run] = plat.instance.get_runs()
    starts = plat.instance.all_logs(run.run_id, of_type=DagsterEventType.STEP_START)
    assert len(starts) == 4  # each asset and the checks ran once for all five partitions

    # Again: one no-op run that reports where each file went in.
    again = run_backfill(defs, spec, names[1:3], instance=plat.instance)
    assert [r.status for r in again] == [f"{n} was already ingested at ts {i + 1}"
                                         for i, n in enumerate(names[1:3])]
    assert shard_contents(plat.shard()) == expected


def test_a_backfills_events_are_stored_in_ts_order(plat: Platform) -> None:
    names = [f"c-{i:02d}.jsonl" for i in range(9)]  # 9! orders: a chance match is ~3e-6
    for i, name in enumerate(names):
        write_jsonl(plat.landing / name, [{"key": f"k{i}", "offset": i, "v": name}])
    spec = plat.spec()
    plat.add_partitions(spec, names)
    _, defs = plat.build(spec)
    runs = run_backfill(defs, spec, names, instance=plat.instance)
    assert len({r.run_id for r in runs}) == 1 and all(r.success for r in runs)
    for asset in ("upsert_state", "output_shard"):
        key = AssetKey(["feed", asset])
        records = plat.instance.fetch_materializations(key, limit=1000).records
        stored = [r.asset_materialization.partition for r in reversed(records)]  # type: ignore[union-attr]
        assert stored == names, (asset, stored)


def test_a_late_files_backfill_reports_it_last(plat: Platform) -> None:
    """A backfill of every file after a late one (a name before those already applied):
    the run applies only the late file, at the latest ts, and reports it last, after the
    partitions its range covers that earlier runs applied; so "Latest materialization"
    names the file the run applied, not the greatest name."""
    names = plat.write_batches(["b-02.jsonl", "b-03.jsonl"])
    spec = plat.spec()
    plat.add_partitions(spec, names)
    _, defs = plat.build(spec)
    run_backfill(defs, spec, names, instance=plat.instance)
    write_jsonl(plat.landing / "b-01.jsonl", [{"key": "late", "offset": 9, "v": "x"}])
    runs = run_backfill(defs, spec, ["b-01.jsonl", *names], instance=plat.instance)
    assert {r.partition: r.status for r in runs}["b-01.jsonl"] == "applied at ts 2"
    [run_id] = {r.run_id for r in runs}
    for asset in ("upsert_state", "output_shard"):
        records = plat.instance.fetch_materializations(AssetKey(["feed", asset]),
                                                       limit=1000).records
        stored = [r.asset_materialization.partition for r in reversed(records)  # type: ignore[union-attr]
                  if r.run_id == run_id]
        assert stored == ["b-02.jsonl", "b-03.jsonl", "b-01.jsonl"], (asset, stored)
        assert plat.instance.get_latest_materialization_event(  # type: ignore[union-attr]
            AssetKey(["feed", asset])).asset_materialization.partition == "b-01.jsonl"


def test_backfill_stops_at_a_broken_file(plat: Platform) -> None:
    names = plat.write_batches(["b-01.jsonl", "b-03.jsonl"])
    (plat.landing / "b-02.jsonl").write_text('{"key": "x", "offset": "not a number"}\n{')
    spec = plat.spec()
    _, defs = plat.build(spec)
    runs = run_backfill(defs, spec, ["b-03.jsonl", names[0]], instance=plat.instance)
    assert [(r.partition, r.success) for r in runs] == [("b-01.jsonl", True),
                                                        ("b-03.jsonl", False)]
    assert runs[0].status == "applied at ts 0"  # committed before the failure
    assert runs[1].status.startswith("failed: b-02.jsonl: ")
    assert dict(plat.shard().state().ingested_files) == {"b-01.jsonl": 0}
    # The file committed before the failure shows as materialized.
    key = AssetKey(["feed", "upsert_state"])
    assert plat.instance.get_materialized_partitions(key) == {"b-01.jsonl"}
    assert find_source([spec], "feed") is spec


def test_a_failed_backfill_reports_earlier_files_as_already_ingested(
    plat: Platform,
) -> None:
    names = plat.write_batches(["b-01.jsonl", "b-03.jsonl"])
    spec = plat.spec()
    _, defs = plat.build(spec)
    first = run_backfill(defs, spec, [names[0]], instance=plat.instance)
    assert [r.status for r in first] == ["applied at ts 0"]
    (plat.landing / "b-02.jsonl").write_text('{"key": "x", "offset": "not a number"}\n{')
    runs = run_backfill(defs, spec, [names[0], "b-02.jsonl", names[1]],
                        instance=plat.instance)
    by = {r.partition: r for r in runs}
    assert dict(plat.shard().state().ingested_files) == {"b-01.jsonl": 0}
    # b-01 went in at ts 0 in the first backfill; this run did nothing to it.
    assert by["b-01.jsonl"].status == "b-01.jsonl was already ingested at ts 0"
    assert by["b-01.jsonl"].success
    assert not by["b-02.jsonl"].success and by["b-02.jsonl"].status.startswith("failed: ")


def _backfill_cli_env(plat: Platform, monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment ``python -m orchestration.backfill`` runs in: source ``feed`` on
    the platform's landing, the in-process engine, definitions rebuilt from it."""
    monkeypatch.setenv("UPSERT_HOME", str(plat.root / "upsert_home"))
    monkeypatch.setenv("UPSERT_ENGINE", "local")
    monkeypatch.setenv("UPSERT_LANDING", str(plat.landing))
    monkeypatch.setenv("UPSERT_SHARD", "feed")
    monkeypatch.setenv("DAGSTER_HOME", str(plat.root / "dagster_home"))
    import orchestration.definitions as definitions

    monkeypatch.setattr(definitions, "SOURCES", definitions.load_sources())
    monkeypatch.setattr(definitions, "defs", definitions.build_definitions(definitions.SOURCES))


def test_cli_prints_one_line_per_partition_and_exit_codes(
    plat: Platform, monkeypatch, capsys  # type: ignore[no-untyped-def]
) -> None:
    _backfill_cli_env(plat, monkeypatch)
    names = plat.write_batches(["b-01.jsonl", "b-02.jsonl", "b-03.jsonl"])
    assert main(["feed", "--shuffle", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{n}: applied at ts {i}" for i, n in enumerate(names)]
    assert main(["feed"]) == 0
    assert "nothing to backfill" in capsys.readouterr().err
    assert main(["nope"]) == 2
    assert "no source named 'nope'" in capsys.readouterr().err
    (plat.landing / "b-04.jsonl").write_text('{"offset": 1}\n')  # no key column
    assert main(["feed"]) == 1
    captured = capsys.readouterr()
    assert captured.out.startswith("b-04.jsonl: failed: b-04.jsonl: ")
    assert "error: b-04.jsonl: failed: b-04.jsonl: missing key column" in captured.err


def test_a_backfill_whose_blocking_checks_fail_exits_1(
    plat: Platform, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Review: a run applies its files (upsert_state) before its blocking checks; when
    # those fail (a corrupt batch) the run fails and nothing is published, but every
    # partition had an "applied" status, so the backfill exited 0 with no error.
    from tests.dagster.test_checks import _doubling

    _backfill_cli_env(plat, monkeypatch)
    names = plat.write_batches(["b-01.jsonl", "b-02.jsonl"])
    _doubling(monkeypatch)  # the ingest commits every diff doubled: not consolidated
    assert main(["feed"]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [f"{n}: applied at ts {i}" for i, n in enumerate(names)]
    assert "failed after applying the files (not published)" in captured.err

    spec = plat.spec()
    _, defs = plat.build(spec)
    runs = run_backfill(defs, spec, names, instance=plat.instance)
    assert all(r.success for r in runs)  # the files are in the shard...
    assert all(r.run_error for r in runs)  # ...but the run (its checks) failed


def test_a_removed_file_inside_the_range_does_not_block_the_backfill(plat: Platform) -> None:
    """CONTRACT: a broken file stops the ingest at it; "later files wait until the file
    is fixed or removed, then a re-run continues". Removed here: its partition stays in
    Dagster (partitions are never deleted), inside the key range of any later backfill
    that spans it. That backfill must apply the files that are there, not fail on the
    partition whose file is gone."""
    names = plat.write_batches(["b-01.jsonl", "b-03.jsonl"])
    (plat.landing / "b-02.jsonl").write_text('{"key": "x", "offset": "not a number"}\n{')
    spec = plat.spec()
    _, defs = plat.build(spec)
    first = run_backfill(defs, spec, ["b-01.jsonl", "b-02.jsonl", "b-03.jsonl"],
                         instance=plat.instance)
    assert [r.success for r in first] == [True, False, False]
    (plat.landing / "b-02.jsonl").unlink()  # the contract's remedy

    runs = run_backfill(defs, spec, names, instance=plat.instance)
    assert dict(plat.shard().state().ingested_files) == {"b-01.jsonl": 0, "b-03.jsonl": 1}
    by = {r.partition: r for r in runs}
    assert by["b-03.jsonl"].success and by["b-03.jsonl"].status == "applied at ts 1"
    # The partition without a file is not reported done: the run fails naming it.
    assert not by["b-02.jsonl"].success
    assert "b-02.jsonl: no such file in the landing location" in str(by["b-02.jsonl"].run_error)


def test_a_named_file_that_is_not_in_the_landing_adds_no_partition(plat: Platform) -> None:
    """Dynamic partitions are never deleted: a typo on the backfill command line
    (``python -m orchestration.backfill feed b-01.json``) must be refused naming the
    file, not become a partition for a file that will never be ingested (and sit in the
    key range of every later backfill)."""
    from upsert_core.errors import IngestError

    plat.write_batches(["b-01.jsonl"])
    spec = plat.spec()
    _, defs = plat.build(spec)
    with pytest.raises(IngestError, match=r"b-01\.json: no such file in the landing"):
        run_backfill(defs, spec, ["b-01.jsonl", "b-01.json"], instance=plat.instance)
    assert plat.instance.get_dynamic_partitions(spec.partitions_name) == []
    assert not plat.instance.get_runs()


def test_the_cli_refuses_a_throwaway_instance_unless_asked(
    plat: Platform, monkeypatch, capsys  # type: ignore[no-untyped-def]
) -> None:
    """Issue 23: without DAGSTER_HOME the runs went to a throwaway instance and nothing
    reached the UI the README had just started."""
    _backfill_cli_env(plat, monkeypatch)
    monkeypatch.delenv("DAGSTER_HOME")
    names = plat.write_batches(["b-01.jsonl"])
    assert main(["feed"]) == 2
    err = capsys.readouterr().err
    assert "DAGSTER_HOME is not set" in err and "--ephemeral" in err
    assert main(["feed", "--ephemeral"]) == 0  # applied at ts 0: nothing went in before
    assert capsys.readouterr().out.splitlines() == [f"{names[0]}: applied at ts 0"]
