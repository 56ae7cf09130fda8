"""The fault-injecting wrappers: seeded, switchable, and honest about effects."""

from __future__ import annotations

import pytest

from upsert_core.errors import ConfigError, DeterminateError, IndeterminateError
from upsert_core.persist.location import (
    Blob,
    CasCommitted,
    CasMismatch,
    Consensus,
    RangedBlob,
    VersionedData,
)
from upsert_core.persist.location.blob_memory import MemoryBlob
from upsert_core.persist.location.consensus_memory import MemoryConsensus
from upsert_core.persist.location.unreliable import FaultRates, UnreliableBlob, UnreliableConsensus

ONLY_FAIL = FaultRates(fail=1.0, timeout=0.0, effect_then_timeout=0.0)
ONLY_TIMEOUT = FaultRates(fail=0.0, timeout=1.0, effect_then_timeout=0.0)
ONLY_AFTER = FaultRates(fail=0.0, timeout=0.0, effect_then_timeout=1.0)


def test_wrappers_satisfy_the_protocols() -> None:
    assert isinstance(UnreliableConsensus(MemoryConsensus(), 1), Consensus)
    assert isinstance(UnreliableBlob(MemoryBlob(), 1), Blob)


def test_fail_is_determinate_and_has_no_effect() -> None:
    inner = MemoryConsensus()
    c = UnreliableConsensus(inner, seed=0, rates=ONLY_FAIL)
    with pytest.raises(DeterminateError) as info:
        c.compare_and_set("k", None, VersionedData(1, b"x"))
    assert not isinstance(info.value, IndeterminateError)
    assert inner.head("k") is None
    assert c.injected["fail"] == 1


def test_timeout_before_has_no_effect() -> None:
    inner = MemoryBlob()
    b = UnreliableBlob(inner, seed=0, rates=ONLY_TIMEOUT)
    with pytest.raises(IndeterminateError):
        b.set("k", b"v")
    assert inner.get("k") is None
    with pytest.raises(IndeterminateError):
        b.get("k")


def test_effect_then_timeout_did_the_work() -> None:
    inner_c, inner_b = MemoryConsensus(), MemoryBlob()
    c = UnreliableConsensus(inner_c, seed=0, rates=ONLY_AFTER)
    b = UnreliableBlob(inner_b, seed=0, rates=ONLY_AFTER)
    with pytest.raises(IndeterminateError, match="DID run"):
        c.compare_and_set("k", None, VersionedData(1, b"x"))
    assert inner_c.head("k") == VersionedData(1, b"x")
    with pytest.raises(IndeterminateError):
        c.truncate("k", 1)
    with pytest.raises(IndeterminateError):
        b.set("k", b"v")
    assert inner_b.get("k") == b"v"
    with pytest.raises(IndeterminateError):
        b.delete("k")
    assert inner_b.get("k") is None
    # Reads have no effect to report: they succeed.
    assert c.head("k") == VersionedData(1, b"x")
    assert b.get("k") is None
    assert list(b.list_keys("")) == []


def test_reliable_block_and_switch() -> None:
    c = UnreliableConsensus(MemoryConsensus(), seed=0, rates=ONLY_FAIL)
    with c.reliable():
        assert c.compare_and_set("k", None, VersionedData(1, b"x")) == CasCommitted()
        assert c.scan("k", 0, 10) == [VersionedData(1, b"x")]
    assert c.enabled
    with pytest.raises(DeterminateError):
        c.head("k")
    c.enabled = False
    assert c.head("k") == VersionedData(1, b"x")
    assert list(c.list_keys()) == ["k"]


def _trace(seed: int) -> list[str]:
    c = UnreliableConsensus(MemoryConsensus(), seed, FaultRates(0.2, 0.2, 0.2))
    out = []
    for i in range(60):
        try:
            head = c.head("k")
            r = c.compare_and_set("k", head.seqno if head else None, VersionedData(i + 1, b""))
            out.append(type(r).__name__)
        except DeterminateError as e:
            out.append(f"det:{e}")
        except IndeterminateError as e:
            out.append(f"indet:{e}")
    return out


