"""``sources.yaml`` ``retention:`` is stored before the ingest's maintenance whenever
the shard exists, so a run whose sources.yaml says ``retention: all`` folds nothing,
even though the shard stored a shorter retention before (since never moves back: that
history would be lost although the file in force for the run said to keep it).
"""

from __future__ import annotations

from tests.dagster.helpers import Platform


def test_a_run_under_retention_all_folds_nothing_whatever_the_shard_stored(
    plat: Platform,
) -> None:
    names = plat.write_batches()
    spec = plat.spec(retention=("all", None), order_scope="global")  # nothing holds since back
    built, defs = plat.build(spec)
    plat.add_partitions(spec, names)
    job = defs.resolve_job_def("feed_ingest")
    assert job.execute_in_process(partition_key=names[0], instance=plat.instance).success
    # Someone (or an earlier sources.yaml) stored a count of 1 in the shard.
    plat.shard().set_retention(1)
    assert job.execute_in_process(partition_key=names[1], instance=plat.instance).success
    shard = plat.shard()
    assert shard.retention() is None  # sources.yaml's `all` is stored now ...
    assert shard.state().since == 0, (  # ... but the run already folded with keep=1
        f"since {shard.state().since}: the run under `retention: all` folded history"
    )
