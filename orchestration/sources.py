"""The sources the Dagster code location serves: ``sources.yaml`` plus the environment.

A source is one landing location feeding one shard with fixed ingest options. Each
source becomes its own asset group (see ``assets.factory``), so one code location
serves many feeds.

``sources.yaml`` (path: ``UPSERT_SOURCES``, which must exist; else ``sources.yaml`` in
the working directory; else, when running from a checkout, the one at its root)::

    sources:
      - name: demo                      # asset group and key prefix
        landing: ${UPSERT_HOME}/demo-landing
        shard: demo                     # default: the name
        key: [key]                      # or "k1,k2"; default: the shard's stored option
        order: offset                   # or [file, pos] / "file,pos": several columns,
                                        # compared on the first, then the next
        deleted_col: __deleted
        order_scope: batch
        envelope: plain                 # or debezium: Debezium change events (JSON Lines)
        missing: null                   # or keep: a value a row leaves out keeps the key's
                                        # previous one (CONTRACT.md, "Change data capture")
        unavailable: __debezium_unavailable_value  # with keep: the placeholder text
        gc_cron: "0 * * * *"            # rollup_gc schedule
        gc_retain: null                 # rollup_gc --retain, >= 1 (null: the shard's stored
                                        # retention, `upsertctl retention`; else all history)
        retention: null                 # stored in the shard by each ingest run: N (the last N
                                        # ts), a duration such as 7d (s m h d w) or all; null:
                                        # leave what `upsertctl retention` stored
        sensor_interval_s: 10           # how often the landing sensor lists the landing
        description: Orders from the shop  # shown on every asset of the group
        owners: [team:data-eng, alice@example.com]  # Dagster owners: emails or team:NAME
        tags: {domain: sales}           # Dagster tags on every asset of the group
        checks:                         # value checks (pandera); failing rows -> error rows
          amount: {min: 0, max: 1000000}
          status: {isin: [new, paid, shipped]}
          email: {regex: '^[^@]+@[^@]+$'}
          v: {not_null: true}

``${VAR}`` and ``${VAR:-default}`` expand from the environment; ``UPSERT_HOME``
defaults to ``./.upsert`` made absolute, as for ``upsertctl``.

Environment fallback (CONTRACT.md): when ``UPSERT_LANDING`` is set, one more source is
built from ``UPSERT_LANDING``, ``UPSERT_SHARD`` (default ``main``), ``UPSERT_KEY``,
``UPSERT_ORDER``, ``UPSERT_DELETED_COL`` and ``UPSERT_ORDER_SCOPE``. It is named after
its shard and replaces a file source with the same name or shard.

Invariants:

- Source names are Dagster identifiers (letters, digits, underscores) and unique; shard
  names are unique too, so two asset groups never write one shard.
- A malformed file is a :class:`ConfigError` naming the file and the entry (for
  ``checks:``, also the source and the column; unknown check kinds are rejected).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

from assets.spec import DEFAULT_GC_CRON, DEFAULT_SENSOR_INTERVAL_S, Retention, SourceSpec
from upsert_core.errors import ConfigError, InvalidUsage
from upsert_core.landing import parse_value_checks
from upsert_core.read_times import parse_duration
from upsert_core.stores import ENV_HOME, upsert_home

ENV_SOURCES = "UPSERT_SOURCES"
ENV_LANDING = "UPSERT_LANDING"
ENV_SHARD = "UPSERT_SHARD"
ENV_KEY = "UPSERT_KEY"
ENV_ORDER = "UPSERT_ORDER"
ENV_DELETED = "UPSERT_DELETED_COL"
ENV_SCOPE = "UPSERT_ORDER_SCOPE"
DEFAULT_ENV_SHARD = "main"
CHECKOUT_SOURCES_FILE = Path(__file__).resolve().parents[1] / "sources.yaml"
"""The checkout's sources file; an installed package (a wheel) has none."""

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
__all__ = ["SourceSpec", "load_sources", "merge_sources", "parse_source", "env_source"]

_FIELDS = {
    "name", "landing", "shard", "key", "order", "deleted_col", "order_scope", "envelope", "gc_cron",
    "missing", "unavailable", "gc_retain", "retention", "sensor_interval_s", "description",
    "owners", "tags", "checks",
}
_OWNER = re.compile(r"^(team:[A-Za-z0-9_.-]+|[^@\s]+@[^@\s]+\.[^@\s]+)$")
_TAG_KEY = re.compile(r"^([A-Za-z0-9_.-]{1,63}/)?[A-Za-z0-9_.-]{1,63}$")
_TAG_VALUE = re.compile(r"^[A-Za-z0-9_.-]{0,63}$")


