"""Versioned byte encodings of shard states, rollups and state diffs.

The encodings are compact JSON (UTF-8, no spaces) with a format version ``"v"`` and a
kind ``"t"`` (``"state"``, ``"rollup"``, ``"diff"``); inline part bytes are base64.
Mapping fields are encoded in sorted key order so equal states encode to equal bytes.

Invariants:

- ``decode_state(encode_state(s)) == s``, ``decode_diff(encode_diff(d)) == d`` and
  ``decode_rollup(encode_rollup(s), key)`` restores ``s`` when ``s``'s own-seqno rollup
  entry (if any) is ``RollupRef(s.seqno, key, len(bytes))``.
- Any bytes that are not a valid encoding of the expected kind and a known version
  raise :class:`~upsert_core.errors.CorruptData` saying what was wrong; decoding never
  returns a half-valid value.
- A rollup may be self-referential (the initial state at seqno 1 lists its own rollup):
  its own entry is not stored inside it (its size would depend on itself); it is marked
  ``"self": true`` and rebuilt on decode from the blob key and the blob's length.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Hashable
from typing import Any

from upsert_core.errors import CorruptData
from upsert_core.persist.state.state import (
    BlobPart,
    ErrorBatch,
    HollowBatch,
    InlinePart,
    Part,
    ReaderState,
    RollupRef,
    ShardState,
    WriterState,
)
from upsert_core.persist.state.state_diff import (
    ALL_FIELDS,
    SCALAR_FIELDS,
    Delete,
    FieldDiff,
    Insert,
    StateDiff,
    Update,
    ValDiff,
)

FORMAT_VERSION = 1


class _Bad(Exception):
    """Internal: a structural problem found while decoding (becomes CorruptData)."""


# --- primitive checks ---------------------------------------------------------------


def _int(x: object, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise _Bad(f"{what}: expected an integer, got {type(x).__name__}")
    return x


def _str(x: object, what: str) -> str:
    if not isinstance(x, str):
        raise _Bad(f"{what}: expected a string, got {type(x).__name__}")
    return x


def _list(x: object, what: str, length: int | None = None) -> list[Any]:
    if not isinstance(x, list) or (length is not None and len(x) != length):
        n = "" if length is None else f" of length {length}"
        raise _Bad(f"{what}: expected a list{n}")
    return x


def _dict(x: object, what: str) -> dict[str, Any]:
    if not isinstance(x, dict):
        raise _Bad(f"{what}: expected an object")
    return x


# --- value encodings ----------------------------------------------------------------


def _enc_part(part: Part) -> dict[str, Any]:
    if isinstance(part, BlobPart):
        return {"k": part.key, "s": part.encoded_size_bytes, "n": part.num_updates}
    return {"d": base64.b64encode(part.data).decode("ascii"), "n": part.num_updates}


def _dec_part(x: object) -> Part:
    d = _dict(x, "part")
    if "k" in d:
        return BlobPart(_str(d["k"], "part key"), _int(d["s"], "part size"), _int(d["n"], "n"))
    try:
        data = base64.b64decode(_str(d["d"], "inline part"), validate=True)
    except binascii.Error as exc:
        raise _Bad(f"inline part: bad base64: {exc}") from exc
    return InlinePart(data, _int(d["n"], "inline part num_updates"))


def _enc_batch(b: HollowBatch) -> list[Any]:
    return [b.lower, b.upper, b.since, [_enc_part(p) for p in b.parts]]


def _dec_batch(x: object) -> HollowBatch:
    lower, upper, since, parts = _list(x, "batch", 4)
    return HollowBatch(
        _int(lower, "batch lower"),
        _int(upper, "batch upper"),
        _int(since, "batch since"),
        tuple(_dec_part(p) for p in _list(parts, "batch parts")),
    )


def _enc_error(e: ErrorBatch) -> list[Any]:
    return [e.ts, _enc_part(e.part), e.num_errors]


def _dec_error(x: object) -> ErrorBatch:
    ts, part, n = _list(x, "error batch", 3)
    return ErrorBatch(_int(ts, "error ts"), _dec_part(part), _int(n, "num_errors"))


def _enc_rollup(r: RollupRef) -> list[Any]:
    return [r.seqno, r.key, r.encoded_size_bytes]


def _dec_rollup(x: object) -> RollupRef:
    seqno, key, size = _list(x, "rollup", 3)
    return RollupRef(_int(seqno, "rollup seqno"), _str(key, "rollup key"), _int(size, "size"))


def _enc_writer(w: WriterState) -> list[Any]:
    return [w.last_heartbeat_ms, w.lease_duration_ms]


def _dec_writer(x: object) -> WriterState:
    hb, lease = _list(x, "writer", 2)
    return WriterState(_int(hb, "writer heartbeat"), _int(lease, "writer lease"))


def _enc_reader(r: ReaderState) -> list[Any]:
    return [r.since, r.seqno, r.last_heartbeat_ms, r.lease_duration_ms]


def _dec_reader(x: object) -> ReaderState:
    since, seqno, hb, lease = _list(x, "reader", 4)
    return ReaderState(
        _int(since, "reader since"),
        _int(seqno, "reader seqno"),
        _int(hb, "reader heartbeat"),
        _int(lease, "reader lease"),
    )


def _identity(x: Any) -> Any:
    return x


def _pair(x: Any) -> list[int]:
    return [x[0], x[1]]


def _dec_pair(x: object) -> tuple[int, int]:
    a, b = _list(x, "key", 2)
    return (_int(a, "key[0]"), _int(b, "key[1]"))


def _dec_none(x: object) -> None:
    if x is not None:
        raise _Bad("scalar field key must be null")
    return None


_Codec = tuple[Callable[[Any], Any], Callable[[Any], Any]]

_INT: _Codec = (_identity, lambda x: _int(x, "value"))
_STR: _Codec = (_identity, lambda x: _str(x, "value"))

# field -> ((encode key, decode key), (encode value, decode value))
_FIELD_CODECS: dict[str, tuple[_Codec, _Codec]] = {
    "since": ((_identity, _dec_none), _INT),
    "upper": ((_identity, _dec_none), _INT),
    "walltime_ms": ((_identity, _dec_none), _INT),
    "rollups": (_INT, (_enc_rollup, _dec_rollup)),
    "writers": (_STR, (_enc_writer, _dec_writer)),
    "leased_readers": (_STR, (_enc_reader, _dec_reader)),
    "ingested_files": (_STR, _INT),
    "config": (_STR, _STR),
    "batches": ((_pair, _dec_pair), (_enc_batch, _dec_batch)),
    "errors": ((_pair, _dec_pair), (_enc_error, _dec_error)),
}
assert set(_FIELD_CODECS) == set(ALL_FIELDS)  # a new diffed field needs a codec here


# --- envelopes ----------------------------------------------------------------------


def _dumps(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=False).encode("utf-8")


def _loads(data: bytes, kind: str) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise CorruptData(f"{kind} bytes are not valid JSON ({len(data)} bytes): {exc}") from exc
    if not isinstance(obj, dict):
        raise CorruptData(f"{kind} bytes hold no JSON object")
    version = obj.get("v")
    if version != FORMAT_VERSION:
        raise CorruptData(
            f"{kind} has format version {version!r}; this build reads version {FORMAT_VERSION}"
        )
    if obj.get("t") != kind:
        raise CorruptData(f"expected a {kind} encoding, found kind {obj.get('t')!r}")
    return obj


def _state_body(state: ShardState, *, skip_rollup: int | None = None) -> dict[str, Any]:
    return {
        "shard": state.shard_id,
        "seqno": state.seqno,
        "since": state.since,
        "upper": state.upper,
        "walltime_ms": state.walltime_ms,
        "batches": [_enc_batch(b) for b in state.batches],
        "rollups": [
            _enc_rollup(state.rollups[s]) for s in sorted(state.rollups) if s != skip_rollup
        ],
        "writers": {k: _enc_writer(state.writers[k]) for k in sorted(state.writers)},
        "leased_readers": {
            k: _enc_reader(state.leased_readers[k]) for k in sorted(state.leased_readers)
        },
        "ingested_files": {k: state.ingested_files[k] for k in sorted(state.ingested_files)},
        "errors": [_enc_error(e) for e in state.errors],
        "config": {k: state.config[k] for k in sorted(state.config)},
    }


def _dec_state_body(d: dict[str, Any]) -> ShardState:
    rollups = [_dec_rollup(r) for r in _list(d["rollups"], "rollups")]
    return ShardState(
        shard_id=_str(d["shard"], "shard"),
        seqno=_int(d["seqno"], "seqno"),
        since=_int(d["since"], "since"),
        upper=_int(d["upper"], "upper"),
        walltime_ms=_int(d["walltime_ms"], "walltime_ms"),
        batches=tuple(_dec_batch(b) for b in _list(d["batches"], "batches")),
        errors=tuple(_dec_error(e) for e in _list(d["errors"], "errors")),
    ).evolve(
        rollups={r.seqno: r for r in rollups},
        writers={k: _dec_writer(v) for k, v in _dict(d["writers"], "writers").items()},
        leased_readers={
            k: _dec_reader(v) for k, v in _dict(d["leased_readers"], "readers").items()
        },
        ingested_files={
            k: _int(v, f"ingested file {k!r}")
            for k, v in _dict(d["ingested_files"], "ingested_files").items()
        },
        config={k: _str(v, f"config {k!r}") for k, v in _dict(d["config"], "config").items()},
    )


def _guard(kind: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except _Bad as exc:
        raise CorruptData(f"corrupt {kind}: {exc}") from exc
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptData(f"corrupt {kind}: {type(exc).__name__}: {exc}") from exc


# --- public API ---------------------------------------------------------------------


def encode_state(state: ShardState) -> bytes:
    """The versioned encoding of a full state."""
    return _dumps({"v": FORMAT_VERSION, "t": "state", **_state_body(state)})


def decode_state(data: bytes) -> ShardState:
    """Decode :func:`encode_state` output; raises CorruptData on anything else."""
    obj = _loads(data, "state")
    result: ShardState = _guard("state", lambda: _dec_state_body(obj))
    return result


def encode_rollup(state: ShardState) -> bytes:
    """The blob contents of a rollup of ``state``.

    If ``state`` lists a rollup at its own seqno, that entry is left out and marked
    self-referential (see the module docstring).
    """
    self_ref = state.seqno in state.rollups
    body = _state_body(state, skip_rollup=state.seqno if self_ref else None)
    return _dumps({"v": FORMAT_VERSION, "t": "rollup", "self": self_ref, "state": body})


def decode_rollup(data: bytes, key: str) -> ShardState:
    """Decode a rollup blob stored at ``key``; raises CorruptData on anything else."""
    obj = _loads(data, "rollup")

    def build() -> ShardState:
        state = _dec_state_body(_dict(obj["state"], "rollup state"))
        if obj["self"] is True:
            own = RollupRef(state.seqno, key, len(data))
            state = state.evolve(rollups={**state.rollups, state.seqno: own})
        elif obj["self"] is not False:
            raise _Bad("rollup 'self' must be a boolean")
        return state

    result: ShardState = _guard(f"rollup {key!r}", build)
    return result


def _enc_change(change: FieldDiff) -> list[Any]:
    (enc_key, _), (enc_val, _) = _FIELD_CODECS[change.field]
    op = change.change
    head = [change.field, enc_key(change.key)]
    if isinstance(op, Insert):
        return [*head, "i", enc_val(op.value)]
    if isinstance(op, Update):
        return [*head, "u", enc_val(op.before), enc_val(op.after)]
    return [*head, "d", enc_val(op.before)]


def _dec_change(x: object) -> FieldDiff:
    items = _list(x, "change")
    if len(items) < 4:
        raise _Bad("change: too short")
    name = _str(items[0], "change field")
    if name not in _FIELD_CODECS:
        raise _Bad(f"change of unknown field {name!r}")
    (_, dec_key), (_, dec_val) = _FIELD_CODECS[name]
    key: Hashable = dec_key(items[1])
    tag = items[2]
    op: ValDiff
    if tag == "i" and len(items) == 4:
        op = Insert(dec_val(items[3]))
    elif tag == "u" and len(items) == 5:
        op = Update(dec_val(items[3]), dec_val(items[4]))
    elif tag == "d" and len(items) == 4:
        op = Delete(dec_val(items[3]))
    else:
        raise _Bad(f"change of {name!r}: bad operation {tag!r} with {len(items)} items")
    if name in SCALAR_FIELDS and not isinstance(op, Update):
        raise _Bad(f"scalar field {name!r} can only be updated")
    return FieldDiff(name, key, op)


def encode_diff(diff: StateDiff, *, nonce: str = "") -> bytes:
    """The versioned encoding of a state diff.

    ``nonce`` (ignored on decode) makes the bytes of two writers' otherwise identical
    diffs differ, so a writer can recognise its own commit after an indeterminate error.
    """
    return _dumps(
        {
            "v": FORMAT_VERSION,
            "t": "diff",
            "shard": diff.shard_id,
            "from": diff.seqno_from,
            "to": diff.seqno_to,
            "rollup": diff.latest_rollup_key,
            "nonce": nonce,
            "c": [_enc_change(c) for c in diff.changes],
        }
    )


def decode_diff(data: bytes) -> StateDiff:
    """Decode :func:`encode_diff` output; raises CorruptData on anything else."""
    obj = _loads(data, "diff")

    def build() -> StateDiff:
        rollup = obj["rollup"]
        return StateDiff(
            shard_id=_str(obj["shard"], "shard"),
            seqno_from=_int(obj["from"], "from"),
            seqno_to=_int(obj["to"], "to"),
            latest_rollup_key=None if rollup is None else _str(rollup, "rollup"),
            changes=tuple(_dec_change(c) for c in _list(obj["c"], "changes")),
        )

    result: StateDiff = _guard("state diff", build)
    return result
