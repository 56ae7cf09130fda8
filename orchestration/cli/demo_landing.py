"""A realistic, deterministic sample landing for ``upsertctl demo``.

Customer records keyed by ``key``, ordered by ``offset``, in four batch files that
exercise every upsert rule of CONTRACT.md:

- ``batch-0001.jsonl``: inserts; in-batch duplicates of a key with different offsets
  (the greatest offset wins even when it comes first in the file); a tie (two rows of a
  key with the same offset: the later row in the file wins).
- ``batch-0002.parquet``: updates, new keys, deletes (boolean marker) and a new value
  column ``tier`` (older rows read it as null).
- ``batch-0003.csv``: updates and deletes with string markers in any case
  (``TRUE``/``true``/``False``), and one key set to the very row it already has (no
  change).
- ``batch-0004.jsonl``: a late update with an offset lower than the key's stored one
  (order scope ``batch`` applies it anyway: a later batch overrides an earlier one) and
  one bad row (a null key), which lands in the error collection.

Invariants: the same ``rows`` always gives byte-identical files (seeded generator), and
:func:`generate_landing` never overwrites an existing file, so a second demo run finds
nothing new to ingest.
"""

from __future__ import annotations

import csv
import io
import json
import random
from dataclasses import dataclass
from pathlib import Path

