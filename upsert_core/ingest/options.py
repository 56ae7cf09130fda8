"""Ingest options: what a caller asks for, and the options a shard is fixed to.

The options that shape a shard's contents (key columns, order column, delete-marker
column, order scope, envelope) and the number of state buckets are fixed by the shard's first
committed ingest and stored in its config next to the source schema. Later ingests may
omit any of them.

Invariants:

- :func:`resolve_options` never changes a stored option: a request that names a
  different value raises :class:`ConfigError` whose message names the option and both
  values, before anything is read or written.
- The stored config is the single source of truth once present; defaults apply only to
  a shard that has never committed an ingest.
- Value checks (``IngestRequest.value_checks``) are per request, never stored.
- ``--envelope debezium`` (``landing.debezium``): the order defaults to ``source.lsn``
  and the delete marker is the envelope's own column, so a request naming
  ``deleted_col`` for such a shard (new or stored) is refused with :class:`ConfigError`.
  A new Debezium shard stores its order under reserved names
  (``SourceSchema.envelope_order``); a stored shard keeps the naming it was created with.
- ``--missing keep`` (``landing.missing``) is fixed like the envelope, with its
  placeholder (``--unavailable``, default Debezium's); ``--unavailable`` for a shard
  whose values left out mean null is refused with :class:`ConfigError`.
- A new shard's bucket count, when the request names none, follows its first file's
  listed size (:func:`buckets_for_first_file`): about :data:`TARGET_BUCKET_BYTES` of
  upsert state per bucket, at least :data:`DEFAULT_BUCKETS`, a power of two, at most
  :data:`MAX_AUTO_BUCKETS`. A small first file keeps the default.
- The stored options are read with :class:`~upsert_core.ingest.shard_config.ShardIngestConfig`
  (which owns the config entries and their formats); the key/order/delete-marker
  columns live in exactly one place, the source schema.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from upsert_core.errors import ConfigError
from upsert_core.ingest.shard_config import (
    DEFAULT_BUCKETS,
    ShardIngestConfig,
    ShardOptions,
    check_buckets,
    parse_order_scope,
)
from upsert_core.landing import SourceSchema, ValueCheck
from upsert_core.landing.debezium import DEFAULT_ORDER as DEBEZIUM_ORDER
from upsert_core.landing.debezium import DELETE_MARKER, Envelope, parse_envelope
from upsert_core.landing.missing import (
    DEFAULT_PLACEHOLDER,
    Missing,
    check_placeholder,
    parse_missing,
)
from upsert_core.landing.schema import normal_order, parse_order
from upsert_core.order_scope import OrderScope
from upsert_core.persist.state.leases import DEFAULT_LEASE_DURATION_MS
from upsert_core.persist.write.parts import DEFAULT_INLINE_THRESHOLD

DEFAULT_KEY: tuple[str, ...] = ("key",)
DEFAULT_ORDER = "offset"
DEFAULT_DELETED = "__deleted"
DEFAULT_MAX_ATTEMPTS = 5


@dataclass(frozen=True)
class IngestRequest:
    """What one ingest run asks for. ``None`` means "the shard's value (or default)".

    ``buckets`` is the number of upsert state buckets (fixed per shard like the other
    options). ``inline_threshold``, ``max_attempts`` and ``writer_lease_ms`` (how long
    the run's writer registration lives without a heartbeat, see ``persist.write.writers``)
    tune this run only.

    ``value_checks`` (:class:`~upsert_core.landing.ValueCheck`, e.g. from
    :func:`~upsert_core.landing.parse_value_checks`) apply to the files of this run and
    are NOT stored in the shard: they decide which rows go in (failures become error
    rows), not what the shard's rows are, so unlike the options above a later run may
    change or drop them freely; a run without them (``upsertctl ingest``) checks nothing.
    """

    key: Sequence[str] | None = None
    order: str | Sequence[str] | None = None
    """The order column, or several: ``"c1,c2"`` (``landing.schema.parse_order``) or a
    sequence of names."""
    deleted_col: str | None = None
    order_scope: str | OrderScope | None = None
    buckets: int | None = None
    envelope: str | Envelope | None = None
    """``plain`` or ``debezium`` (``landing.debezium``), fixed per shard; None: the
    shard's (a new shard: plain)."""
    missing: str | Missing | None = None
    """``null`` or ``keep`` (``landing.missing``), fixed per shard; None: the shard's (a
    new shard: null)."""
    unavailable: str | None = None
    """With ``missing`` ``keep``: the placeholder text, fixed per shard; None: the
    shard's (a new shard: ``__debezium_unavailable_value``)."""
    inline_threshold: int = DEFAULT_INLINE_THRESHOLD
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    writer_lease_ms: int = field(default_factory=lambda: writer_lease_ms_from_env())
    value_checks: tuple[ValueCheck, ...] = ()
    typed_parts: bool = field(default_factory=lambda: typed_parts_from_env())
    values_only: bool = field(default_factory=lambda: part_format_from_env() >= 3)
    part_bases: bool = field(default_factory=lambda: part_bases_from_env())
    """With ``values_only``, batch scope: a bucket drained from an empty state keeps its
    one part as its checkpoint base instead of writing the state again
    (``ingest.checkpoint``); False always writes columnar checkpoints."""
    maintain: bool | None = None
    """Maintain the shard after the run's commits (``ingest.maintenance``); None: as
    ``UPSERT_AUTO_MAINTENANCE`` says (default on)."""
    """With ``typed_parts``: write format-3 parts, each row stored once as its values
    (``persist.write.parts``); False keeps the encoded row beside them (format 2)."""


TYPED_PARTS_ENV = "UPSERT_TYPED_PARTS"
"""``0`` writes parts without value columns (readable by releases before typed parts);
the same as ``UPSERT_PART_FORMAT=1``."""

PART_FORMAT_ENV = "UPSERT_PART_FORMAT"
"""The part format ingests and compaction write: 3 (default, each row once as typed
values), 2 (typed values beside the encoded row: readable by the release before format
3), 1 (the encoded row only: readable by releases before typed parts)."""

DEFAULT_PART_FORMAT = 3


def part_format_from_env(env: Mapping[str, str] | None = None) -> int:
    """The part format to write (:data:`PART_FORMAT_ENV`, else ``UPSERT_TYPED_PARTS=0``
    meaning 1, else :data:`DEFAULT_PART_FORMAT`).

    Each format is readable by this release and every later one; a release refuses a
    part in a format newer than it knows (naming it), so a deployment whose readers are
    not all upgraded writes the newest format all of them read until they are.
    """
    source = os.environ if env is None else env
    typed = _typed_setting(source)
    text = source.get(PART_FORMAT_ENV, "").strip()
    if not text:
        return DEFAULT_PART_FORMAT if typed else 1
    if text not in ("1", "2", "3"):
        raise ConfigError(f"{PART_FORMAT_ENV}={text!r}: use 3 (the default), 2 or 1")
    if not typed and text != "1":
        raise ConfigError(
            f"{TYPED_PARTS_ENV}=0 asks for plain parts (format 1) but {PART_FORMAT_ENV}="
            f"{text}: set one of them"
        )
    return int(text)


def typed_parts_from_env(env: Mapping[str, str] | None = None) -> bool:
    """Whether ingests write typed parts (value columns: part format 2 or 3).

    Typed parts carry the rows' decoded values, so snapshots read them without decoding
    (``persist.read.typed_read``). Releases before them refuse a part with extra columns, so
    a deployment whose readers are not all upgraded yet sets ``UPSERT_TYPED_PARTS=0``
    (or ``UPSERT_PART_FORMAT=1``) until they are; its snapshots then take the merged read.
    """
    return part_format_from_env(env) >= 2


def on_off_setting(env: Mapping[str, str], name: str) -> bool:
    """An on/off setting that defaults to on (unset or empty)."""
    text = env.get(name, "").strip().lower()
    if text in ("", "1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={text!r}: use 1 (the default) or 0")


def _typed_setting(env: Mapping[str, str]) -> bool:
    return on_off_setting(env, TYPED_PARTS_ENV)


PART_BASES_ENV = "UPSERT_PART_BASES"
"""``0`` makes every checkpoint a columnar one (no part bases; see ``IngestRequest``)."""


def part_bases_from_env(env: Mapping[str, str] | None = None) -> bool:
    """Whether ingests may keep a bucket's part as its checkpoint base."""
    return on_off_setting(os.environ if env is None else env, PART_BASES_ENV)


WRITER_LEASE_ENV = "UPSERT_WRITER_LEASE_S"
"""Seconds an ingest's writer registration lives without a heartbeat (default 900)."""


def writer_lease_ms_from_env(env: Mapping[str, str] | None = None) -> int:
    """The writer lease from :data:`WRITER_LEASE_ENV` (unset or empty: the default).

    Shorter leases let GC reclaim a crashed remote writer's blobs sooner; a writer
    stalled longer than its lease is fenced and redoes its file, so it is never unsafe.
    """
    text = (os.environ if env is None else env).get(WRITER_LEASE_ENV, "").strip()
    if not text:
        return DEFAULT_LEASE_DURATION_MS
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(
            f"{WRITER_LEASE_ENV}={text!r}: the writer lease must be a positive number of"
            " seconds"
        )
    return max(1, round(seconds * 1000))


TARGET_BUCKET_BYTES = 256 << 20
"""Upsert state a new shard's bucket should hold, at most, after its first load."""
MAX_AUTO_BUCKETS = 256
_STATE_PER_LANDING_BYTE = {".parquet": 1.5}
"""Upsert state per byte of a landing file (Parquet compresses; text is about its size)."""


def buckets_for_first_file(size: int, suffix: str) -> int:
    """The bucket count of a new shard whose first file has ``size`` bytes (module
    docstring); the default when the size is unknown (-1)."""
    state = max(0, size) * _STATE_PER_LANDING_BYTE.get(suffix, 1.0)
    wanted = math.ceil(state / TARGET_BUCKET_BYTES)
    if wanted <= DEFAULT_BUCKETS:
        return DEFAULT_BUCKETS
    return min(MAX_AUTO_BUCKETS, 1 << (wanted - 1).bit_length())


def _order(order: str | Sequence[str]) -> str | tuple[str, ...]:
    """A requested order: ``--order`` text parsed, or a sequence of names."""
    return parse_order(order) if isinstance(order, str) else normal_order(order)


def resolve_options(
    config: Mapping[str, str] | ShardIngestConfig, request: IngestRequest
) -> ShardOptions:
    """The options for an ingest of a shard with ``config`` (the stored entries, or
    them read); see the module docstring."""
    key = None if request.key is None else tuple(request.key)
    scope = None if request.order_scope is None else parse_order_scope(request.order_scope)
    buckets = None if request.buckets is None else check_buckets(request.buckets)
    envelope = None if request.envelope is None else parse_envelope(request.envelope)
    missing = None if request.missing is None else parse_missing(request.missing)
    unavailable = (None if request.unavailable is None
                   else check_placeholder(request.unavailable))
    stored = config if isinstance(config, ShardIngestConfig) else ShardIngestConfig.read(config)
    debezium = (
        envelope if stored.options is None or envelope is not None else stored.options.envelope
    ) is Envelope.DEBEZIUM
    if debezium and request.deleted_col is not None:
        raise ConfigError(
            f"--deleted-col {request.deleted_col} is refused with --envelope debezium: "
            "the event's op says what is deleted"
        )
    keeps = (
        missing if stored.options is None or missing is not None else stored.options.missing
    ) is Missing.KEEP
    if unavailable is not None and not keeps:
        raise ConfigError(
            f"--unavailable {unavailable} is refused with --missing null: a placeholder is"
            " only read with --missing keep"
        )
    if stored.options is None:
        schema = SourceSchema(
            key=key or DEFAULT_KEY,
            order=_order(request.order) if request.order else (
                DEBEZIUM_ORDER if debezium else DEFAULT_ORDER),
            deleted=DELETE_MARKER if debezium else request.deleted_col or DEFAULT_DELETED,
            # A new Debezium shard stores its order under reserved names (schema
            # version 3), so a column of ``after`` may be named like an order field.
            envelope_order=debezium,
        )
        return ShardOptions(
            schema, scope or OrderScope.BATCH, buckets or DEFAULT_BUCKETS,
            envelope or Envelope.PLAIN, missing or Missing.NULL,
            unavailable or DEFAULT_PLACEHOLDER,
        )
    schema = stored.options.schema
    stored_scope = stored.options.order_scope
    stored_buckets = stored.options.buckets
    conflicts: list[str] = []
    try:
        schema.check_options(key=key, order=request.order, deleted=request.deleted_col)
    except ConfigError as exc:
        conflicts.append(str(exc).removeprefix("conflicting ingest options: "))
    if scope is not None and scope is not stored_scope:
        conflicts.append(f"--order-scope {scope.value} (shard has {stored_scope.value})")
    if buckets is not None and buckets != stored_buckets:
        conflicts.append(f"--buckets {buckets} (shard has {stored_buckets})")
    stored_envelope = stored.options.envelope
    if envelope is not None and envelope is not stored_envelope:
        conflicts.append(f"--envelope {envelope.value} (shard has {stored_envelope.value})")
    stored_missing = stored.options.missing
    if missing is not None and missing is not stored_missing:
        conflicts.append(f"--missing {missing.value} (shard has {stored_missing.value})")
    stored_unavailable = stored.options.unavailable
    if unavailable is not None and keeps and unavailable != stored_unavailable:
        conflicts.append(f"--unavailable {unavailable} (shard has {stored_unavailable})")
    if conflicts:
        hint = "" if buckets is None or buckets == stored_buckets else (
            f"; `upsertctl rebucket --buckets {buckets}` changes the shard's bucket count")
        raise ConfigError("conflicting ingest options: " + "; ".join(conflicts) + hint)
    return stored.options
