"""A model-based random driver: generated histories of landing files, ingests and GC,
run against a real shard and :class:`tests.model.UpsertModel` side by side.

A *history* is a key type, an order scope, a bucket count and a list of steps:

- ``("files", [LandingFile, ...])``: write those files (JSON Lines, CSV or Parquet) and
  run one ingest, on ingesting process 0 or 1 (each with its own state cache), writing
  parts of format 1 (encoded rows), 2 (rows and values) or 3 (values only; a shard may
  hold all three);
- ``("gc", None)``: ``gc`` (rollup, compaction, blob deletion; all history kept);
- ``("gc", N)``: ``gc --retain N``;
- ``("lose", None)``: an empty batch committed by a plain append that drops every
  checkpoint reference, so the next ingest rebuilds every bucket from the shard (in the global
  scope with the recorded tombstones: no rebuild forgets one);
- ``("rebucket", N)``: ``upsertctl rebucket --buckets N`` (only when asked for:
  ``histories(rebucket_one_in=...)``), up or down; later ingests name the new count.

Rows mix inserts, updates, deletes, in-batch duplicates, order ties, late rows (small
order range), a value column added part-way, floats that compare as numbers (``-0.0``
and ``0.0``, NaN), integers a float column holds exactly or not, and row errors where
the format allows them: a boolean in a numeric or string column, a float in an integer
column, a string in a numeric column, a null key or order, a bad delete marker, a JSON
line that does not parse (NaN is no JSON). The model applies the good rows and expects
exactly the bad ones in the error collection (by file and row number).

After each ingest, and at the end, :func:`check_against_model` compares every readable
time's snapshot (through ``ShardTable``, typed when the parts allow, and through the
shard's merged read), the changes of every time after since, the error collection,
``check`` and, at the end, that GC left no unreferenced blob.
"""

from __future__ import annotations

import csv
import io
import json
import math
import tempfile
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import strategies as st

from tests.model import UpsertModel, canonical
from upsert_core.errors import WriterFenced
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.engine import Engine, InProcessEngine
from upsert_core.ingest.rebucket import rebucket
from upsert_core.ingest.shard_config import CHECKPOINT_REF_PREFIX
from upsert_core.ingest.verify import compare_state
from upsert_core.landing import decode_row
from upsert_core.persist.shard import Shard
from upsert_core.persist.state.state import HollowBatch
from upsert_core.persist.testing import unreferenced_blobs
from upsert_core.persist.write.append import AppendRequest
from upsert_core.shard_table import ShardTable

from .helpers import schema_of

NAN = "NaN"
"""The model's stand-in for every NaN (NaN != NaN in Python; the contract says every NaN
is one value)."""

FORMATS = ("jsonl", "csv", "parquet")
ROW_COLUMNS = ("key", "offset", "f", "n", "s", "x")


@dataclass(frozen=True)
class Cell:
    """One value as the file holds it (``raw``: JSON value, CSV text or Parquet value)
    and as the model sees it (``value``); ``bad`` when the row must be an error row."""

    raw: object
    value: object
    bad: bool = False


@dataclass(frozen=True)
class LandingFile:
    name: str
    fmt: str
    rows: tuple[dict[str, Cell], ...]
    """Each row's cells by column; a column absent from a row is left out (JSON Lines)
    or null (CSV, Parquet). ``__deleted`` holds the delete marker."""


@dataclass
class History:
    key_type: str  # "int" or "float"
    scope: str
    buckets: int
    inline: bool = True
    """Small parts may be inlined in the consensus state (the default); else every part
    is a blob."""
    steps: list[tuple[str, Any]] = field(default_factory=list)


# --- generating -----------------------------------------------------------------------


def _good_key(key_type: str, fmt: str) -> st.SearchStrategy[Cell]:
    if key_type == "int":
        ints = st.integers(0, 5)
        return ints.map(lambda k: Cell(str(k) if fmt == "csv" else k, k))
    floats = st.sampled_from([0.0, -0.0, 1.5, 2.0, -3.25, 1e300])
    # JSON may give an integer for a float key (it converts exactly): 2 is key 2.0.
    if fmt == "jsonl":
        floats = st.one_of(floats, st.just(2))
    return floats.map(lambda k: Cell(_text(k) if fmt == "csv" else k, float(k)))


