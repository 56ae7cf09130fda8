"""The project's exception hierarchy.

One root, :class:`UpsertPlatformError`, so callers (the CLI, Dagster assets) can catch
everything the platform raises on purpose and print one clear line. Subclasses say
*what kind* of thing went wrong; messages say *which* file, shard or key, and what to do
next.

Persist location errors follow the reference's split by what the caller can know:

- :class:`DeterminateError`: the operation definitely did not happen; retrying is safe.
  Its subclass :class:`LocationUnreachable` says the store already retried for its
  whole reconnect window: callers report it instead of retrying again.
- :class:`IndeterminateError`: the operation may or may not have happened (a timeout,
  a dropped connection after the request was sent). The caller must find out, e.g.
  by re-reading the head, before assuming either outcome.
"""

from __future__ import annotations


class UpsertPlatformError(Exception):
    """Root of every error the platform raises on purpose."""


# --- codec and upsert state -------------------------------------------------------


class CodecError(UpsertPlatformError):
    """Bytes that are not a valid encoding, or a value the codec cannot encode."""


class InvalidUpsertState(UpsertPlatformError):
    """A consolidating accumulator ended in neither valid end state.

    Raised by ``StateValue.ensure_decoded`` instead of decoding garbage. ``state``
    carries the accumulator so the error can be reported and investigated.
    """

    def __init__(self, message: str, state: object = None) -> None:
        super().__init__(message)
        self.state = state


class SnapshotAlreadyCompleted(UpsertPlatformError):
    """A second snapshot completion was fed to an ``UpsertState``."""


class InvalidSourceUpdate(UpsertPlatformError):
    """A source update that the upsert operator cannot accept (e.g. diff <= 0)."""


class StateBackendError(UpsertPlatformError):
    """An upsert state backend failed to read or write."""


# --- persist: locations -----------------------------------------------------------


class LocationError(UpsertPlatformError):
    """A Consensus or Blob operation failed."""


class DeterminateError(LocationError):
    """The operation definitely did not take effect; it is safe to retry."""


class LocationUnreachable(DeterminateError):
    """The store could not be reached for the whole of its own retry window. Nothing
    happened; callers should not retry again at once (the window already covered that)."""


class IndeterminateError(LocationError):
    """The operation may or may not have taken effect (e.g. a timeout)."""


# --- persist: shard ---------------------------------------------------------------


class ShardError(UpsertPlatformError):
    """A problem with a shard's state or the request made of it."""


class ShardNotFound(ShardError):
    """The shard has never been initialised."""


class InvalidStateDiff(ShardError):
    """A state diff does not apply: its ``from`` does not match the current state."""


class InvalidUsage(ShardError):
    """The caller asked for something the shard cannot do (e.g. read before since)."""


class NotReadable(InvalidUsage):
    """A read outside ``[since, upper)``; the message says what is readable."""


class ConcurrentModification(ShardError):
    """The shard was concurrently modified and the operation gave up."""


class InvariantViolation(ShardError):
    """A storage or consolidation invariant does not hold (reported by ``check``)."""


class CorruptData(ShardError):
    """Stored bytes (a rollup, a diff, a part) cannot be decoded."""


# --- ingestion ----------------------------------------------------------------------


class IngestError(UpsertPlatformError):
    """A file-level problem that stops an ingest at one file."""


class LandingFileChanged(IngestError):
    """A landing file changed between its listing and its reading (it is probably still
    being written). Not a problem with the file: the ingest leaves it, and the files
    after it, pending for the next run. An :class:`IngestError` so that a caller that
    does not know it still stops at the file and applies nothing of it."""


class ConfigError(UpsertPlatformError):
    """Bad configuration: a URL, an option, a conflicting ingest option."""


# --- persist: location usage ----------------------------------------------------------


class InvalidSeqNo(InvalidUsage, ValueError):
    """A consensus call with a bad sequence number (negative, too large, or not greater
    than the expected head). Also a ``ValueError``, as the ``Consensus`` contract says."""


class LeaseExpired(ShardError):
    """A reader or writer lease is no longer in the shard state (expired or released)."""


class WriterFenced(LeaseExpired):
    """A commit from a writer whose registration is gone (its lease expired, GC removed it
    because its process is dead, or it released it). Determinate: nothing was committed.
    The writer's unreferenced blobs may already be deleted; register a new writer id and
    write again."""
