"""What a document assumes the reader already has, written into the session's project
root before its first block runs: the README's ``./landing`` of order files (``--key
order_id --order updated_at``, five batches so ``--as-of 3`` is readable) and its
``./cdc/orders`` of Kafka Connect sink files of Debezium events, and ``./cdc/customers``
of MySQL events (ordered by ``source.file,source.pos,source.row``; the second file
replays an older event, which the global scope ignores)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

START = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
ORDERS = pa.schema([("order_id", pa.int64()), ("updated_at", pa.timestamp("us", tz="UTC")),
                    ("status", pa.string()), ("amount", pa.float64()),
                    ("__deleted", pa.bool_())])


def _orders(landing: Path) -> None:
    landing.mkdir(parents=True)
    statuses = ["new", "paid", "shipped", "delivered", "returned"]
    for batch, status in enumerate(statuses):
        at = START + dt.timedelta(minutes=batch)
        rows = [{"order_id": order, "updated_at": at + dt.timedelta(seconds=order),
                 "status": status, "amount": 10.0 * order + batch,
                 "__deleted": batch == 4 and order == 1}
                for order in range(1, 6 + batch)]
        rows.append({"order_id": None, "updated_at": START, "status": "lost", "amount": 0.0,
                     "__deleted": False})  # a null key: one error row per file
        pq.write_table(pa.Table.from_pylist(rows, schema=ORDERS),
                       landing / f"orders-{batch:04d}.parquet")


def _debezium(landing: Path) -> None:
    landing.mkdir(parents=True)
    files = [
        [{"op": "r", "after": {"id": 1, "name": "ada"}, "source": {"lsn": 10}},
         {"op": "c", "after": {"id": 2, "name": "bob"}, "source": {"lsn": 11}}],
        [{"op": "u", "before": {"id": 1, "name": "ada"}, "after": {"id": 1, "name": "ada l."},
          "source": {"lsn": 12}},
         {"op": "d", "before": {"id": 2, "name": "bob"}, "after": None, "source": {"lsn": 13}},
         None],  # a Kafka tombstone
    ]
    for offset, events in enumerate(files):
        lines = [json.dumps(event) for event in events]
        (landing / f"orders+0+{offset:010d}.jsonl").write_text("\n".join(lines) + "\n")


def _mysql(landing: Path) -> None:
    landing.mkdir(parents=True)

    def event(op: str, file: str, pos: int, row: int, **images: object) -> dict[str, object]:
        return {"op": op, "source": {"file": file, "pos": pos, "row": row}, **images}

    files = [
        [event("c", "mysql-bin.000003", 154, 0, after={"id": 1, "name": "ada"}),
         event("u", "mysql-bin.000003", 154, 1, after={"id": 1, "name": "ada l."}),
         event("c", "mysql-bin.000003", 420, 0, after={"id": 2, "name": "bob"})],
        [event("u", "mysql-bin.000002", 9000, 0, after={"id": 1, "name": "replayed"}),
         event("d", "mysql-bin.000004", 4, 0, before={"id": 2, "name": "bob"})],
    ]
    for offset, events in enumerate(files):
        lines = [json.dumps(e) for e in events]
        (landing / f"customers+0+{offset:010d}.jsonl").write_text("\n".join(lines) + "\n")


GIVEN = {"README.md": lambda root: (_orders(root / "landing"), _debezium(root / "cdc" / "orders"),
                                    _mysql(root / "cdc" / "customers"))}


def given(doc: str, root: Path) -> None:
    if doc in GIVEN:
        GIVEN[doc](root)