def _bad_key(key_type: str, fmt: str) -> st.SearchStrategy[Cell]:
    choices: list[object]
    if fmt == "jsonl":
        choices = [True, False, "1"] + ([1.5] if key_type == "int" else [])
    elif fmt == "csv":
        choices = ["true", "x"] + (["1.5"] if key_type == "int" else [])
    else:
        return st.nothing()
    return st.sampled_from(choices).map(lambda raw: Cell(raw, None, bad=True))


def _text(value: object) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else repr(value)
    return str(value)


def _float_cell(fmt: str) -> st.SearchStrategy[Cell]:
    good: list[tuple[object, object]] = [
        (None, None), (0.0, 0.0), (-0.0, -0.0), (1.5, 1.5), (1e-300, 1e-300), (2**53, 2.0**53),
    ]
    bad: list[object] = []
    if fmt == "jsonl":
        bad = [True, False, "1.5", 2**53 + 1, math.nan]  # NaN: a line JSON cannot parse
    elif fmt == "csv":
        good.append(("nan", NAN))
        bad = ["true", "FALSE", "one", str(2**53 + 1)]
    else:
        good.append((math.nan, NAN))
    cells = [Cell(_text(r) if fmt == "csv" and r is not None and not isinstance(r, str) else r,
                  v) for r, v in good]
    return _mix(cells, [Cell(b, None, bad=True) for b in bad])


def _int_cell(fmt: str) -> st.SearchStrategy[Cell]:
    good = [None, 0, 1, -7, 2**62]
    bad: list[object] = []
    if fmt == "jsonl":
        bad = [True, 1.5, 1.0, "7"]
    elif fmt == "csv":
        bad = ["false", "1.5", "abc"]
    cells = [Cell(str(g) if fmt == "csv" and g is not None else g, g) for g in good]
    return _mix(cells, [Cell(b, None, bad=True) for b in bad])


def _str_cell(fmt: str) -> st.SearchStrategy[Cell]:
    good = [None, "a", "b", "ü", "x,y", 'q"q', "1.5"]
    bad: list[object] = [True, 1.5] if fmt == "jsonl" else []
    return _mix([Cell(g, g) for g in good], [Cell(b, None, bad=True) for b in bad])


def _extra_cell(fmt: str) -> st.SearchStrategy[Cell]:
    # Never text a CSV reader would infer as another type when a CSV file adds it.
    return st.sampled_from([None, "x1", "x2", "x3"]).map(lambda v: Cell(v, v))


def _marker_cell(fmt: str) -> st.SearchStrategy[Cell]:
    if fmt == "jsonl":
        good = [(None, False), (False, False), (True, True), ("TRUE", True), ("false", False)]
        bad: list[object] = [1, "yes"]
    elif fmt == "csv":
        good = [(None, False), ("false", False), ("true", True), ("True", True)]
        bad = ["yes"]
    else:
        good = [(None, False), (False, False), (True, True)]
        bad = []
    return _mix([Cell(r, v) for r, v in good], [Cell(b, None, bad=True) for b in bad])


def _mix(good: list[Cell], bad: list[Cell]) -> st.SearchStrategy[Cell]:
    return _rarely(st.sampled_from(good), st.sampled_from(bad) if bad else None)


@st.composite
def _rarely_drawn(draw: st.DrawFn, common: st.SearchStrategy[Cell],
                  rare: st.SearchStrategy[Cell]) -> Cell:
    return draw(rare if draw(st.integers(0, 11)) == 0 else common)


def _rarely(common: st.SearchStrategy[Cell],
            rare: st.SearchStrategy[Cell] | None) -> st.SearchStrategy[Cell]:
    """``common``, or about one time in twelve ``rare`` (bad cells), so that most rows of
    a file are applied while every cell can still be an error."""
    return common if rare is None else _rarely_drawn(common, rare)


