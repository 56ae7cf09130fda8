"""Value checks from sources.yaml: parsed and validated per source, carried into the
ingest request, and reported by a non-blocking WARN asset check."""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster import AssetCheckSeverity, AssetKey

from orchestration.definitions import build_definitions
from orchestration.sources import load_sources
from tests.dagster.helpers import Platform, write_jsonl
from upsert_core.errors import ConfigError
from upsert_core.landing import CheckKind, ValueCheck, parse_value_checks

HEAD = "sources:\n  - name: orders\n    landing: /tmp/x\n"


def _load(tmp_path: Path, text: str) -> list:  # type: ignore[type-arg]
    path = tmp_path / "sources.yaml"
    path.write_text(text)
    return load_sources(path, env={})


def test_checks_are_parsed_onto_the_spec_and_the_request(tmp_path: Path) -> None:
    (spec,) = _load(tmp_path, HEAD + (
        "    checks:\n"
        "      amount: {min: 0, max: 1000000}\n"
        "      status: {isin: [new, paid, shipped]}\n"
        "      email: {regex: '^[^@]+@[^@]+$'}\n"
        "      v: {not_null: true}\n"
    ))
    assert spec.checks == (
        ValueCheck("amount", CheckKind.IN_RANGE, min=0, max=1000000),
        ValueCheck("status", CheckKind.ISIN, values=("new", "paid", "shipped")),
        ValueCheck("email", CheckKind.REGEX, pattern="^[^@]+@[^@]+$"),
        ValueCheck("v", CheckKind.NOT_NULL),
    )
    assert spec.request().value_checks == spec.checks
    hash(spec.request())  # typed and hashable
    (plain,) = _load(tmp_path, HEAD)
    assert plain.checks == () and plain.request().value_checks == ()


@pytest.mark.parametrize(
    ("checks", "message"),
    [
        ("    checks: [amount]\n", "checks must be a mapping"),
        ("    checks:\n      amount: {maximum: 5}\n",
         "column 'amount': unknown check kind(s) ['maximum']"),
        ("    checks:\n      amount: {min: 9, max: 1}\n", "column 'amount'"),
        ("    checks:\n      amount: {min: zero}\n", "min and max must be finite numbers"),
        ("    checks:\n      email: {regex: '('}\n", "column 'email'"),
        ("    checks:\n      s: {isin: []}\n", "isin needs a non-empty list"),
        ("    deleted_col: gone\n    checks:\n      gone: {not_null: true}\n",
         "column 'gone' is the delete marker column"),
    ],
)
def test_malformed_checks_name_the_file_source_and_column(
    tmp_path: Path, checks: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, HEAD + checks)
    text = str(info.value)
    assert text.startswith(f"{tmp_path / 'sources.yaml'}: sources[0] (source 'orders')")
    assert message in text


def test_no_checks_no_extra_asset_check(plat: Platform) -> None:
    defs = build_definitions([plat.spec()], plat.resources())
    names = {c.name for c in defs.resolve_asset_graph().asset_check_keys}
    assert "value_checks_passed" not in names


def test_value_check_failures_warn_and_never_block_output_shard(plat: Platform) -> None:
    spec = plat.spec(checks=parse_value_checks({"n": {"min": 0}, "v": {"isin": ["ok"]}}))
    defs = build_definitions([spec], plat.resources())
    write_jsonl(plat.landing / "b-01.jsonl", [{"key": "a", "offset": 1, "n": 1, "v": "ok"}])
    write_jsonl(plat.landing / "b-02.jsonl", [
        {"key": "a", "offset": 2, "n": -1, "v": "ok"},
        {"key": "b", "offset": 2, "n": 2, "v": "bad"},
        {"key": "c", "offset": 2, "n": -5, "v": "bad"},
        {"key": None, "offset": 2, "n": 3, "v": "ok"},
        {"key": "d", "offset": 2, "n": 3, "v": "ok"},
    ])
    plat.add_partitions(spec, ["b-01.jsonl", "b-02.jsonl"])
    job = defs.resolve_job_def("feed_ingest")

    def run(partition: str):  # type: ignore[no-untyped-def]
        result = job.execute_in_process(partition_key=partition, instance=plat.instance,
                                        raise_on_error=False)
        checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
        done = {e.asset_key for e in result.get_asset_materialization_events()}
        return result, checks["value_checks_passed"], done

    result, check, done = run("b-01.jsonl")
    assert result.success and check.passed is True
    assert check.metadata["value_check_error_rows"].value == 0

    result, check, done = run("b-02.jsonl")
    assert result.success
    assert check.passed is False and check.severity == AssetCheckSeverity.WARN
    assert check.metadata["value_check_error_rows"].value == 3
    assert check.metadata["error_rows_in_run"].value == 4  # the null key is not counted
    assert check.metadata["since_ts"].value == 1
    top = str(check.metadata["top_failing_checks"].value)
    assert "`n min(0)`: 2" in top and "`v isin(['ok'])`: 2" in top
    assert AssetKey(["feed", "output_shard"]) in done
    errors = {(e["row"], e["reason"]) for e in plat.shard().errors()}
    assert (3, "value check n min(0) failed; value check v isin(['ok']) failed") in errors
