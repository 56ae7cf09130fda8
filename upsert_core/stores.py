"""Where shards live: consensus and blob URLs from arguments, environment, defaults.

Shared by ``upsertctl``, Dagster and :func:`upsert_core.open_shard`, so every entry point
finds the same shards.

Precedence, per setting: the explicit argument, then the environment variable, then
the embedded default under ``$UPSERT_HOME`` (default ``./.upsert``):

- consensus: the argument (``--consensus``) > ``UPSERT_CONSENSUS_URL`` >
  ``sqlite:///$UPSERT_HOME/consensus.db``
- blob: the argument (``--blob``) > ``UPSERT_BLOB_URL`` > ``file://$UPSERT_HOME/blob``

Invariants:

- ``UPSERT_HOME`` is made absolute once, so the defaults do not depend on how a URL
  parser reads a relative path; it is created only when a default actually uses it.
- Opening stores is the caller's choice (:func:`open_stores`); resolving URLs never
  touches the network or the disk beyond creating ``$UPSERT_HOME``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from upsert_core.errors import ShardNotFound
from upsert_core.redact import redact_url

if TYPE_CHECKING:
    from upsert_core.persist.location import Blob, Consensus

ENV_HOME = "UPSERT_HOME"
ENV_CONSENSUS = "UPSERT_CONSENSUS_URL"
ENV_BLOB = "UPSERT_BLOB_URL"
DEFAULT_HOME = "./.upsert"


def upsert_home(env: Mapping[str, str] | None = None) -> Path:
    """The absolute ``$UPSERT_HOME`` (not created)."""
    env = os.environ if env is None else env
    return Path(env.get(ENV_HOME) or DEFAULT_HOME).expanduser().absolute()


@dataclass(frozen=True)
class StoreConfig:
    """The resolved locations of a shard's metadata (consensus) and data (blob)."""

    consensus_url: str
    blob_url: str
    home: Path
    uses_home: bool

    def ensure_home(self) -> None:
        """Create ``$UPSERT_HOME`` if a default location lives in it."""
        if self.uses_home:
            (self.home / "blob").mkdir(parents=True, exist_ok=True)


def resolve(
    consensus: str | None, blob: str | None, env: Mapping[str, str] | None = None
) -> StoreConfig:
    """Resolve the two URLs by flag > environment > default (see the module docstring)."""
    env = os.environ if env is None else env
    home = upsert_home(env)
    uses_home = False
    consensus_url = consensus or env.get(ENV_CONSENSUS) or ""
    if not consensus_url:
        consensus_url = f"sqlite:///{home / 'consensus.db'}"
        uses_home = True
    blob_url = blob or env.get(ENV_BLOB) or ""
    if not blob_url:
        blob_url = f"file://{home / 'blob'}"
        uses_home = True
    return StoreConfig(consensus_url, blob_url, home, uses_home)


def open_stores(
    config: StoreConfig, *, create: bool = True, shard: str | None = None
) -> tuple[Consensus, Blob]:
    """Open the consensus and blob the config names (creating ``$UPSERT_HOME`` if used).

    With ``create=False`` (a read) nothing is created: a SQLite consensus whose file does
    not exist holds no shard, so :class:`ShardNotFound` (naming ``shard``) is raised
    before it is opened (opening would create the file, and ``$UPSERT_HOME`` with it)."""
    # heavy: sqlite3 and the store modules (~25 ms), off the CLI's start-up path
    from upsert_core.persist.location.urls import open_blob, open_consensus

    if not create:
        missing = sqlite_file_missing(config.consensus_url)
        if missing is not None:
            name = "the shard" if shard is None else f"shard {shard!r}"
            raise ShardNotFound(
                f"{name} has not been initialised (no shard exists yet: {missing} does not"
                " exist)"
            )
    else:
        config.ensure_home()
    return open_consensus(config.consensus_url), open_blob(config.blob_url)


SHARDS_SHOWN = 10


def shard_names(consensus: Consensus) -> list[str]:
    """The names of the shards ``consensus`` holds, sorted."""
    return sorted(consensus.list_keys())


def existing_shards_note(config: StoreConfig) -> str:
    """What a message about a missing shard adds: the consensus it looked in (secrets
    redacted) and the shards that are there, ``" (shards in URL: a, b, ...)"`` or
    ``" (no shard in URL yet)"``, or ``" (looked in URL)"`` when it cannot be listed;
    ``""`` for a SQLite file that does not exist (:func:`open_stores`'s message names
    it). Creates nothing."""
    if sqlite_file_missing(config.consensus_url) is not None:
        return ""
    # heavy: the store modules, only when a shard was not found
    from upsert_core.persist.location.urls import open_consensus

    where = redact_url(config.consensus_url)
    try:
        names = shard_names(open_consensus(config.consensus_url))
    except Exception:  # noqa: BLE001 - the note is a courtesy; the error stands without it
        return f" (looked in {where})"
    if not names:
        return f" (no shard in {where} yet)"
    shown = ", ".join(names[:SHARDS_SHOWN])
    more = f" and {len(names) - SHARDS_SHOWN} more" if len(names) > SHARDS_SHOWN else ""
    return f" (shards in {where}: {shown}{more})"


def sqlite_file_missing(url: str) -> Path | None:
    """The file of a ``sqlite:///PATH`` URL when it does not exist (else None; None also
    for in-memory SQLite and every other kind of consensus)."""
    if not url.startswith("sqlite:///"):
        return None
    path = url[len("sqlite:///"):].split("?", 1)[0]
    if not path or path == ":memory:":
        return None
    file = Path(path)
    return None if file.exists() else file