@st.composite
def _row(draw: st.DrawFn, key_type: str, fmt: str, with_extra: bool) -> dict[str, Cell]:
    row: dict[str, Cell] = {}
    null = st.just(Cell(None, None, bad=True))
    row["key"] = draw(_rarely(_good_key(key_type, fmt), st.one_of(_bad_key(key_type, fmt), null)))
    offsets = st.integers(0, 9).map(lambda o: Cell(str(o) if fmt == "csv" else o, o))
    row["offset"] = draw(_rarely(offsets, null))
    for name, cell in (("f", _float_cell), ("n", _int_cell), ("s", _str_cell)):
        if draw(st.integers(0, 3)) or fmt != "jsonl":  # JSON Lines may leave a column out
            row[name] = draw(cell(fmt))
    if with_extra:
        row["x"] = draw(_extra_cell(fmt))
    row["__deleted"] = draw(_marker_cell(fmt))
    return row


def _repair(rows: list[dict[str, Cell]], fmt: str) -> list[dict[str, Cell]]:
    """In a file whose column holds bad values, at least one value of that column must
    convert, or the file's own type for it would be a file-level error (type change).
    Rows that would leave a column bad-only get a good row appended."""
    if fmt == "parquet":
        return rows
    out = list(rows)
    for column in ("key", "f", "n", "s"):
        cells = [r[column] for r in out if column in r and r[column].raw is not None]
        if cells and all(c.bad for c in cells):
            good = {"key": Cell("0" if fmt == "csv" else 0, 0), "f": Cell("1.5" if fmt == "csv"
                    else 1.5, 1.5), "n": Cell("1" if fmt == "csv" else 1, 1),
                    "s": Cell("a", "a")}[column]
            offset = Cell("0" if fmt == "csv" else 0, 0)
            marker = Cell(None, False)
            extra = {"key": good} if column == "key" else {"key": Cell("0" if fmt == "csv"
                                                                         else 0, 0), column: good}
            out.append({**extra, "offset": offset, "__deleted": marker})
    return out


def _float_key_fixup(rows: list[dict[str, Cell]], key_type: str) -> list[dict[str, Cell]]:
    if key_type != "float":
        return rows
    return [{**r, "key": Cell(r["key"].raw, float(r["key"].value))}
            if not r["key"].bad and isinstance(r["key"].value, int) else r for r in rows]


@st.composite
def histories(draw: st.DrawFn, *, max_steps: int = 7, formats: Sequence[str] = FORMATS,
              buckets: Sequence[int] = (1, 2, 4, 64),
              scopes: Sequence[str] = ("batch", "global"), lose_one_in: int = 6,
              rebucket_one_in: int = 0, rebucket_to: Sequence[int] = (1, 2, 3, 4, 8, 16),
              ) -> History:
    key_type = draw(st.sampled_from(["int", "float"]))
    history = History(key_type, draw(st.sampled_from(list(scopes))),
                      draw(st.sampled_from(list(buckets))), draw(st.booleans()))
    files = 0
    extra_from = draw(st.integers(1, max_steps))
    # The first file is Parquet and its first row gives every column a value, so every
    # column's type is fixed before a JSON Lines or CSV file could infer another.
    key = draw(_good_key(key_type, "parquet"))
    first = [{"key": key, "offset": Cell(0, 0), "f": Cell(1.5, 1.5), "n": Cell(1, 1),
              "s": Cell("a", "a"), "__deleted": Cell(False, False)}]
    first += draw(st.lists(_row(key_type, "parquet", False), max_size=4))
    history.steps.append(("files", ([LandingFile("f0000.parquet", "parquet", tuple(first))],
                                    0, draw(st.sampled_from([1, 2, 3])))))
    files = 1
    for i in range(1, draw(st.integers(1, max_steps)) + 1):
        if rebucket_one_in and draw(st.integers(1, rebucket_one_in)) == 1:
            history.steps.append(("rebucket", draw(st.sampled_from(list(rebucket_to)))))
            continue
        if draw(st.integers(0, 3)) == 0:
            history.steps.append(("gc", draw(st.sampled_from([None, 1, 2, 3]))))
            continue
        if draw(st.integers(1, lose_one_in)) == 1:
            # Every checkpoint is lost and made stale: the next ingest rebuilds every
            # bucket from the shard, which must remember the tombstones (CONTRACT).
            history.steps.append(("lose", None))
            continue
        batch: list[LandingFile] = []
        for _ in range(draw(st.integers(1, 2))):
            fmt = draw(st.sampled_from(list(formats)))
            rows = draw(st.lists(_row(key_type, fmt, i >= extra_from), max_size=6))
            rows = _float_key_fixup(_repair(rows, fmt), key_type)
            batch.append(LandingFile(f"f{files:04d}.{fmt}", fmt, tuple(rows)))
            files += 1
        history.steps.append(("files", (batch, draw(st.integers(0, 1)),
                                        draw(st.sampled_from([1, 2, 3])))))
    return history


