"""The ingest benchmark's workload: an initial load and change batches, as landing files.

Columns of every file: ``key`` (int64), ``offset`` (int64, the order column), ``value``
(string), ``amount`` (float64) and ``__deleted`` (bool, the delete marker).

- The initial load holds keys ``0 .. n_keys - 1`` once each.
- A change batch of ``rows`` rows: 95% distinct keys split 70% updates of live keys,
  20% new keys and 10% deletes of live keys (updates and deletes never share a key),
  plus 5% in-batch duplicates: extra rows for keys already updated or inserted in the
  batch, with an order value just below or just above the original row's (so about
  half of them win). Rows are shuffled, so file order says nothing.
- Offsets are unique across the whole workload, so "the greatest offset wins" has no
  ties and every engine must end with exactly the same snapshot.

Everything is deterministic for a given seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = pa.schema(
    [
        ("key", pa.int64()),
        ("offset", pa.int64()),
        ("value", pa.string()),
        ("amount", pa.float64()),
        ("__deleted", pa.bool_()),
    ]
)
VALUE_COLUMNS = ["key", "value", "amount"]
"""The columns every engine's final snapshot is compared on."""


def _values(keys: np.ndarray, tag: int) -> pa.Array:
    return pa.array([f"v{k}-{tag}" for k in keys.tolist()], pa.string())


@dataclass
class Workload:
    """Generates the initial load and the change batches (see the module docstring)."""

    n_keys: int
    batch_rows: int
    seed: int = 7
    _live: np.ndarray = field(init=False, repr=False)
    _next_key: int = field(init=False)
    _next_offset: int = field(init=False)
    _rng: np.random.Generator = field(init=False, repr=False)
    _batches: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)
        self._live = np.arange(self.n_keys, dtype=np.int64)
        self._next_key = self.n_keys
        self._next_offset = 2 * self.n_keys + 2

    def initial(self) -> pa.Table:
        keys = np.arange(self.n_keys, dtype=np.int64)
        return pa.table(
            [
                pa.array(keys),
                pa.array(keys * 2),
                _values(keys, 0),
                pa.array(keys.astype(np.float64) / 4),
                pa.array(np.zeros(self.n_keys, dtype=bool)),
            ],
            schema=SCHEMA,
        )

    def batch(self) -> pa.Table:
        rng = self._rng
        self._batches += 1
        tag = self._batches
        n_dup = self.batch_rows // 20
        distinct = self.batch_rows - n_dup
        n_upd = distinct * 70 // 100
        n_new = distinct * 20 // 100
        n_del = distinct - n_upd - n_new
        picked = rng.choice(len(self._live), size=n_upd + n_del, replace=False)
        upd = self._live[picked[:n_upd]]
        dels = self._live[picked[n_upd:]]
        new = np.arange(self._next_key, self._next_key + n_new, dtype=np.int64)
        self._next_key += n_new
        keep = np.ones(len(self._live), dtype=bool)
        keep[picked[n_upd:]] = False
        self._live = np.concatenate([self._live[keep], new])

        written = np.concatenate([upd, new])
        keys = np.concatenate([written, dels])
        offsets = self._next_offset + 2 * np.arange(len(keys), dtype=np.int64)
        self._next_offset += 2 * len(keys) + 2
        dup_idx = rng.choice(len(written), size=n_dup, replace=False)
        dup_keys = written[dup_idx]
        dup_offsets = offsets[dup_idx] + rng.choice(np.array([-1, 1]), size=n_dup)

        all_keys = np.concatenate([keys, dup_keys])
        all_offsets = np.concatenate([offsets, dup_offsets])
        deleted = np.zeros(len(all_keys), dtype=bool)
        deleted[len(written) : len(keys)] = True
        value_tag = np.where(np.arange(len(all_keys)) >= len(keys), 1000 + tag, tag)
        values = [
            None if d else f"v{k}-{t}"
            for k, t, d in zip(all_keys.tolist(), value_tag.tolist(), deleted.tolist(), strict=True)
        ]
        amounts = np.where(deleted, np.nan, all_offsets.astype(np.float64) / 8)
        table = pa.table(
            [
                pa.array(all_keys),
                pa.array(all_offsets),
                pa.array(values, pa.string()),
                pa.array(amounts, mask=deleted),
                pa.array(deleted),
            ],
            schema=SCHEMA,
        )
        return table.take(pa.array(rng.permutation(len(all_keys))))