def test_same_seed_same_faults() -> None:
    a, b = _trace(7), _trace(7)
    assert a == b
    assert a != _trace(8)
    kinds = {x.split(":")[0] for x in a}
    assert {"CasCommitted", "det", "indet"} <= kinds


def test_log_stays_consistent_under_faults() -> None:
    """A writer that resolves indeterminate outcomes by re-reading never forks the log."""
    inner = MemoryConsensus()
    c = UnreliableConsensus(inner, seed=3, rates=FaultRates(0.15, 0.15, 0.15))
    committed: list[int] = []
    while len(committed) < 30:
        try:
            head = c.head("k")
        except (DeterminateError, IndeterminateError):
            continue
        expected = head.seqno if head else None
        new = VersionedData((expected or 0) + 1, b"x")
        try:
            result = c.compare_and_set("k", expected, new)
        except DeterminateError:
            continue
        except IndeterminateError:
            with c.reliable():
                now = c.head("k")
            if now is not None and now.seqno == new.seqno:
                committed.append(new.seqno)
            continue
        if isinstance(result, CasCommitted):
            committed.append(new.seqno)
        else:
            assert isinstance(result, CasMismatch)
    assert committed == list(range(1, 31))
    assert [v.seqno for v in inner.scan("k", 0, 100)] == committed
    assert all(n > 0 for n in c.injected.values())


def test_rates_are_validated() -> None:
    with pytest.raises(ConfigError):
        FaultRates(0.5, 0.5, 0.5)
    with pytest.raises(ConfigError):
        FaultRates(-0.1, 0, 0)


def test_open_reader_faults_at_open_and_reads_through_to_the_inner_store() -> None:
    inner = MemoryBlob()
    inner.set("k", b"0123456789")
    assert isinstance(UnreliableBlob(inner, 1), RangedBlob)
    with pytest.raises(DeterminateError):
        UnreliableBlob(inner, seed=0, rates=ONLY_FAIL).open_reader("k")
    with pytest.raises(IndeterminateError):
        UnreliableBlob(inner, seed=0, rates=ONLY_TIMEOUT).open_reader("k")
    # A read has no effect to report: the "after" fault never fires on it.
    reliable = UnreliableBlob(inner, seed=0, rates=ONLY_AFTER)
    reader = reliable.open_reader("k")
    assert reader is not None
    reader.seek(3)
    assert reader.read(4) == b"3456"
    assert reliable.open_reader("missing") is None


def test_stale_reads_hide_a_commit_that_timed_out_for_the_next_reads() -> None:
    inner = MemoryConsensus()
    c = UnreliableConsensus(inner, seed=0, rates=ONLY_AFTER, stale_reads=2)
    with c.reliable():
        assert c.compare_and_set("k", None, VersionedData(1, b"a")) == CasCommitted()
    with pytest.raises(IndeterminateError, match="DID run"):
        c.compare_and_set("k", 1, VersionedData(2, b"b"))
    inner.compare_and_set("k", 2, VersionedData(3, b"c"))  # someone builds on it
    # The next two reads see the log before version 2 (a consistent prefix) ...
    assert c.scan("k", 0, 10) == [VersionedData(1, b"a")]
    assert c.head("k") == VersionedData(1, b"a")
    # ... then the truth.
    assert c.head("k") == VersionedData(3, b"c")
    assert [v.seqno for v in c.scan("k", 0, 10)] == [1, 2, 3]
    assert c.stale_reads_served == 2
    # A compare-and-set always sees the true head, and one that did not commit (or a
    # plain timeout before the work) hides nothing.
    with pytest.raises(IndeterminateError):
        c.compare_and_set("k", 1, VersionedData(2, b"z"))
    assert c.head("k") == VersionedData(3, b"c")
    # With faults off the wrapper is transparent and stale reads are not consumed.
    with pytest.raises(IndeterminateError):
        c.compare_and_set("k", 3, VersionedData(4, b"d"))
    with c.reliable():
        assert c.head("k") == VersionedData(4, b"d")
    assert c.head("k") == VersionedData(3, b"c")
    with pytest.raises(ConfigError):
        UnreliableConsensus(inner, seed=0, stale_reads=-1)