def _is_bad(row: dict[str, Cell]) -> bool:
    return any(c.bad for c in row.values())


# --- writing files ----------------------------------------------------------------------


PARQUET_TYPES = {"key": None, "offset": pa.int64(), "f": pa.float64(), "n": pa.int64(),
                 "s": pa.string(), "x": pa.string(), "__deleted": pa.bool_()}


def write_file(root: Path, file: LandingFile, key_type: str) -> None:
    path = root / file.name
    columns = [c for c in ROW_COLUMNS + ("__deleted",) if any(c in r for r in file.rows)]
    if file.fmt == "jsonl":
        lines = []
        for r in file.rows:
            obj = {c: cell.raw for c, cell in r.items()}
            lines.append(json.dumps(obj))  # a NaN makes a line strict JSON refuses
        path.write_text("".join(line + "\n" for line in lines))
    elif file.fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        header = columns or list(ROW_COLUMNS[:2])
        writer.writerow(header)
        for r in file.rows:
            writer.writerow(["" if r.get(c) is None or r[c].raw is None else r[c].raw
                             for c in header])
        path.write_text(out.getvalue())
    else:
        types = dict(PARQUET_TYPES, key=pa.int64() if key_type == "int" else pa.float64())
        names = [c for c in types if c != "x" or "x" in columns]
        table = pa.table({c: pa.array([r[c].raw if c in r else None for r in file.rows],
                                      type=types[c]) for c in names})
        sink = io.BytesIO()
        pq.write_table(table, sink)
        path.write_bytes(sink.getvalue())


# --- the model's view -------------------------------------------------------------------


def _model_value(value: object) -> object:
    return NAN if isinstance(value, float) and math.isnan(value) else value


def model_rows(file: LandingFile) -> tuple[list[dict[str, Any]], list[int]]:
    """The rows the model applies (good rows, as dicts in file order, each with its row
    number kept by position) and the row numbers that must be error rows."""
    applied: list[dict[str, Any]] = []
    errors: list[int] = []
    for number, r in enumerate(file.rows, start=1):
        if _is_bad(r):
            errors.append(number)
            continue
        applied.append({c: _model_value(cell.value) for c, cell in r.items()})
    return applied, errors


