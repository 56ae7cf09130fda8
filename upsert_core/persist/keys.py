"""Where a shard's things live: its consensus key and its blob keys.

Every module that names a blob builds the name here, so the layout has one definition:

- consensus key of a shard: the shard id itself;
- ``{shard}/rollup/{seqno:020d}-{uuid}``: full state rollups (the zero-padded seqno
  sorts lexicographically and is recoverable with :func:`parse_rollup_seqno`);
- ``{shard}/part/{uuid}.parquet``: batch parts;
- ``{shard}/errors/{uuid}.parquet``: error parts;
- ``{shard}/late/{uuid}.parquet``: late parts (a bucket's late rows of one batch,
  ``ingest.late``);
- ``{shard}/checkpoint/...``: upsert state checkpoints.

Writer identity. A process that writes blobs it will commit first registers a *writer
id* in the shard's state (``persist.write.writers``): ``<host id>.<pid>.<nonce>`` from
:func:`new_writer_id`, fresh for every registration. While it writes, every generated key
names it: the unique part starts with it, ``{shard}/part/<writer id>-<uuid>.parquet``
(:func:`writing_as` sets it for the current thread or task; ingest tasks set it from
``FileTask.writer_id``, so Spark executors, local or remote, name their blobs after the
registration of the driver that will commit them). GC deletes an unreferenced blob
naming a writer id only once that id is not registered in the shard; a writer whose
registration is gone is fenced (``append`` refuses its commits), so such a blob can never
become referenced (see ``persist.maintenance.gc`` and ``persist.write.writers``).

Older keys carry a *legacy token* ``<host id>.<pid>`` (no nonce; from
:func:`claim_writer_token` and ``UPSERT_WRITER_TOKEN``) or nothing. They are never
registered; GC keeps its grace-period rule for them (:func:`writer_is_dead` shortens it
for a dead local process).

Invariants: every key of a shard starts with :func:`shard_prefix`; shard names are
validated (no ``/``, no ``..``) so no key escapes its prefix; every generated key of a
part, error part or rollup is unique (a fresh uuid4), so two writers never overwrite
each other's blobs even when they race for the same seqno.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from upsert_core.persist.state.state import validate_shard_name

ROLLUP_DIR = "rollup"
PART_DIR = "part"
ERRORS_DIR = "errors"
LATE_DIR = "late"
CHECKPOINT_DIR = "checkpoint"

WRITER_TOKEN_ENV = "UPSERT_WRITER_TOKEN"
_TOKEN_RE = re.compile(
    r"^(?P<host>[0-9a-f]{12})\.(?P<pid>[0-9]{1,10})(?:\.(?P<nonce>[0-9a-f]{16}))?$"
)
_UNIQUE = r"(?:(?P<token>[0-9a-f]{12}\.[0-9]{1,10}(?:\.[0-9a-f]{16})?)-)?(?P<id>[0-9a-f]{32})"
_current_writer: ContextVar[str | None] = ContextVar("upsert_writer_id", default=None)
_ROLLUP_KEY_RE = re.compile(r"^(?P<shard>[^/]+)/rollup/(?P<seqno>[0-9]{20})-" + _UNIQUE + "$")
_UNIQUE_IN_KEY_RE = re.compile(r"(?:^|/|-)" + _UNIQUE + r"(?:\.[a-z]+)?$")


def host_id() -> str:
    """A short id of where this process's pids mean something: hostname, kernel boot id
    and PID namespace, hashed.

    Two containers that share a hostname and kernel (host networking) but not a PID
    namespace get different ids, so neither takes the other's live writer for dead; a
    reboot changes the boot id, so pids of a previous boot are never mistaken for
    running processes.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    try:
        pid_ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pid_ns = ""
    digest = hashlib.sha1(f"{socket.gethostname()}|{boot}|{pid_ns}".encode()).hexdigest()
    return digest[:12]


def claim_writer_token() -> str:
    """Mark this process (and the Spark workers it starts) as the writer of new blobs.

    Returns the token ``<host id>.<pid>``. Call it once at the start of a writing command
    (``upsertctl ingest``, a Dagster ingest run); the Spark engine ships it with every
    task, so it may be claimed before or after a session starts.
    """
    token = f"{host_id()}.{os.getpid()}"
    os.environ[WRITER_TOKEN_ENV] = token
    return token