SEED = 20240611
CITIES = ("Berlin", "Lisbon", "Osaka", "Austin", "Nairobi", "Lima", "Oslo", "Pune")
NAMES = ("Ada", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goro", "Hana", "Ivan", "Jo")
TIERS = ("bronze", "silver", "gold")

Record = dict[str, object]


@dataclass(frozen=True)
class DemoFacts:
    """What the sample contains, so the demo can point at interesting rows."""

    files: tuple[str, ...]
    duplicate_key: str  # batch 1: two rows, the first has the greater offset
    tie_key: str  # batch 1: two rows with the same offset
    deleted_key: str  # batch 2: deleted
    unchanged_key: str  # batch 3: re-sent with exactly the row it has
    late_key: str  # batch 4: update with an offset lower than its stored one
    bad_row: tuple[str, int]  # (file, row number) of the row with a null key


class _Gen:
    def __init__(self, seed: int) -> None:
        self.rnd = random.Random(seed)
        self.offset = 0

    def next_offset(self) -> int:
        self.offset += 1
        return self.offset

    def person(self, key: str, offset: int) -> Record:
        r = self.rnd
        return {
            "key": key,
            "offset": offset,
            "name": f"{r.choice(NAMES)} {r.choice('ABCDEFGHKLMNPRSTW')}.",
            "city": r.choice(CITIES),
            "balance": round(r.uniform(1, 5000), 2),
        }


def _key(i: int) -> str:
    return f"cust-{i:05d}"


def build_batches(rows: int, seed: int = SEED) -> tuple[list[list[Record]], DemoFacts]:
    """The four batches (lists of records, in file order) for about ``rows`` rows."""
    g = _Gen(seed)
    n = max(rows, 20)
    n1, n2, n3 = int(n * 0.4), int(n * 0.25), int(n * 0.2)
    n4 = max(n - n1 - n2 - n3, 3)
    current: dict[str, Record] = {}

    # Batch 1: inserts, a duplicate whose first row has the greater offset, a tie.
    b1: list[Record] = []
    dup, tie = _key(0), _key(1)
    high = g.person(dup, g.next_offset() + 1000)  # arrives first, greatest offset
    b1.append(high)
    for i in range(2, n1 - 3):
        b1.append(g.person(_key(i), g.next_offset()))
    b1.append(g.person(dup, g.next_offset()))  # later in the file, lower offset: loses
    tie_offset = g.next_offset()
    b1.append(g.person(tie, tie_offset))
    b1.append(g.person(tie, tie_offset))  # same offset, later in the file: wins
    for rec in b1:
        current[str(rec["key"])] = rec
    current[dup] = high
    known = sorted(current)

    # Batch 2 (Parquet): updates, new keys, deletes; adds the column "tier".
    b2: list[Record] = []
    deleted = known[len(known) // 2]
    b2.append({"key": deleted, "offset": g.next_offset(), "__deleted": True})
    next_new = len(known) + 1
    for i in range(n2 - 1):
        if i % 3 == 0:
            key, next_new = _key(next_new), next_new + 1
        else:
            key = g.rnd.choice(known)
        if key == deleted:
            continue
        if i % 7 == 6:
            b2.append({"key": key, "offset": g.next_offset(), "__deleted": True})
            current.pop(key, None)
            continue
        rec = g.person(key, g.next_offset())
        rec["tier"] = g.rnd.choice(TIERS)
        rec["__deleted"] = False
        b2.append(rec)
        current[key] = rec
    current.pop(deleted, None)
    known = sorted(current)

    # Batch 3 (CSV): updates and deletes with string markers in any case.
    b3: list[Record] = []
    markers = ("false", "False", "")
    for i in range(n3):
        key = g.rnd.choice(known)
        if i % 6 == 5:
            b3.append({"key": key, "offset": g.next_offset(), "__deleted": "TRUE"})
            current.pop(key, None)
            known = sorted(current)
            continue
        rec = g.person(key, g.next_offset())
        rec["tier"] = g.rnd.choice(TIERS)
        rec["__deleted"] = markers[i % 3]
        b3.append(rec)
        current[key] = rec
    # The very row a key got in batch 2 (same offset too): applied, but no change.
    from_b2 = {id(rec) for rec in b2}
    same = next(k for k in sorted(current) if id(current[k]) in from_b2)
    b3.append(dict(current[same], __deleted="false"))

    # Batch 4 (JSONL): a late update with a lower offset, one bad row, updates.
    b4: list[Record] = []
    late = next(k for k in sorted(current) if k not in (dup, tie, same))
    late_rec = g.person(late, int(current[late]["offset"]) - 1)  # type: ignore[call-overload]
    b4.append(late_rec)
    for _ in range(n4 - 2):
        key = g.rnd.choice(sorted(set(current) - {late}))
        b4.append(g.person(key, g.next_offset()))
    bad_row = len(b4) + 1
    b4.append({"key": None, "offset": g.next_offset(), "name": "nobody"})

    files = ("batch-0001.jsonl", "batch-0002.parquet", "batch-0003.csv", "batch-0004.jsonl")
    facts = DemoFacts(files, dup, tie, deleted, same, late, (files[3], bad_row))
    return [b1, b2, b3, b4], facts


def _jsonl(records: list[Record]) -> bytes:
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()


def _parquet(records: list[Record]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            ("key", pa.string()),
            ("offset", pa.int64()),
            ("name", pa.string()),
            ("city", pa.string()),
            ("balance", pa.float64()),
            ("tier", pa.string()),
            ("__deleted", pa.bool_()),
        ]
    )
    table = pa.Table.from_pylist(records, schema=schema)
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def _csv(records: list[Record]) -> bytes:
    columns = ["key", "offset", "name", "city", "balance", "tier", "__deleted"]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for r in records:
        writer.writerow(["" if r.get(c) is None else r.get(c) for c in columns])
    return out.getvalue().encode()


def generate_landing(root: Path, rows: int, seed: int = SEED) -> tuple[list[str], DemoFacts]:
    """Write the sample batches under ``root``; returns (names written now, facts).

    Existing files are left alone (never rewritten), so re-running is harmless.
    """
    batches, facts = build_batches(rows, seed)
    encoders = (_jsonl, _parquet, _csv, _jsonl)
    root.mkdir(parents=True, exist_ok=True)
    written = []
    for name, records, encode in zip(facts.files, batches, encoders, strict=True):
        path = root / name
        if path.exists():
            continue
        tmp = path.with_name(f".{name}.tmp")
        tmp.write_bytes(encode(records))
        tmp.replace(path)  # atomic: an interrupted run never leaves half a batch file
        written.append(name)
    return written, facts
