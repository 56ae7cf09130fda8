"""A shard's ingest configuration as one typed value: :class:`ShardIngestConfig`.

Between runs the ingest keeps what it knows about a shard in the shard's config
(``ShardState.config``: string entries, changed only by a compare-and-append). This
module is the one place that names those entries and parses or formats their values:
everything else reads a config with :meth:`ShardIngestConfig.read` and writes the
entries of a value (:meth:`ShardIngestConfig.entries`).

The entries (what existing shards hold; names and formats never change):

- ``ingest.schema``: :meth:`SourceSchema.to_json` (key, order and delete-marker columns,
  and the typed columns); ``ingest.order_scope``: ``batch`` or ``global``;
  ``ingest.buckets``: the bucket count in decimal. Together the shard's
  :class:`ShardOptions`, fixed by its first ingest commit (``ingest.options``).
  ``ingest.envelope``: ``debezium`` for a shard whose files are Debezium change events
  (``landing.debezium``); absent means ``plain``, and a plain shard never writes it (so
  its commits' state diffs are what they always were).
  ``ingest.missing``: ``keep`` for a shard whose rows' left-out values keep the key's
  previous ones (``landing.missing``), with ``ingest.unavailable``, the placeholder
  text; both absent mean ``null`` (never written for it, as for ``ingest.envelope``).
- ``blobref.checkpoint.<b>``: the blob key of bucket ``b``'s checkpoint, "" for an empty
  state. The :data:`~upsert_core.persist.state.state.BLOB_REF_PREFIX` is how the persist
  layer (GC, checks) finds the blobs a state references.
- ``checkpoint.base.<b>``: where bucket ``b``'s checkpoint stands
  (:meth:`~upsert_core.ingest.tasks.Base.encode`; kept opaque here, since decoding it
  needs the upper it is read at).
- ``checkpoint.upper``: the upper, in decimal, as of which all referenced checkpoints
  are valid (see ``ingest.checkpoint``).
- ``blobref.tombstones.<b>`` (order scope ``global``): the blob key of bucket ``b``'s
  tombstone set, "" when it has none (``ingest.tombstones``). Unlike a checkpoint it is
  shard data: a rebuild of the bucket needs it. Absent for buckets last written before
  tombstones were recorded.
- ``blobref.late.<ts>.<b>`` (order scope ``global``): the blob key of bucket ``b``'s
  late part of the batch at ``ts`` (its late rows: ``ingest.late`` reads and writes
  them), committed with the batch; absent when the bucket had no late rows then. GC
  drops the entries of batches before the shard's since (``persist.state.state``).
- ``stats.live_rows``: live rows at the shard's upper, in decimal (absent for shards
  first ingested before it was kept). Written by the same commits as
  ``checkpoint.upper``, so it is the count at THAT upper: a commit made outside the
  ingest (a plain ``Shard.append``) moves the upper past it and leaves it behind
  (:meth:`ShardIngestConfig.live_rows_at` then says unknown).
- ``ingest.commit``: the nonce of the latest ingest commit; ``ingest.history``: JSON
  ``{"<upper>": "<nonce>"}`` of the last :data:`HISTORY_LENGTH` ingest commits, in
  ascending upper order (see ``ingest.statecache``).
- ``ledger.file.<name>``: the ledger record of ingested landing file ``name`` (size,
  content digest, listed version; JSON), committed with the name; absent for files
  ingested before records were kept. ``ledger.rewritten_files``: a JSON list of the
  names the last ingest found rewritten, absent when none (``ingest.ledger`` reads and
  writes both; outside ``ingest.``, which :meth:`ShardIngestConfig.read` reads whole).

Invariants:

- :meth:`ShardIngestConfig.read` is exactly as tolerant as the ingest always was: no
  ``ingest.schema`` means no options (``options`` None; the other two option entries
  are then ignored); a missing ``ingest.order_scope`` or ``ingest.buckets`` reads as
  ``batch`` or :data:`DEFAULT_BUCKETS`; a malformed schema, order scope or bucket count
  raises :class:`ConfigError` (``malformed stored bucket count: ...`` for a count that
  is not an integer). Everything else never raises: malformed history reads as ``{}``,
  live rows that are not all digits as None, a checkpoint upper not written as
  ``str(n)`` as None (so it equals no upper), and a reference or base entry whose bucket is not
  written as ``str(b)`` is ignored (no reader ever looked it up). The one deviation:
  live rows of digits ``int()`` refuses (superscripts) read as None, not ValueError.
- :meth:`ShardIngestConfig.entries` writes one entry per field that is set (None or an
  empty mapping writes nothing), in the order the ingest always wrote them, so a
  commit's state diff is byte-for-byte what it was. ``read(entries(v)) == v`` for every
  value whose upper, live rows and bucket numbers are non-negative (so for every value
  ``read`` returns).
- A commit writes the entries of a value that holds only what it changes (the buckets
  it ran, the live rows if known): entries it does not hold keep their stored values.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from upsert_core.errors import ConfigError
from upsert_core.landing import SourceSchema
from upsert_core.landing.debezium import Envelope, parse_envelope
from upsert_core.landing.missing import (
    DEFAULT_PLACEHOLDER,
    Missing,
    check_placeholder,
    parse_missing,
)
from upsert_core.order_scope import OrderScope
from upsert_core.persist.state.state import BLOB_REF_PREFIX, LATE_REF_PREFIX, late_ref_ts

CONFIG_SCHEMA = "ingest.schema"
CONFIG_ORDER_SCOPE = "ingest.order_scope"
CONFIG_BUCKETS = "ingest.buckets"
CONFIG_ENVELOPE = "ingest.envelope"
CONFIG_MISSING = "ingest.missing"
CONFIG_UNAVAILABLE = "ingest.unavailable"
CONFIG_CHECKPOINT_UPPER = "checkpoint.upper"
CHECKPOINT_REF_PREFIX = f"{BLOB_REF_PREFIX}checkpoint."
CHECKPOINT_BASE_PREFIX = "checkpoint.base."
TOMBSTONES_REF_PREFIX = f"{BLOB_REF_PREFIX}tombstones."
CONFIG_LIVE_ROWS = "stats.live_rows"
LIVE_ROWS_UNKNOWN = "unknown"
CONFIG_COMMIT_NONCE = "ingest.commit"
CONFIG_HISTORY = "ingest.history"

CONFIG_FILE_PREFIX = "ledger.file."
CONFIG_REWRITTEN = "ledger.rewritten_files"

HISTORY_LENGTH = 16
"""Ingest commits ``ingest.history`` remembers."""

DEFAULT_BUCKETS = 4
"""The bucket count of a new shard, and of a stored config without ``ingest.buckets``."""
MAX_BUCKETS = 4096


def checkpoint_ref_name(bucket: int) -> str:
    """The config entry referencing bucket ``bucket``'s checkpoint blob."""
    return f"{CHECKPOINT_REF_PREFIX}{bucket}"


