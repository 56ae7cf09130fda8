"""Randomized: many generated batches through ``upsertctl`` against a dict model.

Batches mix JSON Lines and Parquet and hold inserts, updates, deletes, in-batch
duplicates, order ties, late (lower-order) data, a column added part-way and row
errors. They arrive in two waves, the second with names sorting before the first's
(late arrivals). The shard is then compared with :class:`tests.model.UpsertModel`: the snapshot as
of every readable ts (via one ``changes`` read, folded in ts order, plus direct
snapshots as of a sample of times) and the changes themselves (consolidated).
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.e2e.helpers import Cli, apply_changes, bag, write_jsonl, write_parquet
from tests.model import UpsertModel

N_BATCHES = 14
KEYS = 12


def _batch(rnd: random.Random, i: int, with_extra: bool) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for _ in range(rnd.randint(0, 9)):
        row: dict[str, Any] = {
            "key": rnd.randrange(KEYS),
            "offset": rnd.randrange(30),  # small range: ties and late data are common
            "v": rnd.choice([None, "a", "b", "c", f"s{i}"]),
            "__deleted": rnd.random() < 0.2,
        }
        if with_extra and rnd.random() < 0.7:
            row["extra"] = rnd.randrange(3)
        rows.append(row)
    return rows


def _write(root: Path, name: str, rows: list[dict[str, Any]], bad: bool, rnd: random.Random
           ) -> None:
    if name.endswith(".parquet"):
        schema = pa.schema([("key", pa.int64()), ("offset", pa.int64()), ("v", pa.string()),
                            ("__deleted", pa.bool_()), ("extra", pa.int64())])
        write_parquet(root, name, pa.Table.from_pylist(rows, schema=schema))
        return
    lines: list[object] = list(rows)
    if bad:
        lines.insert(rnd.randint(0, len(lines)), {"key": None, "offset": 1})
    write_jsonl(root, name, lines)


@pytest.mark.parametrize(("scope", "seed"), [("batch", 1), ("global", 2)])
def test_random_batches_match_the_model(cli: Cli, landing: Path, scope: str, seed: int) -> None:
    rnd = random.Random(seed)
    names = []
    half = N_BATCHES // 2
    for i in range(N_BATCHES):
        # Wave 1 is named z-*, wave 2 a-*: the second wave sorts before the first.
        prefix = "z" if i < half else "a"
        suffix = ".parquet" if rnd.random() < 0.3 else ".jsonl"
        names.append(f"{prefix}-{i:03d}{suffix}")
    batches = [_batch(rnd, i, with_extra=i >= 3) for i in range(N_BATCHES)]
    bad = [n.endswith(".jsonl") and rnd.random() < 0.3 for n in names]
    for i in range(half):
        _write(landing, names[i], batches[i], bad[i], rnd)
    cli.ingest(landing, "--order-scope", scope)
    for i in range(half, N_BATCHES):
        _write(landing, names[i], batches[i], bad[i], rnd)
    cli.ingest(landing)

    # The model applies files in the order the shard must have: wave by wave, by name.
    order = sorted(range(half), key=lambda i: names[i]) + sorted(
        range(half, N_BATCHES), key=lambda i: names[i]
    )
    model = UpsertModel(scope)
    for i in order:
        model.apply(batches[i])
    info = cli.inspect()
    assert info["upper"] == N_BATCHES
    assert info["ingested_files"] == {names[i]: ts for ts, i in enumerate(order)}
    columns = ["key", "offset", "v", "extra"]

    changes = cli.changes()
    seen = Counter((str(sorted(c["row"].items())), c["ts"]) for c in changes)
    assert all(n == 1 for n in seen.values()), "changes are not consolidated"
    assert all(c["diff"] in (1, -1) for c in changes)
    folded: Counter[str] = Counter()
    for ts in range(N_BATCHES):
        folded = apply_changes(folded, changes, ts)
        assert folded == bag(model.records(ts, columns)), f"snapshot at ts {ts} (from changes)"
    for ts in sorted(rnd.sample(range(N_BATCHES - 1), 3)) + [N_BATCHES - 1]:
        assert bag(cli.snapshot(as_of=ts)) == bag(model.records(ts, columns)), f"snapshot at {ts}"
    assert len(cli.errors()) == sum(bad)
    assert cli.check().json()["ok"] is True
