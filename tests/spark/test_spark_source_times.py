"""The Spark source reads by commit time: the options ``asOfTime``, ``sinceTime`` and
``untilTime`` (and ``read_shard``'s ``as_of_time``, ``since_time``, ``until_time``) read
what the Python API reads at the ts the time stands for; a ts option with its time
option, and a time before the earliest readable commit, fail at ``load()``."""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from typing import Any

import pytest
from pyspark.sql import SparkSession

from resources.spark_source import read_shard
from tests.ingest.helpers import write_jsonl
from upsert_core import open_shard
from upsert_core.ingest import IngestRequest, ingest
from upsert_core.persist.shard import Shard
from upsert_core.stores import open_stores, resolve

pytestmark = pytest.mark.spark

T0 = dt.datetime(2026, 5, 1, 8, 0, 0, tzinfo=dt.UTC)
MINUTE = dt.timedelta(minutes=1)


def _bag(rows: list[dict[str, Any]]) -> Counter[str]:
    return Counter(json.dumps(r, sort_keys=True, default=str) for r in rows)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """Shard ``t``: ts 0, 1, 2 committed at T0, T0 + 1 min, T0 + 2 min."""
    root = tmp_path_factory.mktemp("times")
    consensus, blob = f"sqlite:///{root / 'consensus.db'}", f"file://{root / 'blob'}"
    landing = root / "landing"
    landing.mkdir()
    now = [0]
    shard = Shard.open(*open_stores(resolve(consensus, blob)), "t", clock_ms=lambda: now[0])
    for ts in range(3):
        write_jsonl(landing, f"{ts:03d}.jsonl",
                    [{"key": k, "offset": ts, "v": f"v{k}-{ts}"} for k in range(ts, ts + 20)])
        now[0] = int((T0 + ts * MINUTE).timestamp() * 1000)
        ingest(shard, str(landing), IngestRequest(buckets=2))
    return consensus, blob


def _rows(frame: Any) -> Counter[str]:
    return _bag([r.asDict() for r in frame.collect()])


def test_reads_by_time_equal_the_python_reads_at_the_resolved_ts(
    spark: SparkSession, stores: tuple[str, str]
) -> None:
    consensus, blob = stores
    table = open_shard("t", consensus, blob)
    for moment, ts in ((T0, 0), (T0 + MINUTE / 2, 0), (T0 + MINUTE, 1), (T0 + 5 * MINUTE, 2)):
        frame = read_shard(spark, "t", as_of_time=moment, consensus=consensus, blob=blob)
        assert _rows(frame) == _bag(table.snapshot(ts).to_pylist()), moment
    changes = read_shard(spark, "t", changes=True, since_time="2026-05-01T08:00:30",
                         until_time=T0 + 2 * MINUTE, consensus=consensus, blob=blob)
    assert _rows(changes) == _bag(table.changes(1, 2).to_pylist())
    frame = (spark.read.format("upsert").option("shard", "t").option("consensus", consensus)
             .option("blob", blob).option("asOfTime", "2026-05-01T10:01:00+02:00").load())
    assert _rows(frame) == _bag(table.snapshot(1).to_pylist())  # 08:01 UTC
    frame = (spark.read.format("upsert").option("shard", "t").option("consensus", consensus)
             .option("blob", blob).option("read", "changes")
             .option("sinceTime", "2026-05-01T09:00:00Z").load())
    assert frame.count() == 0  # nothing committed at or after it: since = upper


def test_time_options_are_refused_like_their_ts(
    spark: SparkSession, stores: tuple[str, str]
) -> None:
    consensus, blob = stores

    def load(**options: str) -> None:
        reader = (spark.read.format("upsert").option("shard", "t")
                  .option("consensus", consensus).option("blob", blob))
        for name, value in options.items():
            reader = reader.option(name, value)
        reader.load()

    read_shard(spark, "t", consensus=consensus, blob=blob)  # registers the format
    with pytest.raises(Exception, match="give asOf or asOfTime, not both"):
        load(asOf="1", asOfTime="2026-05-01T08:01:00")
    with pytest.raises(Exception, match="give since or sinceTime, not both"):
        load(read="changes", since="0", sinceTime="2026-05-01T08:01:00")
    with pytest.raises(Exception, match="give until or untilTime, not both"):
        load(read="changes", until="2", untilTime="2026-05-01T08:01:00")
    with pytest.raises(Exception, match="readable commit times are 2026-05-01T08:00:00.000"):
        load(asOfTime="2026-05-01T07:59:59")
    with pytest.raises(Exception, match="asOfTime must be an ISO-8601 time"):
        load(asOfTime="soon")
    with pytest.raises(Exception, match="as_of_time must be a datetime"):
        read_shard(spark, "t", as_of_time=5, consensus=consensus, blob=blob)  # type: ignore[arg-type]