def checkpoint_base_name(bucket: int) -> str:
    """The config entry describing bucket ``bucket``'s checkpoint base (``tasks.Base``)."""
    return f"{CHECKPOINT_BASE_PREFIX}{bucket}"


def file_record_name(name: str) -> str:
    """The config entry holding ingested file ``name``'s ledger record (``ingest.ledger``)."""
    return f"{CONFIG_FILE_PREFIX}{name}"


def tombstones_ref_name(bucket: int) -> str:
    """The config entry referencing bucket ``bucket``'s tombstone set (``ingest.tombstones``)."""
    return f"{TOMBSTONES_REF_PREFIX}{bucket}"


def late_ref_name(ts: int, bucket: int) -> str:
    """The config entry referencing bucket ``bucket``'s late part of the batch at ``ts``."""
    return f"{LATE_REF_PREFIX}{ts}.{bucket}"


def parse_late_ref_name(name: str) -> tuple[int, int] | None:
    """``(ts, bucket)`` of a :func:`late_ref_name`, None for any other entry name."""
    return late_ref_ts(name)


def parse_order_scope(value: str | OrderScope) -> OrderScope:
    """An order scope given as ``batch`` or ``global`` (any case, spaces around)."""
    if isinstance(value, OrderScope):
        return value
    try:
        return OrderScope(value.strip().lower())
    except ValueError:
        raise ConfigError(
            f"--order-scope must be 'batch' or 'global', got {value!r}"
        ) from None


