"""``first_file_problem`` against the ingest itself, on random first files: JSON Lines,
CSV and Parquet files with any of the key, order, second order, marker and value
columns, of any type, with or without rows, one or two order columns, either scope.
The check finds a problem exactly when the ingest of that file into a new shard stops
at it, with the ingest's own message."""

from __future__ import annotations

import json
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from upsert_core.errors import UpsertPlatformError
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.ingest.first_file import first_file_problem
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.shard import Shard

TYPES: dict[str, tuple[pa.DataType, list[Any]]] = {
    "int": (pa.int64(), [1, -2, 3]),
    "str": (pa.string(), ["a", "", "b"]),
    "bool": (pa.bool_(), [True, False, None]),
    "float": (pa.float64(), [1.5, -0.0, None]),
    "time": (pa.timestamp("us", "UTC"), [datetime(2020, 1, 1, tzinfo=UTC)] * 3),
}
COLUMNS = ["key", "offset", "pos", "__deleted", "v"]


def _write(root: Path, fmt: str, columns: dict[str, str], rows: int) -> None:
    data = {name: TYPES[kind][1][:rows] for name, kind in columns.items()}
    if fmt == "parquet":
        pq.write_table(pa.table({n: pa.array(v, TYPES[columns[n]][0])
                                 for n, v in data.items()}), root / "00.parquet")
    elif fmt == "jsonl":
        lines = [{n: (v[i].isoformat() if isinstance(v[i], datetime) else v[i])
                  for n, v in data.items()} for i in range(rows)]
        (root / "00.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    else:
        head = ",".join(data)
        body = "".join(",".join("" if v[i] is None else str(v[i]) for v in data.values())
                       + "\n" for i in range(rows))
        (root / "00.csv").write_text(head + "\n" + body if data else "")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fmt=st.sampled_from(["parquet", "jsonl", "csv"]),
       columns=st.dictionaries(st.sampled_from(COLUMNS), st.sampled_from(sorted(TYPES))),
       rows=st.integers(0, 3), order=st.sampled_from(["offset", "offset,pos", "pos"]),
       scope=st.sampled_from(["batch", "global"]))
def test_the_check_agrees_with_the_ingest(
    fmt: str, columns: dict[str, str], rows: int, order: str, scope: str,
) -> None:
    request = IngestRequest(order=order, order_scope=scope)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _write(root, fmt, columns, rows)
        shard = Shard.open(MemoryConsensus(), MemoryBlob(), "s", create=True)
        try:
            ingest(shard, str(root), request)
            said: str | None = None
        except UpsertPlatformError as exc:
            said = str(exc)
        try:
            found = first_file_problem("s", str(root), request)
        except UpsertPlatformError as exc:
            found = str(exc)
    assert found == said
