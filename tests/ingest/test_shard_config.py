"""``ShardIngestConfig``: the shard's config entries the ingest keeps, as one typed value.

- ``read(entries(v)) == v`` (examples and a property over generated values), and the
  entries of what ``read`` returns are the stored entries again;
- the entry names and value formats are exactly the ones existing shards hold (spelled
  out literally here, so they never drift silently), and every commit of a real ingest
  writes exactly what the hand-built updates of the ingest before ``ShardIngestConfig``
  wrote, in the same order (the order a commit's state diff lists them in);
- ``read`` is exactly as tolerant as the ingest was: malformed history, live rows or
  checkpoint upper read as nothing, malformed stored options raise ``ConfigError``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from upsert_core.errors import ConfigError
from upsert_core.ingest import IngestRequest, ingest, pipeline
from upsert_core.ingest.options import resolve_options
from upsert_core.ingest.outcome import FileOutcome
from upsert_core.ingest.shard_config import (
    HISTORY_LENGTH,
    MAX_BUCKETS,
    ShardIngestConfig,
    ShardOptions,
)
from upsert_core.ingest.tasks import FileTask
from upsert_core.landing import LogicalType, SourceSchema
from upsert_core.order_scope import OrderScope
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.state import BLOB_REF_PREFIX, ShardState
from upsert_core.persist.write.append import AppendRequest
from upsert_core.persist.write.consolidate import UPDATE_SCHEMA

from .helpers import memory_shard, snapshot_rows, write_jsonl

SCHEMA = SourceSchema(
    key=("id",), order="seq", deleted="gone",
    columns=(("id", LogicalType.INT64), ("seq", LogicalType.INT64), ("v", LogicalType.STRING)),
)
SCHEMA_JSON = (
    '{"columns":[["id","int64"],["seq","int64"],["v","string"]],"deleted":"gone",'
    '"key":["id"],"order":"seq","version":1}'
)
OPTION_NAMES = {"ingest.schema", "ingest.order_scope", "ingest.buckets"}


def _value() -> ShardIngestConfig:
    return ShardIngestConfig(
        options=ShardOptions(SCHEMA, OrderScope.GLOBAL, 2),
        checkpoint_upper=7,
        checkpoint_refs={1: "shard/ck/0001-a.arrow", 0: ""},
        checkpoint_bases={1: "3:10:100:2048"},
        live_rows=42,
        commit_nonce="n7",
        history={7: "n7", 6: "n6"},
    )


# --- names and formats ----------------------------------------------------------------


def test_entries_are_the_legacy_names_and_formats() -> None:
    assert SCHEMA.to_json() == SCHEMA_JSON
    assert list(_value().entries().items()) == [
        ("ingest.schema", SCHEMA_JSON),
        ("ingest.order_scope", "global"),
        ("ingest.buckets", "2"),
        ("blobref.checkpoint.1", "shard/ck/0001-a.arrow"),
        ("checkpoint.base.1", "3:10:100:2048"),
        ("blobref.checkpoint.0", ""),
        ("checkpoint.upper", "7"),
        ("stats.live_rows", "42"),
        ("ingest.commit", "n7"),
        ("ingest.history", '{"6": "n6", "7": "n7"}'),
    ]
    # GC finds the checkpoints the state references by the prefix.
    assert all(
        name.startswith(BLOB_REF_PREFIX)
        for name in _value().entries() if name.startswith("blobref.checkpoint.")
    )


def test_unset_fields_write_nothing() -> None:
    assert ShardIngestConfig().entries() == {}
    assert ShardIngestConfig.read({}) == ShardIngestConfig()
    assert ShardIngestConfig(checkpoint_bases={3: "1:0:0:-1"}).entries() == {
        "checkpoint.base.3": "1:0:0:-1"
    }


def test_round_trip_example() -> None:
    value = _value()
    assert ShardIngestConfig.read(value.entries()) == value
    assert ShardIngestConfig.read(value.entries()).entries() == value.entries()


# --- property: read(entries(v)) == v --------------------------------------------------

_names = st.text(min_size=1, max_size=8)
_schemas = st.builds(
    lambda names, n_key, columns: SourceSchema(
        key=tuple(names[:n_key]), order=names[n_key], deleted=names[n_key + 1],
        columns=tuple(columns),
    ),
    st.lists(_names, min_size=4, max_size=6, unique=True),
    st.integers(1, 2),
    st.lists(st.tuples(_names, st.sampled_from(list(LogicalType))), max_size=4),
)
_options = st.none() | st.builds(
    ShardOptions, _schemas, st.sampled_from(list(OrderScope)), st.integers(1, MAX_BUCKETS)
)
_counts = st.none() | st.integers(0, 2**63)
_per_bucket = st.dictionaries(st.integers(0, MAX_BUCKETS - 1), st.text(max_size=30), max_size=6)
_configs = st.builds(
    ShardIngestConfig,
    options=_options,
    checkpoint_upper=_counts,
    checkpoint_refs=_per_bucket,
    checkpoint_bases=_per_bucket,
    live_rows=_counts,
    commit_nonce=st.none() | st.text(max_size=32),
    history=st.dictionaries(st.integers(-(2**40), 2**40), st.text(max_size=32), max_size=20),
)


@settings(max_examples=300, deadline=None)
@given(_configs)
def test_read_of_entries_is_the_value(value: ShardIngestConfig) -> None:
    entries = value.entries()
    back = ShardIngestConfig.read(entries)
    assert back == value
    assert back.entries() == entries


_any_names = st.sampled_from([
    "ingest.history", "ingest.commit", "checkpoint.upper", "stats.live_rows",
    "blobref.checkpoint.1", "checkpoint.base.0", "blobref.checkpoint.01", "checkpoint.base.x",
]) | st.text(max_size=24)
_any_values = st.sampled_from(["", "0", "-1", "{}", '{"1": 2}', "[]", "\u00b2"]) | st.text(
    max_size=24
)


@settings(max_examples=300, deadline=None)
@given(_configs, st.dictionaries(_any_names, _any_values, max_size=8))
def test_entries_the_ingest_does_not_own_are_ignored(
    value: ShardIngestConfig, others: dict[str, str]
) -> None:
    """Other entries in the config (anything not named like an ingest entry) change
    nothing read; and whatever they hold, reading them alone never raises."""
    owned = ("ingest.", "checkpoint.", "blobref.checkpoint.", "stats.live_rows")
    foreign = {k: v for k, v in others.items() if not k.startswith(owned)}
    assert ShardIngestConfig.read({**foreign, **value.entries()}) == value
    ShardIngestConfig.read({k: v for k, v in others.items() if k not in OPTION_NAMES})


# --- tolerance: exactly the ingest's ------------------------------------------------------


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '{"a": "x"}', '{"1": "x"', '"s"', ""])
def test_malformed_history_reads_as_empty(text: str) -> None:
    assert ShardIngestConfig.read({"ingest.history": text}).history == {}
    assert pipeline.commit_history({"ingest.history": text}) == {}


def test_history_reads_as_the_ingest_read_it() -> None:
    read = ShardIngestConfig.read({"ingest.history": '{"3": "c", "1": 5}'})
    assert read.history == {3: "c", 1: "5"}


@pytest.mark.parametrize(("text", "rows"), [
    ("12", 12), ("007", 7), ("", None), ("-1", None), ("1.5", None), (" 3", None),
    ("x", None), ("\u00b2", None),
])
def test_live_rows_not_all_digits_read_as_none(text: str, rows: int | None) -> None:
    # "007" was always read as 7. A superscript passed ``str.isdigit`` but made int()
    # raise ValueError; it now reads as None like any other count that is not one.
    assert ShardIngestConfig.read({"stats.live_rows": text}).live_rows == rows
    assert pipeline.live_rows({"stats.live_rows": text}) == rows


@pytest.mark.parametrize("text", ["", "x", "-1", "07", " 7", "7.0", "\u0667"])
def test_a_checkpoint_upper_that_is_not_a_decimal_is_current_at_no_upper(text: str) -> None:
    """The ingest compared the entry with ``str(upper)``: only ``str(n)`` matches."""
    read = ShardIngestConfig.read({"checkpoint.upper": text})
    assert read.checkpoint_upper is None
    assert not read.checkpoints_current(7)
    assert read.checkpoints_current(0)  # an empty shard has nothing to describe
    assert ShardIngestConfig.read({"checkpoint.upper": "7"}).checkpoints_current(7)
    assert not ShardIngestConfig.read({"checkpoint.upper": "7"}).checkpoints_current(8)


def test_only_buckets_a_reader_looked_up_are_read() -> None:
    config = {
        "blobref.checkpoint.2": "a", "blobref.checkpoint.02": "b", "blobref.checkpoint.x": "c",
        "blobref.checkpoint.": "d", "blobref.other": "e", "checkpoint.base.1": "1:0:0:-1",
        "checkpoint.base.-1": "f", "checkpoint.base.": "g",
    }
    read = ShardIngestConfig.read(config)
    assert read.checkpoint_refs == {2: "a"}
    assert read.checkpoint_bases == {1: "1:0:0:-1"}


def test_no_schema_means_no_options_whatever_else_is_stored() -> None:
    read = ShardIngestConfig.read({"ingest.order_scope": "bad", "ingest.buckets": "bad"})
    assert read.options is None and read.schema is None


def test_missing_scope_and_bucket_count_read_as_the_defaults() -> None:
    options = ShardIngestConfig.read({"ingest.schema": SCHEMA_JSON}).options
    assert options == ShardOptions(SCHEMA, OrderScope.BATCH, 4)
    spaced = ShardIngestConfig.read(
        {"ingest.schema": SCHEMA_JSON, "ingest.order_scope": " Global "}
    )
    assert spaced.options is not None and spaced.options.order_scope is OrderScope.GLOBAL


@pytest.mark.parametrize(("entries", "message"), [
    ({"ingest.buckets": "four"}, "malformed stored bucket count: invalid literal"),
    ({"ingest.buckets": ""}, "malformed stored bucket count: "),
    ({"ingest.buckets": "0"}, r"the bucket count must be an integer in \[1, 4096\], got 0"),
    ({"ingest.buckets": "4097"}, "the bucket count must be an integer"),
    ({"ingest.order_scope": "sideways"}, "--order-scope must be 'batch' or 'global'"),
    ({"ingest.schema": "{"}, "malformed stored source schema"),
    ({"ingest.schema": '{"version": 99}'}, "unsupported source schema version 99"),
])
def test_malformed_stored_options_raise_config_error(
    entries: dict[str, str], message: str
) -> None:
    config = {"ingest.schema": SCHEMA_JSON, **entries}
    with pytest.raises(ConfigError, match=message):
        ShardIngestConfig.read(config)
    with pytest.raises(ConfigError, match=message):
        resolve_options(config, IngestRequest())


def test_resolve_options_takes_the_value_or_the_entries_alike() -> None:
    config = _value().entries()
    stored = ShardIngestConfig.read(config)
    assert resolve_options(stored, IngestRequest()) == resolve_options(config, IngestRequest())
    assert resolve_options(stored, IngestRequest()) == stored.options
    for given_config in (config, stored):
        with pytest.raises(ConfigError, match=r"--buckets 3 \(shard has 2\)"):
            resolve_options(given_config, IngestRequest(buckets=3))


# --- real shards ------------------------------------------------------------------------


def _landing(root: Path, files: int, first: int = 0) -> Path:
    """``files`` JSONL files; file 5 on adds a column (the schema evolves), every third
    file deletes a key."""
    root.mkdir(exist_ok=True)
    for i in range(first, first + files):
        rows: list[dict[str, object]] = [
            {"key": (i * 7 + j) % 40, "offset": i, "v": f"{i}.{j}",
             **({"w": i} if i >= 5 else {})}
            for j in range(12)
        ]
        if i % 3 == 2:
            rows.append({"key": i % 40, "offset": i, "__deleted": True})
        write_jsonl(root, f"{i:03d}.jsonl", rows)
    return root


OWNED = ("ingest.", "checkpoint.", "blobref.checkpoint.", "blobref.tombstones.", "stats.live_rows")


def _owned(config: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in config.items() if k.startswith(OWNED)}


@pytest.mark.parametrize("scope", ["batch", "global"])
def test_reading_a_real_shard_after_an_ingest(tmp_path: Path, scope: str) -> None:
    shard = memory_shard()
    ingest(shard, str(_landing(tmp_path / "in", 7)), IngestRequest(order_scope=scope, buckets=3))
    state = shard.state()
    read = ShardIngestConfig.read(state.config)
    assert read.options == ShardOptions(
        SourceSchema.from_json(state.config["ingest.schema"]), OrderScope(scope), 3
    )
    assert read.schema is not None and "w" in read.schema.names  # the evolved schema
    assert read.options == resolve_options(state.config, IngestRequest())
    assert read.checkpoint_upper == state.upper == 7 and read.checkpoints_current(state.upper)
    assert set(read.checkpoint_refs) == {0, 1, 2} and all(read.checkpoint_refs.values())
    if scope == "batch":
        assert set(read.checkpoint_bases) == {0, 1, 2}
        assert read.tombstone_refs == {}
    else:
        assert set(read.tombstone_refs) == {0, 1, 2}
    assert read.live_rows == sum(snapshot_rows(shard, state.upper - 1).values())
    assert read.history == {u: read.history[u] for u in range(1, 8)}
    assert read.commit_nonce == read.history[7]
    # Reading loses no entry the ingest keeps, and writes each back byte for byte.
    assert read.entries() == _owned(state.config)


def _legacy_plan(state: ShardState, buckets: int) -> dict[str, object]:
    """What ``plan_file`` took from the config before ``ShardIngestConfig``."""
    config = state.config
    try:
        raw = json.loads(config.get("ingest.history", "{}"))
        history = {int(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
    except (ValueError, TypeError, AttributeError):
        history = {}
    return {
        "checkpoints": {b: config.get(f"blobref.checkpoint.{b}", "") for b in range(buckets)},
        "checkpoints_current": (
            state.upper == 0 or config.get("checkpoint.upper") == str(state.upper)
        ),
        "bases": {b: config[f"checkpoint.base.{b}"] for b in range(buckets)
                  if f"checkpoint.base.{b}" in config},
        "history": history,
    }


def _legacy_updates(task: FileTask, options: ShardOptions, outcome: FileOutcome
                    ) -> dict[str, str]:
    """The config updates ``_commit_request`` built by hand before ``ShardIngestConfig``
    (names spelled out: the format existing shards hold)."""
    config = {
        "ingest.schema": options.schema.to_json(),
        "ingest.order_scope": options.order_scope.value,
        "ingest.buckets": str(options.buckets),
    }
    if outcome.read.schema_json is not None:
        config["ingest.schema"] = outcome.read.schema_json
    for result in outcome.buckets:
        config[f"blobref.checkpoint.{result.bucket}"] = result.checkpoint or ""
        if result.base is not None:
            config[f"checkpoint.base.{result.bucket}"] = result.base
    # Since tombstone sets (global scope): every bucket's on the first commit, then the
    # buckets that wrote one.
    tombstones: dict[int, str] = {}
    if task.ts == 0 and options.order_scope.value == "global":
        tombstones = {b: "" for b in range(options.buckets)}
    tombstones.update({r.bucket: r.tombstones for r in outcome.buckets
                       if r.tombstones is not None})
    for bucket, ref in tombstones.items():
        config[f"blobref.tombstones.{bucket}"] = ref
    config["checkpoint.upper"] = str(task.ts + 1)
    assert task.shard_state is not None
    text = task.shard_state.config.get("stats.live_rows", "")
    # Since the count follows only ingest commits: a count recorded for another upper
    # (a commit outside the ingest came between) is not carried forward, and the
    # commit records the count as unknown.
    current = task.shard_state.config.get("checkpoint.upper") == str(task.ts)
    before = 0 if task.ts == 0 else (int(text) if text.isdigit() and current else None)
    rebuilt = [b.live_after for b in outcome.buckets]
    if before is not None:
        live = before + sum(b.inserts - b.retractions for b in outcome.buckets)
        config["stats.live_rows"] = str(live)
    elif len(rebuilt) == options.buckets and None not in rebuilt:
        config["stats.live_rows"] = str(sum(n or 0 for n in rebuilt))  # all rebuilt
    else:
        config["stats.live_rows"] = "unknown"
    config["ingest.commit"] = task.commit_nonce
    history = {**task.history, task.ts + 1: task.commit_nonce}
    recent = sorted(history)[-16:]
    config["ingest.history"] = json.dumps({str(u): history[u] for u in recent})
    return config


def _append_outside_the_ingest(shard: Shard, updates: dict[str, str]) -> None:
    """An empty batch with ``updates``, appended by something other than the ingest."""
    table = pa.Table.from_pylist([], schema=UPDATE_SCHEMA)
    assert shard.append(table, shard.state().upper, config_updates=updates).committed


@pytest.mark.parametrize("scope", ["batch", "global"])
def test_commits_write_what_the_ingest_always_wrote(
    tmp_path: Path, scope: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every commit's config updates equal the legacy hand-built ones, in order (the
    state diff lists them in that order), and every plan reads what the legacy plan
    read: over schema evolution, a history longer than it keeps, checkpoints made stale
    by another writer and a live-row count that stopped being kept."""
    commits: list[AppendRequest] = []
    real_commit, real_plan = pipeline._commit_request, pipeline.plan_file

    def commit(task: FileTask, options: ShardOptions, outcome: FileOutcome) -> AppendRequest:
        request = real_commit(task, options, outcome)
        legacy = _legacy_updates(task, options, outcome)
        assert list(request.config_updates.items()) == list(legacy.items())
        commits.append(request)
        return request

    def plan(state: ShardState, options: ShardOptions, *args: object, **kwargs: object
             ) -> FileTask:
        task = real_plan(state, options, *args, **kwargs)  # type: ignore[arg-type]
        legacy = _legacy_plan(state, options.buckets)
        assert {name: getattr(task, name) for name in legacy} == legacy
        return task

    monkeypatch.setattr(pipeline, "_commit_request", commit)
    monkeypatch.setattr(pipeline, "plan_file", plan)
    shard = memory_shard()
    request = IngestRequest(order_scope=scope, buckets=2)
    landing = tmp_path / "in"
    ingest(shard, str(_landing(landing, HISTORY_LENGTH + 2)), request)
    assert len(ShardIngestConfig.read(shard.state().config).history) == HISTORY_LENGTH
    _append_outside_the_ingest(shard, {"checkpoint.upper": "stale"})
    ingest(shard, str(_landing(landing, 1, HISTORY_LENGTH + 2)), request)
    _append_outside_the_ingest(shard, {"stats.live_rows": "unknown"})
    ingest(shard, str(_landing(landing, 2, HISTORY_LENGTH + 3)), request)
    assert len(commits) == HISTORY_LENGTH + 5
    # After an outside commit every bucket is rebuilt, and the count with them.
    assert ShardIngestConfig.read(shard.state().config).live_rows_at(
        shard.state().upper) == sum(snapshot_rows(shard, shard.state().upper - 1).values())