def current_writer_token() -> str | None:
    """This process's claimed writer token (or the driver's, in a Spark task), if any."""
    token = os.environ.get(WRITER_TOKEN_ENV, "")
    return token if _TOKEN_RE.match(token) else None


def new_writer_id() -> str:
    """A fresh writer id ``<host id>.<pid>.<nonce>`` to register in a shard.

    Fresh on every call: a writer that lost its registration registers a NEW id, so a
    stalled process holding the old one can never be mistaken for the new one.
    """
    return f"{host_id()}.{os.getpid()}.{secrets.token_hex(8)}"


def is_writer_id(token: str) -> bool:
    """Whether ``token`` is a registrable writer id (not a legacy token)."""
    match = _TOKEN_RE.match(token)
    return match is not None and match.group("nonce") is not None


@contextmanager
def writing_as(writer_id: str | None) -> Iterator[None]:
    """Name the blobs generated in this thread (or task) after ``writer_id``.

    ``None`` leaves the current naming alone. The caller must hold a registration of
    ``writer_id`` in the shard BEFORE writing, or GC may delete the blobs at once.
    """
    if writer_id is None:
        yield
        return
    if not is_writer_id(writer_id):
        raise ValueError(f"not a writer id: {writer_id!r}")
    reset = _current_writer.set(writer_id)
    try:
        yield
    finally:
        _current_writer.reset(reset)


def current_writer_id() -> str | None:
    """The registered writer id blobs are generated for here, if any."""
    return _current_writer.get()


def unique_name() -> str:
    """A fresh unique name for a blob: ``[<writer id or legacy token>-]<uuid4 hex>``."""
    token = current_writer_id() or current_writer_token()
    unique = uuid.uuid4().hex
    return f"{token}-{unique}" if token else unique


def writer_id_of(key: str) -> str | None:
    """The registrable writer id named by ``key`` (None: a legacy token or none)."""
    match = _UNIQUE_IN_KEY_RE.search(key)
    if match is None or match.group("token") is None:
        return None
    token = match.group("token")
    return token if is_writer_id(token) else None


def writer_of(key: str) -> tuple[str, int] | None:
    """The (host id, pid) of the writer id or legacy token embedded in ``key``."""
    match = _UNIQUE_IN_KEY_RE.search(key)
    if match is None or match.group("token") is None:
        return None
    token = _TOKEN_RE.match(match.group("token"))
    assert token is not None  # the key regex only admits well-formed tokens
    return token.group("host"), int(token.group("pid"))


def process_is_dead(token: str) -> bool:
    """True only when writer id or legacy token ``token`` names a process on THIS host
    (and PID namespace) that is no longer running; see :func:`writer_is_dead`."""
    match = _TOKEN_RE.match(token)
    if match is None:
        return False
    pid = int(match.group("pid"))
    return match.group("host") == host_id() and pid != os.getpid() and not pid_running(pid)


def pid_running(pid: int) -> bool:
    """Whether process ``pid`` runs here (in this PID namespace); True when unsure."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # exists but is not ours, or not a pid we can judge: assume alive
    return True


def writer_is_dead(key: str) -> bool:
    """True only when ``key`` names a writer on THIS host (and PID namespace) whose
    process has ended.

    SUBTLE: "dead" must never be said of a writer that may still commit the blob. The
    token is the committing process's (the driver's, shipped with every Spark task), so
    an executor exiting early does not make its blobs look dead; a reused pid
    only makes a dead writer look alive, which merely delays the deletion.
    """
    match = _UNIQUE_IN_KEY_RE.search(key)
    if match is None or match.group("token") is None:
        return False
    return process_is_dead(match.group("token"))


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
    return f"{rollup_prefix(shard)}{seqno:020d}-{unique_name()}"


def part_key(shard: str) -> str:
    """A fresh, unique blob key for a batch part of ``shard``."""
    return f"{shard_prefix(shard)}{PART_DIR}/{unique_name()}.parquet"


def error_part_key(shard: str) -> str:
    """A fresh, unique blob key for an error part of ``shard``."""
    return f"{shard_prefix(shard)}{ERRORS_DIR}/{unique_name()}.parquet"


def late_part_key(shard: str) -> str:
    """A fresh, unique blob key for a late part of ``shard`` (``ingest.late``)."""
    return f"{shard_prefix(shard)}{LATE_DIR}/{unique_name()}.parquet"


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
