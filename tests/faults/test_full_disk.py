"""A full disk under the local blob store: the ingest stops with a clear error naming
the problem ("No space left on device"), nothing is half-applied (the shard passes its
checks at its last committed upper, which moved only for whole files), and once space
returns a re-run completes: the shard then equals a clean ingest with nothing leaked.

Two disks: a Blob wrapper that raises ``OSError(ENOSPC)`` once its byte budget is spent
(any machine), and a real 512 KiB tmpfs (only where this process may mount one, i.e.
as root; the test is not defined elsewhere)."""

from __future__ import annotations

import errno
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.helpers import Cli
from upsert_core.errors import UpsertPlatformError
from upsert_core.ingest import ingest
from upsert_core.ingest.verify import compare_state
from upsert_core.persist.location.blob_local import LocalBlob
from upsert_core.persist.location.consensus_sql import SqlConsensus
from upsert_core.persist.location.urls import open_blob, open_consensus
from upsert_core.persist.maintenance.check import check_shard
from upsert_core.persist.shard import Shard
from upsert_core.persist.testing import DelegatingBlob

from .helpers import REQUEST, assert_recovered, make_landing, reference_shard

NO_SPACE = "No space left on device"


class SpaceLimitedBlob(DelegatingBlob):
    """A LocalBlob whose disk holds ``capacity`` bytes: a ``set`` that would exceed it
    raises ``OSError(ENOSPC)`` and stores nothing."""

    def __init__(self, inner: LocalBlob, capacity: int) -> None:
        super().__init__(inner)
        self.capacity = capacity
        self.refused = 0

    def used(self) -> int:
        return sum(m.size_in_bytes for m in self.inner.list_keys(""))

    def set(self, key: str, value: bytes) -> None:
        old = self.inner.get(key)
        if self.used() - (len(old) if old else 0) + len(value) > self.capacity:
            self.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), key)
        self.inner.set(key, value)


def _assert_consistent(shard: Shard) -> None:
    report = check_shard(shard)
    assert report.ok, report.problems
    if shard.upper > 0:
        comparison = compare_state(shard)
        assert comparison.ok, comparison.problems


def _committed_files_are_a_prefix(shard: Shard, landing: Path) -> None:
    names = sorted(p.name for p in landing.iterdir())
    state = shard.state()
    assert dict(state.ingested_files) == {n: i for i, n in enumerate(names[: state.upper])}


def test_blob_budget_exhausted_mid_ingest(tmp_path: Path) -> None:
    landing = make_landing(tmp_path / "landing", files=8, rows=300, keys=200, seed=31)
    reference = reference_shard(landing)
    consensus = SqlConsensus(f"sqlite:///{tmp_path}/consensus.db")
    disk = SpaceLimitedBlob(LocalBlob(tmp_path / "blob"), capacity=60_000)
    shard = Shard.open(consensus, disk, "full")

    with pytest.raises((UpsertPlatformError, OSError)) as info:
        ingest(shard, str(landing), REQUEST)
    assert disk.refused > 0
    message = str(info.value)
    assert NO_SPACE in message and len(message.splitlines()) == 1, message
    stopped_at = shard.upper
    assert 0 < stopped_at < 8, "the budget should stop the ingest part way"
    _committed_files_are_a_prefix(shard, landing)
    _assert_consistent(shard)

    # A second run on the still-full disk fails the same way and changes nothing. Full:
    # not a byte free (the failed attempt's blobs were deleted, and GC after the files
    # that did commit may have freed more, so the next file could otherwise fit).
    disk.capacity = disk.used()
    with pytest.raises((UpsertPlatformError, OSError)) as again:
        ingest(shard, str(landing), REQUEST)
    assert NO_SPACE in str(again.value)
    assert shard.upper == stopped_at

    disk.capacity = 10**9  # space returns
    ingest(shard, str(landing), REQUEST)
    assert_recovered(shard, reference)


def _can_mount_tmpfs() -> bool:
    if os.geteuid() != 0:
        return False
    probe = Path(f"/tmp/upsert-tmpfs-probe-{uuid.uuid4().hex[:8]}")
    probe.mkdir()
    try:
        ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)],
                            capture_output=True).returncode == 0
        if ok:
            subprocess.run(["umount", str(probe)], check=True)
        return ok
    finally:
        probe.rmdir()


if _can_mount_tmpfs():

    @pytest.fixture
    def tiny_disk(tmp_path: Path) -> Iterator[Path]:
        mount_point = tmp_path / "tiny"
        mount_point.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount_point)],
                       check=True)
        try:
            yield mount_point
        finally:
            subprocess.run(["umount", "-l", str(mount_point)], check=True)

    @pytest.mark.slow
    def test_real_tmpfs_fills_up_mid_ingest(tmp_path: Path, tiny_disk: Path) -> None:
        landing = make_landing(tmp_path / "landing", files=10, rows=2500, keys=2000, seed=32)
        reference = reference_shard(landing)
        cli = Cli(tmp_path / "home", env={
            "UPSERT_CONSENSUS_URL": f"sqlite:///{tmp_path / 'consensus.db'}",
            "UPSERT_BLOB_URL": f"file://{tiny_disk / 'blob'}",
        })
        options = ("--key", "key", "--order", "offset")
        failed = cli.ingest(landing, *options, rc=None)
        assert failed.rc != 0
        assert NO_SPACE in failed.error_line(), failed.err
        shard = Shard.open(open_consensus(f"sqlite:///{tmp_path / 'consensus.db'}"),
                           open_blob(f"file://{tiny_disk / 'blob'}"), "s", create=False)
        assert shard.upper < 10
        _committed_files_are_a_prefix(shard, landing)
        _assert_consistent(shard)
        assert cli.check().json()["ok"] is True

        # Space returns (the tmpfs grows); the user re-runs the ingest.
        subprocess.run(["mount", "-o", "remount,size=64m", str(tiny_disk)], check=True)
        cli.ingest(landing, *options)
        assert_recovered(shard, reference)