def check_buckets(n: int) -> int:
    """``n`` if it is a valid bucket count, else :class:`ConfigError`."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_BUCKETS:
        raise ConfigError(f"the bucket count must be an integer in [1, {MAX_BUCKETS}], got {n!r}")
    return n


def recent_history(history: Mapping[int, str], upper: int, nonce: str) -> dict[int, str]:
    """``history`` with the commit that produced ``upper`` with ``nonce``, keeping the
    newest :data:`HISTORY_LENGTH` uppers."""
    merged = {**history, upper: nonce}
    return {u: merged[u] for u in sorted(merged)[-HISTORY_LENGTH:]}


@dataclass(frozen=True)
class ShardOptions:
    """The options a shard's ingests run with (stored, or defaults for a new shard)."""

    schema: SourceSchema
    order_scope: OrderScope
    buckets: int
    envelope: Envelope = Envelope.PLAIN
    missing: Missing = Missing.NULL
    unavailable: str = DEFAULT_PLACEHOLDER
    """With ``missing`` ``keep``: the placeholder that marks a value left out."""

    @property
    def hidden_columns(self) -> tuple[str, ...]:
        """The stored columns that are not columns of the shard: a Debezium shard's order
        field(s) (``source.lsn``, ...), under their stored names
        (``SourceSchema.order_columns``). Its rows hold them, as a plain shard's rows hold
        its order column, so the global scope can read a key's order back from its row;
        but they are the envelope's fields, not ``after``'s, and reads never show them
        (CONTRACT.md, "Change data capture"; ``upsert_core.row_view``). Derived from the
        stored options alone, so shards written before reads hid them read the same."""
        return hidden_columns(self.schema, self.envelope)


def hidden_columns(schema: SourceSchema, envelope: Envelope | str) -> tuple[str, ...]:
    """:attr:`ShardOptions.hidden_columns` of a shard with ``schema`` and ``envelope``."""
    if parse_envelope(envelope) is Envelope.DEBEZIUM:
        return schema.order_columns
    return ()


def _frozen(mapping: Mapping[int, str]) -> Mapping[int, str]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class ShardIngestConfig:
    """What a shard's config says for the ingest; see the module docstring.

    ``options`` is None for a shard no ingest has committed to. ``checkpoint_refs`` and
    ``checkpoint_bases`` map a bucket to the value of its ``blobref.checkpoint.<b>`` and
    ``checkpoint.base.<b>`` entries, ``tombstone_refs`` to its
    ``blobref.tombstones.<b>`` (global scope; absent: never recorded); ``history``
    maps an upper to the nonce of the ingest commit that produced it.
    """

    options: ShardOptions | None = None
    checkpoint_upper: int | None = None
    checkpoint_refs: Mapping[int, str] = field(default_factory=dict)
    checkpoint_bases: Mapping[int, str] = field(default_factory=dict)
    tombstone_refs: Mapping[int, str] = field(default_factory=dict)
    live_rows: int | None = None
    live_rows_unknown: bool = False
    """Write ``stats.live_rows`` as unknown (when ``live_rows`` is None): a commit that
    cannot know the count must not leave an older one standing for its upper."""
    commit_nonce: str | None = None
    history: Mapping[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("checkpoint_refs", "checkpoint_bases", "tombstone_refs", "history"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))

    @property
    def schema(self) -> SourceSchema | None:
        """The shard's source schema (None before its first ingest committed one)."""
        return None if self.options is None else self.options.schema

    def checkpoints_current(self, upper: int) -> bool:
        """Whether the checkpoint references describe the shard's state at ``upper``."""
        return upper == 0 or self.checkpoint_upper == upper

    def live_rows_at(self, upper: int) -> int | None:
        """The live rows at ``upper`` when this config records them, else None (unknown).

        0 at upper 0 (nothing committed). Otherwise the recorded count only if the commit
        that produced ``upper`` was an ingest commit (``checkpoint.upper == upper``; it
        wrote the count with its batch): after a commit made outside the ingest the
        stored count is an older upper's, and a shard first ingested before the count
        was kept has none.

        An ingest commit that follows a commit made outside the ingest cannot know the
        count (that commit's rows were never counted): it records it as unknown
        (``pipeline._live_rows_after``), so no older count stands for a later upper.
        """
        if upper == 0:
            return 0
        return self.live_rows if self.checkpoint_upper == upper else None

    @classmethod
    def read(cls, config: Mapping[str, str]) -> ShardIngestConfig:
        """The ingest's view of ``config``; raises :class:`ConfigError` only for
        malformed stored options (module docstring)."""
        return cls(
            options=_read_options(config),
            checkpoint_upper=_decimal(config.get(CONFIG_CHECKPOINT_UPPER, "")),
            checkpoint_refs=_per_bucket(config, CHECKPOINT_REF_PREFIX),
            checkpoint_bases=_per_bucket(config, CHECKPOINT_BASE_PREFIX),
            tombstone_refs=_per_bucket(config, TOMBSTONES_REF_PREFIX),
            live_rows=_read_live_rows(config.get(CONFIG_LIVE_ROWS, "")),
            commit_nonce=config.get(CONFIG_COMMIT_NONCE),
            history=_read_history(config.get(CONFIG_HISTORY, "{}")),
        )

    def entries(self) -> dict[str, str]:
        """The config entries that record this value (module docstring)."""
        out: dict[str, str] = {}
        if self.options is not None:
            out[CONFIG_SCHEMA] = self.options.schema.to_json()
            out[CONFIG_ORDER_SCOPE] = self.options.order_scope.value
            out[CONFIG_BUCKETS] = str(self.options.buckets)
            if self.options.envelope is not Envelope.PLAIN:
                out[CONFIG_ENVELOPE] = self.options.envelope.value
            if self.options.missing is not Missing.NULL:
                out[CONFIG_MISSING] = self.options.missing.value
                out[CONFIG_UNAVAILABLE] = self.options.unavailable
        # Each bucket's reference, then its base: the order commits always wrote.
        for bucket, ref in self.checkpoint_refs.items():
            out[checkpoint_ref_name(bucket)] = ref
            if bucket in self.checkpoint_bases:
                out[checkpoint_base_name(bucket)] = self.checkpoint_bases[bucket]
        for bucket, base in self.checkpoint_bases.items():
            out.setdefault(checkpoint_base_name(bucket), base)
        for bucket, ref in self.tombstone_refs.items():
            out[tombstones_ref_name(bucket)] = ref
        if self.checkpoint_upper is not None:
            out[CONFIG_CHECKPOINT_UPPER] = str(self.checkpoint_upper)
        if self.live_rows is not None:
            out[CONFIG_LIVE_ROWS] = str(self.live_rows)
        elif self.live_rows_unknown:
            out[CONFIG_LIVE_ROWS] = LIVE_ROWS_UNKNOWN
        if self.commit_nonce is not None:
            out[CONFIG_COMMIT_NONCE] = self.commit_nonce
        if self.history:
            out[CONFIG_HISTORY] = json.dumps(
                {str(u): self.history[u] for u in sorted(self.history)}
            )
        return out