def write_landing(path: Path, table: pa.Table) -> int:
    """Write ``table`` as one Parquet landing file; returns its size in bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path.stat().st_size


def dedup_batch(batch: pa.Table) -> pa.Table:
    """The batch's winning row per key (greatest offset), as every peer applies it."""
    ordered = batch.sort_by([("key", "ascending"), ("offset", "ascending")])
    keys = ordered.column("key").to_numpy()
    last = np.ones(len(keys), dtype=bool)
    if len(keys) > 1:
        last[:-1] = keys[1:] != keys[:-1]
    return ordered.filter(pa.array(last))


def canonical(table: pa.Table) -> pa.Table:
    """The compared columns of a snapshot, sorted by key, in one chunk."""
    out = table.select(VALUE_COLUMNS).sort_by("key").combine_chunks()
    return out.cast(pa.schema([SCHEMA.field(name) for name in VALUE_COLUMNS]))


def write_workload(
    root: Path, n_keys: int, batch_rows: int, batches: int
) -> tuple[Path, list[Path]]:
    """The initial load and ``batches`` change batches as Parquet landing files under
    ``root`` (created), named so that name order is workload order."""
    root.mkdir(parents=True, exist_ok=True)
    workload = Workload(n_keys, batch_rows)
    initial = root / "0000-initial.parquet"
    write_landing(initial, workload.initial())
    paths = []
    for i in range(1, batches + 1):
        path = root / f"{i:04d}-batch.parquet"
        write_landing(path, workload.batch())
        paths.append(path)
    return initial, paths


# --- the "wide" workload (issue 22) ---------------------------------------------------------

WIDE_SCHEMA = pa.schema(
    [
        ("key", pa.int64()),
        ("offset", pa.int64()),
        ("__deleted", pa.bool_()),
        ("v_int", pa.int64()),
        ("v_str", pa.string()),
        ("v_float", pa.float64()),
    ]
)
WIDE_COMPARED = ["key", "offset", "v_int", "v_str", "v_float"]
"""The columns both ends' final snapshots of the wide workload are compared on."""

_ALPHABET = np.frombuffer(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", dtype=np.uint8
)


def _random_strings(rng: np.random.Generator, lengths: np.ndarray, valid: np.ndarray) -> pa.Array:
    """One string per entry of ``lengths`` (random ASCII letters and digits), null where
    ``valid`` is False: built from one byte buffer and its offsets, no Python loop."""
    lengths = np.where(valid, lengths, 0)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise ValueError("string column too large for one int32-offset array")
    data = _ALPHABET[rng.integers(0, len(_ALPHABET), size=int(offsets[-1]), dtype=np.uint8)]
    validity = None if valid.all() else pa.array(valid).buffers()[1]
    return pa.StringArray.from_buffers(
        len(lengths),
        pa.py_buffer(offsets.astype(np.int32)),
        pa.py_buffer(data),
        validity,
        int((~valid).sum()),
    )