def dagster_name(text: str) -> str:
    """``text`` as a Dagster identifier (other characters become ``_``)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", text)
    return name if name and not name[0].isdigit() else f"s_{name}"


def expand(text: str, env: Mapping[str, str]) -> str:
    """Expand ``${VAR}`` / ``${VAR:-default}``; an unset VAR without default is an error."""

    def sub(match: re.Match[str]) -> str:
        var, default = match.group(1), match.group(2)
        value = env.get(var) or None
        if value is None and var == ENV_HOME:
            return str(upsert_home(env))
        if value is None:
            if default is None:
                raise ConfigError(f"${{{var}}} is not set (use ${{{var}:-default}})")
            return default
        return value

    return _VAR.sub(sub, text)


def _key(value: Any, where: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items:
        raise ConfigError(f"{where}: key must be a list of column names or 'k1,k2'")
    names = tuple(str(i).strip() for i in items)
    if any(not n for n in names):
        raise ConfigError(f"{where}: key has an empty column name")
    return names


def _order(value: Any, where: str, env: Mapping[str, str]) -> str | None:
    """``order``: a column name, ``"c1,c2"``, or a list of names (an order of several
    columns), as the ``--order`` text the ingest parses; None when not given."""
    if value is None:
        return None
    if isinstance(value, list | tuple):
        names = [expand(str(v), env).strip() for v in value]
        if not names or any(not n or "," in n for n in names):
            raise ConfigError(f"{where}: order must be a column name, 'c1,c2' or a list of"
                              " column names")
        return ",".join(names)
    return _opt_str({"order": value}, "order", where, env)


def _opt_str(entry: Mapping[str, Any], name: str, where: str, env: Mapping[str, str]) -> str | None:
    value = entry.get(name)
    if value is None:
        return None
    if not isinstance(value, str | int):
        raise ConfigError(f"{where}: {name} must be a string")
    return expand(str(value), env)


def _owners(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(o, str) for o in items):
        raise ConfigError(f"{where}: owners must be a list of emails or team:NAME")
    bad = [o for o in items if not _OWNER.match(o)]
    if bad:
        raise ConfigError(f"{where}: owners {bad} are neither emails nor team:NAME")
    return tuple(items)


def _tags(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: tags must be a mapping of names to values")
    pairs = tuple(sorted((str(k), "" if v is None else str(v)) for k, v in value.items()))
    for key, text in pairs:
        if not _TAG_KEY.match(key) or not _TAG_VALUE.match(text):
            raise ConfigError(
                f"{where}: tag {key}: {text!r}: names and values are up to 63 letters,"
                " digits, '_', '-' or '.' (a name may have one 'prefix/')"
            )
    return pairs


def _retention(value: Any, where: str) -> Retention | None:
    """``retention``: N >= 1, a duration (``7d``), ``all``, or null."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return ("keep", value)
    if isinstance(value, str) and value.strip().lower() == "all":
        return ("all", None)
    if isinstance(value, str):
        try:
            return ("keep_for", parse_duration(value))
        except InvalidUsage:
            pass
    raise ConfigError(
        f"{where}: retention must be an integer >= 1 (the last N timestamps), a duration"
        f" such as 7d or 12h (s, m, h, d or w), 'all' or null, got {value!r}"
    )


