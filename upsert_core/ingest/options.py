"""Ingest options: what a caller asks for, and the options a shard is fixed to.

The options that shape a shard's contents (key columns, order column, delete-marker
column, order scope) and the number of state buckets are fixed by the shard's first
committed ingest and stored in its config next to the source schema. Later ingests may
omit any of them.

Invariants:

- :func:`resolve_options` never changes a stored option: a request that names a
  different value raises :class:`ConfigError` whose message names the option and both
  values, before anything is read or written.
- The stored config is the single source of truth once present; defaults apply only to
  a shard that has never committed an ingest.
- Value checks (``IngestRequest.value_checks``) are per request, never stored.
- ``ingest.schema`` holds :meth:`SourceSchema.to_json`, so the key/order/delete-marker
  columns live in exactly one place; ``ingest.order_scope`` and ``ingest.buckets`` hold
  the rest.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from upsert_core.drain import OrderScope
from upsert_core.errors import ConfigError
from upsert_core.landing import SourceSchema, ValueCheck
from upsert_core.persist.leases import DEFAULT_LEASE_DURATION_MS
from upsert_core.persist.parts import DEFAULT_INLINE_THRESHOLD

CONFIG_SCHEMA = "ingest.schema"
CONFIG_ORDER_SCOPE = "ingest.order_scope"
CONFIG_BUCKETS = "ingest.buckets"

DEFAULT_KEY: tuple[str, ...] = ("key",)
DEFAULT_ORDER = "offset"
DEFAULT_DELETED = "__deleted"
DEFAULT_BUCKETS = 4
MAX_BUCKETS = 4096
DEFAULT_MAX_ATTEMPTS = 5


@dataclass(frozen=True)
class IngestRequest:
    """What one ingest run asks for. ``None`` means "the shard's value (or default)".

    ``buckets`` is the number of upsert state buckets (fixed per shard like the other
    options). ``inline_threshold``, ``max_attempts`` and ``writer_lease_ms`` (how long
    the run's writer registration lives without a heartbeat, see ``persist.writers``)
    tune this run only.

    ``value_checks`` (:class:`~upsert_core.landing.ValueCheck`, e.g. from
    :func:`~upsert_core.landing.parse_value_checks`) apply to the files of this run and
    are NOT stored in the shard: they decide which rows go in (failures become error
    rows), not what the shard's rows are, so unlike the options above a later run may
    change or drop them freely; a run without them (``upsertctl ingest``) checks nothing.
    """

    key: Sequence[str] | None = None
    order: str | None = None
    deleted_col: str | None = None
    order_scope: str | OrderScope | None = None
    buckets: int | None = None
    inline_threshold: int = DEFAULT_INLINE_THRESHOLD
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    writer_lease_ms: int = field(default_factory=lambda: writer_lease_ms_from_env())
    value_checks: tuple[ValueCheck, ...] = ()


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


@dataclass(frozen=True)
class ShardOptions:
    """The options a shard's ingests run with (stored, or defaults for a new shard)."""

    schema: SourceSchema
    order_scope: OrderScope
    buckets: int

    def config(self) -> dict[str, str]:
        """The config entries that fix these options in the shard."""
        return {
            CONFIG_SCHEMA: self.schema.to_json(),
            CONFIG_ORDER_SCOPE: self.order_scope.value,
            CONFIG_BUCKETS: str(self.buckets),
        }


def parse_order_scope(value: str | OrderScope) -> OrderScope:
    if isinstance(value, OrderScope):
        return value
    try:
        return OrderScope(value.strip().lower())
    except ValueError:
        raise ConfigError(
            f"--order-scope must be 'batch' or 'global', got {value!r}"
        ) from None


def _check_buckets(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_BUCKETS:
        raise ConfigError(f"the bucket count must be an integer in [1, {MAX_BUCKETS}], got {n!r}")
    return n


def resolve_options(config: Mapping[str, str], request: IngestRequest) -> ShardOptions:
    """The options for an ingest of a shard with ``config``; see the module docstring."""
    key = None if request.key is None else tuple(request.key)
    scope = None if request.order_scope is None else parse_order_scope(request.order_scope)
    buckets = None if request.buckets is None else _check_buckets(request.buckets)
    stored = config.get(CONFIG_SCHEMA)
    if stored is None:
        schema = SourceSchema(
            key=key or DEFAULT_KEY,
            order=request.order or DEFAULT_ORDER,
            deleted=request.deleted_col or DEFAULT_DELETED,
        )
        return ShardOptions(
            schema, scope or OrderScope.BATCH, buckets or DEFAULT_BUCKETS
        )
    schema = SourceSchema.from_json(stored)
    stored_scope = parse_order_scope(config.get(CONFIG_ORDER_SCOPE, OrderScope.BATCH.value))
    try:
        stored_buckets = _check_buckets(int(config.get(CONFIG_BUCKETS, str(DEFAULT_BUCKETS))))
    except ValueError as exc:
        raise ConfigError(f"malformed stored bucket count: {exc}") from exc
    conflicts: list[str] = []
    try:
        schema.check_options(key=key, order=request.order, deleted=request.deleted_col)
    except ConfigError as exc:
        conflicts.append(str(exc).removeprefix("conflicting ingest options: "))
    if scope is not None and scope is not stored_scope:
        conflicts.append(f"--order-scope {scope.value} (shard has {stored_scope.value})")
    if buckets is not None and buckets != stored_buckets:
        conflicts.append(f"--buckets {buckets} (shard has {stored_buckets})")
    if conflicts:
        raise ConfigError("conflicting ingest options: " + "; ".join(conflicts))
    return ShardOptions(schema, stored_scope, stored_buckets)