@dataclass
class WideWorkload:
    """The wide workload of issue 22: like :class:`Workload`, with random values.

    Columns: ``key`` int64, ``offset`` int64 (the order column), ``__deleted`` bool,
    ``v_int`` int64, ``v_str`` (a random ASCII string of 50-70 characters), ``v_float``
    float64. The initial load holds keys ``0 .. n_keys - 1`` once each (offset = key). A
    change batch of ``batch_rows`` rows: 95% distinct keys split 70% updates of live
    keys, 20% new keys and 10% deletes of live keys (value columns null), plus 5%
    in-batch duplicates of updated or inserted keys with an offset just below or just
    above the original's; shuffled. Offsets are unique across the whole workload (rows
    of a batch get ``base + 4i + 2``, duplicates that plus or minus one), so the greatest
    offset wins without ties. Deterministic for a given seed; numpy only, so 10M rows
    take seconds.
    """

    n_keys: int
    batch_rows: int
    seed: int = 22
    _live: np.ndarray = field(init=False, repr=False)
    _next_key: int = field(init=False)
    _next_offset: int = field(init=False)
    _rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)
        self._live = np.arange(self.n_keys, dtype=np.int64)
        self._next_key = self.n_keys
        self._next_offset = self.n_keys

    def _table(self, keys: np.ndarray, offsets: np.ndarray, deleted: np.ndarray) -> pa.Table:
        rng = self._rng
        n = len(keys)
        valid = ~deleted
        v_int = rng.integers(-(2**62), 2**62, size=n, dtype=np.int64)
        v_float = rng.random(n) * 1e6
        lengths = rng.integers(50, 71, size=n, dtype=np.int64)
        return pa.table(
            [
                pa.array(keys),
                pa.array(offsets),
                pa.array(deleted),
                pa.array(v_int, mask=deleted),
                _random_strings(rng, lengths, valid),
                pa.array(v_float, mask=deleted),
            ],
            schema=WIDE_SCHEMA,
        )

    def initial(self) -> pa.Table:
        keys = np.arange(self.n_keys, dtype=np.int64)
        return self._table(keys, keys.copy(), np.zeros(self.n_keys, dtype=bool))

    def batch(self) -> pa.Table:
        rng = self._rng
        n_dup = self.batch_rows // 20
        distinct = self.batch_rows - n_dup
        n_upd = distinct * 70 // 100
        n_new = distinct * 20 // 100
        n_del = distinct - n_upd - n_new
        picked = rng.choice(len(self._live), size=n_upd + n_del, replace=False)
        upd = self._live[picked[:n_upd]]
        dels = self._live[picked[n_upd:]]
        new = np.arange(self._next_key, self._next_key + n_new, dtype=np.int64)
        self._next_key += n_new
        keep = np.ones(len(self._live), dtype=bool)
        keep[picked[n_upd:]] = False
        self._live = np.concatenate([self._live[keep], new])

        written = np.concatenate([upd, new])
        keys = np.concatenate([written, dels])
        offsets = self._next_offset + 2 + 4 * np.arange(len(keys), dtype=np.int64)
        self._next_offset += 4 * len(keys) + 4
        dup_idx = rng.choice(len(written), size=n_dup, replace=False)
        dup_offsets = offsets[dup_idx] + rng.choice(np.array([-1, 1]), size=n_dup)

        all_keys = np.concatenate([keys, written[dup_idx]])
        all_offsets = np.concatenate([offsets, dup_offsets])
        deleted = np.zeros(len(all_keys), dtype=bool)
        deleted[len(written) : len(keys)] = True
        table = self._table(all_keys, all_offsets, deleted)
        return table.take(pa.array(rng.permutation(len(all_keys))))


def wide_canonical(table: pa.Table) -> pa.Table:
    """The compared columns of a wide snapshot, sorted by key and offset, in one chunk."""
    out = table.select(WIDE_COMPARED).sort_by([("key", "ascending"), ("offset", "ascending")])
    return out.combine_chunks().cast(pa.schema([WIDE_SCHEMA.field(n) for n in WIDE_COMPARED]))


def write_wide_workload(
    root: Path, n_keys: int, batch_rows: int, batches: int, seed: int = 22
) -> tuple[Path, list[Path]]:
    """The wide workload's initial load and ``batches`` change batches as Parquet landing
    files under ``root`` (created), named so that name order is workload order."""
    root.mkdir(parents=True, exist_ok=True)
    workload = WideWorkload(n_keys, batch_rows, seed)
    initial = root / "0000-initial.parquet"
    write_landing(initial, workload.initial())
    paths = []
    for i in range(1, batches + 1):
        path = root / f"{i:04d}-batch.parquet"
        write_landing(path, workload.batch())
        paths.append(path)
    return initial, paths