def recorded_live_rows(config: Mapping[str, str], upper: int) -> int | None:
    """:meth:`ShardIngestConfig.live_rows_at` of ``config``, reading only the two entries
    it needs (so never :class:`ConfigError`, whatever the stored options)."""
    return ShardIngestConfig(
        checkpoint_upper=_decimal(config.get(CONFIG_CHECKPOINT_UPPER, "")),
        live_rows=_read_live_rows(config.get(CONFIG_LIVE_ROWS, "")),
    ).live_rows_at(upper)


def _read_options(config: Mapping[str, str]) -> ShardOptions | None:
    stored = config.get(CONFIG_SCHEMA)
    if stored is None:
        return None
    schema = SourceSchema.from_json(stored)
    scope = parse_order_scope(config.get(CONFIG_ORDER_SCOPE, OrderScope.BATCH.value))
    try:
        buckets = check_buckets(int(config.get(CONFIG_BUCKETS, str(DEFAULT_BUCKETS))))
    except ValueError as exc:
        raise ConfigError(f"malformed stored bucket count: {exc}") from exc
    envelope = parse_envelope(config.get(CONFIG_ENVELOPE, Envelope.PLAIN.value))
    missing = parse_missing(config.get(CONFIG_MISSING, Missing.NULL.value))
    if missing is Missing.NULL:
        return ShardOptions(schema, scope, buckets, envelope)
    unavailable = check_placeholder(config.get(CONFIG_UNAVAILABLE, DEFAULT_PLACEHOLDER))
    return ShardOptions(schema, scope, buckets, envelope, missing, unavailable)


def _decimal(text: str) -> int | None:
    """``text`` as written by ``str(n)`` for an ``n >= 0``, else None."""
    if not (text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if str(value) == text else None


def _per_bucket(config: Mapping[str, str], prefix: str) -> dict[int, str]:
    out: dict[int, str] = {}
    for name, value in config.items():
        if name.startswith(prefix):
            bucket = _decimal(name[len(prefix):])
            if bucket is not None:
                out[bucket] = value
    return out


def _read_live_rows(text: str) -> int | None:
    if not text.isdigit():
        return None
    try:
        return int(text)
    except ValueError:  # digits int() does not take, such as superscripts
        return None


def _read_history(text: str) -> dict[int, str]:
    try:
        raw = json.loads(text)
        return {int(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
    except (ValueError, TypeError, AttributeError):
        return {}
