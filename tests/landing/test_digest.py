"""Content digests of landing files (``landing.digest``): the block digest is the
xxh3-128 of the blocks' xxh3-128s in order; fed in pieces of any size, computed at once,
or combined from block runs that tile the file, it is the same; runs that do not tile
the file exactly give no digest; the whole-file kind is the xxh3-128 of the file."""

from __future__ import annotations

import random

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from upsert_core.errors import IngestError
from upsert_core.landing import digest
from upsert_core.landing.digest import (
    BLOCKS,
    WHOLE_FILE,
    BlockRun,
    Digester,
    DigestKind,
    block_bytes_for,
    block_run,
    blocks_kind,
    combine,
    digest_of,
    kind_of,
)


def _by_definition(data: bytes, block: int) -> str:
    digests = b"".join(xxhash.xxh3_128_digest(data[at:at + block])
                       for at in range(0, len(data), block))
    return f"xxh3_128_blocks/{block}:{xxhash.xxh3_128_hexdigest(digests)}"


def _runs(data: bytes, block: int, cuts: list[int]) -> list[BlockRun]:
    """Block runs of ``data`` cut at the block boundaries ``cuts`` (block indexes)."""
    bounds = sorted({0, *cuts, -(-len(data) // block)})
    return [block_run(data[a * block:b * block], a * block, block)
            for a, b in zip(bounds, bounds[1:], strict=False)]


@settings(max_examples=80, deadline=None)
@given(data=st.binary(max_size=600), block=st.sampled_from([1, 3, 16, 64, 1000]),
       pieces=st.lists(st.integers(0, 90), max_size=12), seed=st.integers(0, 99))
def test_every_way_of_computing_it_gives_the_same_digest(
    data: bytes, block: int, pieces: list[int], seed: int
) -> None:
    kind = DigestKind(BLOCKS, block)
    expected = _by_definition(data, block)
    assert digest_of(data, kind) == expected
    digester = Digester(kind)
    at = 0
    for n in [*pieces, len(data)]:
        digester.update(data[at:at + n])
        at += n
    assert digester.size == len(data) and digester.text() == expected
    blocks = -(-len(data) // block)
    rng = random.Random(seed)
    cuts = rng.sample(range(blocks + 1), min(blocks + 1, rng.randint(0, 4)))
    runs = _runs(data, block, cuts)
    rng.shuffle(runs)  # in any order
    assert combine(runs, len(data), kind) == expected


def test_runs_that_do_not_tile_the_file_give_no_digest() -> None:
    data = bytes(range(256)) * 4  # 1024 bytes: blocks of 100, the last one 24
    kind = DigestKind(BLOCKS, 100)
    runs = _runs(data, 100, [3, 7])
    assert combine(runs, len(data), kind) == _by_definition(data, 100)
    assert combine(runs[:1] + runs[2:], len(data), kind) is None  # a gap
    assert combine([*runs, runs[1]], len(data), kind) is None  # a block twice
    assert combine(runs, len(data) + 1, kind) is None  # not the file's size
    assert combine(runs, len(data), DigestKind(BLOCKS, 50)) is None  # other blocks
    short = BlockRun(runs[0].first, runs[0].digests, runs[0].covered - 1)
    assert combine([short, *runs[1:]], len(data) - 1, kind) is None  # a short block inside
    assert combine(runs, len(data), WHOLE_FILE) is None
    with pytest.raises(ValueError, match="block boundary"):
        block_run(data[5:105], 5, 100)
    assert block_run(b"", 5, 100).count == 0  # an empty run may start anywhere


def test_an_empty_file_and_the_whole_file_kind() -> None:
    kind = blocks_kind(0)
    assert digest_of(b"", kind) == f"{kind.text}:{xxhash.xxh3_128_hexdigest(b'')}"
    assert combine([], 0, kind) == digest_of(b"", kind)
    data = b"x" * 1000
    assert digest_of(data, WHOLE_FILE) == f"xxh3_128:{xxhash.xxh3_128_hexdigest(data)}"
    whole = Digester(WHOLE_FILE)
    whole.update(data[:300])
    whole.update(data[300:])
    assert whole.text() == digest_of(data, WHOLE_FILE)


def test_the_block_size_follows_the_size_only(monkeypatch: pytest.MonkeyPatch) -> None:
    assert block_bytes_for(0) == block_bytes_for(1 << 30) == 1 << 12  # 1 GiB: 2^18 blocks
    assert block_bytes_for((1 << 30) + 1) == 1 << 13
    assert block_bytes_for(1 << 40) == 1 << 22
    monkeypatch.setattr(digest, "MIN_BLOCK_BYTES", 4)
    assert block_bytes_for(10) == 4


def test_kinds_are_named_in_the_digest_text() -> None:
    assert kind_of("xxh3_128:" + "0" * 32) == WHOLE_FILE
    assert kind_of("xxh3_128_blocks/65536:" + "0" * 32) == DigestKind(BLOCKS, 65536)
    for bad in ("xxh3_128", "xxh3_128:00", "md5:" + "0" * 32,
                "xxh3_128_blocks:" + "0" * 32, "xxh3_128_blocks/0:" + "0" * 32,
                "xxh3_128_blocks/x:" + "0" * 32, "xxh3_128:" + "A" * 32,
                "xxh3_128:" + "g" * 32, "xxh3_128:" + " " * 32):
        with pytest.raises(IngestError):
            kind_of(bad)
