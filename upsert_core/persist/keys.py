"""Where a shard's things live: its consensus key and its blob keys.

Every module that names a blob builds the name here, so the layout has one definition:

- consensus key of a shard: the shard id itself;
- ``{shard}/rollup/{seqno:020d}-{uuid}``: full state rollups (the zero-padded seqno
  sorts lexicographically and is recoverable with :func:`parse_rollup_seqno`);
- ``{shard}/part/{uuid}.parquet``: batch parts;
- ``{shard}/errors/{uuid}.parquet``: error parts;
- ``{shard}/checkpoint/...``: upsert state checkpoints.

Invariants: every key of a shard starts with :func:`shard_prefix`; shard names are
validated (no ``/``, no ``..``) so no key escapes its prefix; every generated key of a
part, error part or rollup is unique (a fresh uuid4), so two writers never overwrite
each other's blobs even when they race for the same seqno.
"""

from __future__ import annotations

import re
import uuid

from upsert_core.persist.state import validate_shard_name

ROLLUP_DIR = "rollup"
PART_DIR = "part"
ERRORS_DIR = "errors"
CHECKPOINT_DIR = "checkpoint"

_ROLLUP_KEY_RE = re.compile(
    r"^(?P<shard>[^/]+)/rollup/(?P<seqno>[0-9]{20})-(?P<id>[0-9a-f]{32})$"
)


def consensus_key(shard: str) -> str:
    """The consensus key holding the shard's log of state diffs."""
    return validate_shard_name(shard)


def shard_prefix(shard: str) -> str:
    """The blob prefix under which every blob of ``shard`` lives (ends with ``/``)."""
    return f"{validate_shard_name(shard)}/"


def rollup_prefix(shard: str) -> str:
    """The blob prefix of the shard's rollups."""
    return f"{shard_prefix(shard)}{ROLLUP_DIR}/"


def rollup_key(shard: str, seqno: int) -> str:
    """A fresh, unique blob key for a rollup of ``shard``'s state at ``seqno``."""
    if seqno < 0:
        raise ValueError(f"rollup seqno must be >= 0, got {seqno}")
    return f"{rollup_prefix(shard)}{seqno:020d}-{uuid.uuid4().hex}"


def part_key(shard: str) -> str:
    """A fresh, unique blob key for a batch part of ``shard``."""
    return f"{shard_prefix(shard)}{PART_DIR}/{uuid.uuid4().hex}.parquet"


def error_part_key(shard: str) -> str:
    """A fresh, unique blob key for an error part of ``shard``."""
    return f"{shard_prefix(shard)}{ERRORS_DIR}/{uuid.uuid4().hex}.parquet"


def checkpoint_prefix(shard: str) -> str:
    """The blob prefix of the shard's upsert state checkpoints."""
    return f"{shard_prefix(shard)}{CHECKPOINT_DIR}/"


def parse_rollup_seqno(key: str) -> int | None:
    """The seqno of a rollup key built by :func:`rollup_key`, or ``None`` if it is not one."""
    match = _ROLLUP_KEY_RE.match(key)
    if match is None:
        return None
    return int(match.group("seqno"))


def parse_rollup_shard(key: str) -> str | None:
    """The shard of a rollup key built by :func:`rollup_key`, or ``None`` if it is not one."""
    match = _ROLLUP_KEY_RE.match(key)
    return None if match is None else match.group("shard")