def normalized(row: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return canonical({c: _model_value(v) for c, v in row.items()})


# --- running and checking ---------------------------------------------------------------


ShardFactory = Callable[[], Shard]


def run_history(
    history: History, make_shard: ShardFactory, engines: Sequence[Engine] | None = None,
    *, check_every_step: bool = True,
) -> None:
    shard = make_shard()
    model = UpsertModel(history.scope)
    expected_errors: set[tuple[str, int]] = set()
    engines = list(engines) if engines is not None else [
        InProcessEngine(cache="new"), InProcessEngine(cache="new")]
    buckets = history.buckets
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for kind, arg in history.steps:
            if kind == "gc":
                shard.gc(retain=arg, leak_grace_ms=0)
                continue
            if kind == "rebucket":
                if rebucket(shard, arg).changed:  # (the count it had: nothing to see)
                    # Checkpoints current, tombstone sets, part labels of the new count.
                    comparison = compare_state(shard)
                    assert comparison.ok and comparison.buckets == arg, comparison.problems
                buckets = arg
                if check_every_step:
                    check_against_model(shard, model, expected_errors)
                continue
            if kind == "lose":
                lose_checkpoints(shard)
                model.apply([])
                continue
            batch, process, part_format = arg
            for file in batch:
                write_file(root, file, history.key_type)
                applied, errors = model_rows(file)
                model.apply(applied)
                expected_errors |= {(file.name, n) for n in errors}
            request = IngestRequest(order_scope=history.scope, buckets=buckets,
                                    typed_parts=part_format >= 2,
                                    values_only=part_format == 3,
                                    **({} if history.inline else {"inline_threshold": 0}))
            ingest(shard, str(root), request, engine=engines[process % len(engines)])
            if check_every_step:
                check_against_model(shard, model, expected_errors)
    check_against_model(shard, model, expected_errors)
    shard.gc(leak_grace_ms=0)
    check_against_model(shard, model, expected_errors)
    assert unreferenced_blobs(shard) == set()


def lose_checkpoints(shard: Shard) -> None:
    """Commit an empty batch (a commit no ingest made) that drops every checkpoint
    reference, so no checkpoint is current and the next ingest rebuilds every bucket
    from the shard (GC then deletes the checkpoints: older states still reference them)."""
    state = shard.state()
    lost = {n: v for n, v in state.config.items() if n.startswith(CHECKPOINT_REF_PREFIX) and v}
    upper = state.upper
    request = AppendRequest(
        HollowBatch(upper, upper + 1, 0, ()), upper, config_updates={n: "" for n in lost}
    )
    try:
        result = shard.compare_and_append(request)
    except WriterFenced:  # a rebucket fenced the handle's writer: the next one registers
        result = shard.compare_and_append(request)
    assert result.committed


def check_against_model(shard: Shard, model: UpsertModel,
                        expected_errors: set[tuple[str, int]]) -> None:
    state = shard.state()
    assert state.upper == model.upper
    table = ShardTable(shard)
    schema = schema_of(shard) if state.upper else None
    for ts in range(state.since, state.upper):
        want = _model_bag(model.rows(ts))
        typed = Counter(normalized(r) for r in table.snapshot(as_of=ts).to_pylist())
        assert typed == want, f"ShardTable snapshot at {ts}"
        merged: Counter[Hashable] = Counter()
        assert schema is not None
        for batch in shard.snapshot(ts):
            for row, diff in zip(batch.column("row").to_pylist(),
                                 batch.column("diff").to_pylist(), strict=True):
                merged[normalized(decode_row(schema, row))] += diff
        assert merged == want, f"merged snapshot at {ts}"
        if ts > state.since or ts == 0:
            got = table.changes(since=ts, until=ts + 1)
            ts_col, diff_col = table.change_columns()
            changes: Counter[Hashable] = Counter()
            for row in got.to_pylist():
                assert row.pop(ts_col) == ts
                diff = row.pop(diff_col)
                key = normalized(row)
                assert key not in changes, f"changes at {ts} are not consolidated"
                changes[key] = diff
            assert changes == _model_bag(model.row_changes(ts)), f"changes at {ts}"
    got_errors = sorted((e["file"], e["row"]) for e in shard.errors())
    assert got_errors == sorted(expected_errors), "error rows (each exactly once)"
    report = shard.check()
    assert report.ok, report.problems


def _model_bag(bag: Counter[Hashable]) -> Counter[Hashable]:
    """The model's rows with its values normalised as read values are (ints that a
    float column holds are equal to their floats already)."""
    out: Counter[Hashable] = Counter()
    for row, n in bag.items():
        assert isinstance(row, tuple)
        out[canonical({c: v for c, v in row if c != "__deleted"})] += n
    return out
