"""Bulk consolidation: fold a chunk of ``(key, value, diff)`` updates into accumulators.

Folding ``StateValue.merge_update`` over a chunk one update at a time costs a few
microseconds per update. This module computes the same fold column-wise: it groups the
updates by key with numpy (a stable sort on the 16-byte keys as 64-bit words), sums
diffs, lengths and checksums per key with ``np.add.reduceat`` (uint64 arithmetic wraps
exactly like the accumulator's), XORs each key's odd-diff values as Python ints (one
``int.from_bytes`` per value), and builds one ``StateValue`` per distinct key.

Invariants:

- Exactness: the result for a key equals folding ``merge_update`` over the key's
  updates in chunk order, starting from ``to_consolidating()`` of its stored value and
  restarting from the empty accumulator whenever it returns to all zero (which is what
  ``UpsertState`` did update by update, like the reference). A restart only changes
  ``xor_len`` (every other field is zero at that point), so only keys where one can
  happen (their running diff, length and checksum sums all zero before their last
  update) are walked update by update; the others take the vectorised sums.
  ``tests/core/test_state_chunk.py`` checks this against the per-update fold.
- A key whose accumulator ends all zero yields None (absent).
- With ``decode=True`` every result is ``ensure_decoded``; the first invalid one raises
  ``InvalidUpsertState`` carrying the exact accumulator. A key with no stored value and
  one update of diff 1 decodes to that value without building the accumulator (the
  accumulator of a single value always decodes to the value itself).
- Nothing here reads or writes a backend or mutates a value passed in.
- ``group_chunk`` returns None when the vectorised path cannot represent the chunk (a
  diff outside int64); the caller then folds update by update.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from upsert_core.codec import UpsertKey, value_checksum
from tests.oracle.state.value import StateValue

_KEY_LEN = 16
_NO_SUMS = (0, 0, 0, 0, 0)

IntpArray = npt.NDArray[np.intp]
Int64Array = npt.NDArray[np.int64]
UInt64Array = npt.NDArray[np.uint64]


@dataclass(slots=True)
class ChunkGroups:
    """A chunk's updates sorted so that each distinct key's updates are contiguous.

    Within a key the updates keep their chunk order. ``keys[g]``'s updates are the
    positions ``starts[g]`` up to ``starts[g + 1]`` (or the end) of the sorted columns.
    """

    keys: list[UpsertKey]
    starts: IntpArray
    values: list[bytes]
    diffs: Int64Array
    lengths: Int64Array
    checksums: UInt64Array
    inserts: int
    deletes: int

    def __len__(self) -> int:
        return len(self.keys)


def group_chunk(chunk: Sequence[tuple[UpsertKey, bytes, int]]) -> ChunkGroups | None:
    """Sort ``chunk`` into per-key groups; None when a diff does not fit in int64."""
    n = len(chunk)
    keys, values, diff_col = zip(*chunk, strict=True) if n else ((), (), ())
    try:
        diffs = np.fromiter(diff_col, dtype=np.int64, count=n)
    except (OverflowError, TypeError, ValueError):
        return None
    perm, new_group = _group_order(keys)
    starts = np.flatnonzero(new_group)
    key_arr = _objects(keys)
    value_arr = _objects(values)
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=n)
    checksums = np.fromiter(map(value_checksum, values), dtype=np.uint64, count=n)
    return ChunkGroups(
        keys=key_arr[perm[starts]].tolist(),
        starts=starts,
        values=value_arr[perm].tolist(),
        diffs=diffs[perm],
        lengths=lengths[perm],
        checksums=checksums[perm],
        inserts=int(np.count_nonzero(diffs > 0)),
        deletes=int(np.count_nonzero(diffs < 0)),
    )


def _objects(items: Sequence[object]) -> npt.NDArray[np.object_]:
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def _group_order(keys: Sequence[UpsertKey]) -> tuple[IntpArray, npt.NDArray[np.bool_]]:
    """A stable permutation making equal keys contiguous, and where each group starts."""
    n = len(keys)
    new_group = np.ones(n, dtype=bool)
    joined = b"".join(keys)
    if len(joined) == _KEY_LEN * n:
        words = np.frombuffer(joined, dtype=np.uint64).reshape(n, 2)
        hi, lo = words[:, 0], words[:, 1]
        # Keys are digests, so their first 8 bytes nearly always tell them apart and a
        # one-column stable sort suffices (about twice as fast as sorting on both
        # halves). If two distinct keys do share them, some adjacent pair shows it.
        perm = np.argsort(hi, kind="stable")
        shi, slo = hi[perm], lo[perm]
        same_hi = shi[1:] == shi[:-1]
        same_lo = slo[1:] == slo[:-1]
        if np.any(same_hi & ~same_lo):
            perm = np.lexsort((lo, hi))
            shi, slo = hi[perm], lo[perm]
            same_hi = shi[1:] == shi[:-1]
            same_lo = slo[1:] == slo[:-1]
        new_group[1:] = ~(same_hi & same_lo)
        return perm, new_group
    # Keys of other lengths (not produced by the codec; tests and tools): number them.
    index: dict[UpsertKey, int] = {}
    for key in keys:
        if key not in index:
            index[key] = len(index)
    gid = np.fromiter((index[k] for k in keys), dtype=np.intp, count=n)
    perm = np.argsort(gid, kind="stable")
    sorted_gid = gid[perm]
    new_group[1:] = sorted_gid[1:] != sorted_gid[:-1]
    return perm, new_group


def fold_groups(
    groups: ChunkGroups, bases: Sequence[StateValue | None], decode: bool
) -> list[StateValue | None]:
    """Each key's accumulator (decoded if ``decode``) after its updates; see the module."""
    g_count = len(groups)
    if g_count == 0:
        return []
    starts = groups.starts
    n = len(groups.values)
    counts = np.diff(starts, append=n)
    diffs = groups.diffs
    d64 = diffs.view(np.uint64)  # two's complement: wrapping sums match the accumulator's
    l64 = groups.lengths.view(np.uint64) * d64
    c64 = groups.checksums * d64
    odd = (diffs & 1).astype(bool)

    has_base = [b is not None for b in bases]
    any_base = any(has_base)
    base = [_NO_SUMS if b is None else b.accumulator_sums() for b in bases]
    b_d, b_l, b_c, b_xlen, b_xor = (list(col) for col in zip(*base, strict=True))
    base_d = np.array(b_d, dtype=np.uint64)
    base_l = np.array(b_l, dtype=np.uint64)
    base_c = np.array(b_c, dtype=np.uint64)

    sum_d = (np.add.reduceat(d64, starts) + base_d).tolist()
    sum_l = (np.add.reduceat(l64, starts) + base_l).tolist()
    sum_c = (np.add.reduceat(c64, starts) + base_c).tolist()
    odd_len = np.where(odd, groups.lengths, 0)
    xlen: list[int] = np.maximum(
        np.maximum.reduceat(odd_len, starts), np.array(b_xlen, dtype=np.int64)
    ).tolist()

    # Keys decoded straight from their single value (see the module docstring).
    fast = (counts == 1) & (diffs[starts] == 1) if decode else np.zeros(g_count, dtype=bool)
    if decode and any_base:
        fast &= ~np.array(has_base, dtype=bool)

    xor = b_xor
    values = groups.values
    from_bytes = int.from_bytes
    starts_l: list[int] = starts.tolist()
    singles = np.flatnonzero((counts == 1) & odd[starts] & ~fast).tolist()
    for g in singles:
        xor[g] ^= from_bytes(values[starts_l[g]], "little")
    multi = np.flatnonzero(counts >= 2)
    if len(multi):
        odd_l: list[bool] = odd.tolist()
        restart = _restart_points(groups, counts, d64, l64, c64, base_d, base_l, base_c)
        lengths_l: list[int] = groups.lengths.tolist()
        for g in multi.tolist():
            s, e = starts_l[g], starts_l[g] + int(counts[g])
            x = xor[g]
            if g in restart:
                # Walk the key's updates as merge_update would, restarting xor_len
                # wherever the accumulator is entirely zero.
                xl = b_xlen[g]
                points = restart[g]
                for j in range(s, e):
                    if odd_l[j]:
                        x ^= from_bytes(values[j], "little")
                        if lengths_l[j] > xl:
                            xl = lengths_l[j]
                    if j in points and x == 0:
                        xl = 0
                xlen[g] = xl
            else:
                for j in range(s, e):
                    if odd_l[j]:
                        x ^= from_bytes(values[j], "little")
            xor[g] = x

    out: list[StateValue | None] = []
    append = out.append
    new_acc = StateValue.from_accumulator_sums
    new_value = StateValue.new_finalized_value
    fast_l: list[bool] = fast.tolist()
    for g in range(g_count):
        if fast_l[g]:
            append(new_value(values[starts_l[g]], None))
            continue
        d, ln, c, x = sum_d[g], sum_l[g], sum_c[g], xor[g]
        if d == 0 and ln == 0 and c == 0 and x == 0:
            append(None)
            continue
        acc = new_acc(d, ln, c, xlen[g], x)
        if decode:
            acc.ensure_decoded()
        append(acc)
    return out


def _restart_points(
    groups: ChunkGroups,
    counts: IntpArray,
    d64: UInt64Array,
    l64: UInt64Array,
    c64: UInt64Array,
    base_d: UInt64Array,
    base_l: UInt64Array,
    base_c: UInt64Array,
) -> dict[int, set[int]]:
    """Per key, the positions before its last update where the running diff, length and
    checksum sums (from its stored value) are all zero: where the accumulator may
    restart (it does if the running XOR is zero there too)."""
    starts = groups.starts
    gid = np.repeat(np.arange(len(starts)), counts)

    def running(x: UInt64Array, b: UInt64Array) -> UInt64Array:
        total = np.cumsum(x, dtype=np.uint64)
        before = total[starts] - x[starts]
        out: UInt64Array = total - before[gid] + b[gid]
        return out

    zero = running(d64, base_d) == 0
    zero &= running(l64, base_l) == 0
    zero &= running(c64, base_c) == 0
    zero[starts + counts - 1] = False  # a zero end is the key's result (absent), not a restart
    points: dict[int, set[int]] = {}
    for j in np.flatnonzero(zero).tolist():
        points.setdefault(int(gid[j]), set()).add(j)
    return points