def parse_source(entry: object, where: str, env: Mapping[str, str]) -> SourceSpec:
    """One ``sources:`` entry as a :class:`SourceSpec`."""
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: each source must be a mapping")
    unknown = set(entry) - _FIELDS
    if unknown:
        raise ConfigError(f"{where}: unknown fields {sorted(unknown)}")
    name = _opt_str(entry, "name", where, env)
    landing = _opt_str(entry, "landing", where, env)
    if not name or not _NAME.match(name):
        raise ConfigError(f"{where}: name {name!r} must be letters, digits and underscores")
    if not landing:
        raise ConfigError(f"{where}: source {name!r} needs a landing location")
    retain = entry.get("gc_retain")
    if retain is not None and (isinstance(retain, bool) or not isinstance(retain, int)
                               or retain < 1):
        raise ConfigError(f"{where}: gc_retain must be an integer >= 1 or null, got {retain!r}")
    interval = entry.get("sensor_interval_s", DEFAULT_SENSOR_INTERVAL_S)
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise ConfigError(
            f"{where}: sensor_interval_s must be an integer >= 1 (seconds), got {interval!r}"
        )
    checks = parse_value_checks(entry.get("checks"), f"{where} (source {name!r}): checks")
    deleted = _opt_str(entry, "deleted_col", where, env)
    for c in checks:
        if c.column == deleted:
            raise ConfigError(
                f"{where} (source {name!r}): checks: column {c.column!r} is the delete marker"
                " column, which cannot be value-checked"
            )
    return SourceSpec(
        name=name,
        landing=landing,
        shard=_opt_str(entry, "shard", where, env) or name,
        key=_key(entry.get("key"), where),
        order=_order(entry.get("order"), where, env),
        deleted_col=_opt_str(entry, "deleted_col", where, env),
        order_scope=_opt_str(entry, "order_scope", where, env),
        envelope=_opt_str(entry, "envelope", where, env),
        # YAML reads `missing: null` as no value; it names the setting null (so a shard
        # stored as keep refuses it), as an unset key does not.
        missing=("null" if "missing" in entry and entry["missing"] is None
                 else _opt_str(entry, "missing", where, env)),
        unavailable=_opt_str(entry, "unavailable", where, env),
        gc_cron=_opt_str(entry, "gc_cron", where, env) or DEFAULT_GC_CRON,
        gc_retain=retain,
        retention=_retention(entry.get("retention"), where),
        sensor_interval_s=interval,
        description=_opt_str(entry, "description", where, env),
        owners=_owners(entry.get("owners"), where),
        tags=_tags(entry.get("tags"), where),
        checks=checks,
        origin=where,
    )


def env_source(env: Mapping[str, str]) -> SourceSpec | None:
    """The source the ``UPSERT_*`` variables describe, if ``UPSERT_LANDING`` is set."""
    landing = env.get(ENV_LANDING)
    if not landing:
        return None
    shard = env.get(ENV_SHARD) or DEFAULT_ENV_SHARD
    return SourceSpec(
        name=dagster_name(shard),
        landing=landing,
        shard=shard,
        key=_key(env.get(ENV_KEY) or None, ENV_KEY),
        order=env.get(ENV_ORDER) or None,
        deleted_col=env.get(ENV_DELETED) or None,
        order_scope=env.get(ENV_SCOPE) or None,
        origin="environment",
    )


def merge_sources(listed: Sequence[SourceSpec], extra: SourceSpec | None) -> list[SourceSpec]:
    """``listed`` plus ``extra`` (replacing any with its name or shard); checks uniqueness."""
    sources = list(listed)
    if extra is not None:
        sources = [s for s in sources if s.name != extra.name and s.shard != extra.shard]
        sources.append(extra)
    for attr in ("name", "shard"):
        seen: dict[str, SourceSpec] = {}
        for s in sources:
            other = seen.setdefault(getattr(s, attr), s)
            if other is not s:
                raise ConfigError(
                    f"sources {other.name!r} ({other.origin}) and {s.name!r} ({s.origin})"
                    f" share the {attr} {getattr(s, attr)!r}"
                )
    return sorted(sources, key=lambda s: s.name)


def read_sources_file(path: Path, env: Mapping[str, str]) -> list[SourceSpec]:
    """The sources listed in ``path`` (an absent file lists none)."""
    if not path.exists():
        return []
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read sources: {exc}") from exc
    entries = data.get("sources") if isinstance(data, dict) else None
    if entries is None:
        entries = []
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: 'sources' must be a list")
    return [parse_source(e, f"{path}: sources[{i}]", env) for i, e in enumerate(entries)]


def load_sources(
    path: str | Path | None = None, env: Mapping[str, str] | None = None
) -> list[SourceSpec]:
    """Every source of the code location (see the module docstring), sorted by name."""
    env = os.environ if env is None else env
    file = Path(path) if path else sources_file(env)
    listed = read_sources_file(file, env) if file is not None else []
    return merge_sources(listed, env_source(env))


def sources_file(env: Mapping[str, str]) -> Path | None:
    """``UPSERT_SOURCES`` (a ConfigError if it does not exist), else ``./sources.yaml``,
    else the checkout's, else None."""
    configured = env.get(ENV_SOURCES, "").strip()
    if configured:
        path = Path(configured).expanduser()
        if not path.is_file():
            raise ConfigError(f"{ENV_SOURCES}={configured}: no such file")
        return path
    for candidate in (Path.cwd() / "sources.yaml", CHECKOUT_SOURCES_FILE):
        if candidate.is_file():
            return candidate
    return None
