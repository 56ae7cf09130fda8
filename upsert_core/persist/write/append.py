"""Compare-and-append: commit a written batch iff the shard's upper is the expected one.

A writer first writes its batch's parts (``parts.write_batch``), then calls
:func:`compare_and_append`, which in ONE state transition checks the shard and appends
the batch together with the landing files it ingested, their error rows and any config
updates. Either all of it is committed or none of it.

Invariants:

- A batch is appended only when the shard's upper equals ``expected_upper`` and the
  batch starts there (``batch.lower == expected_upper < batch.upper``); batches keep
  tiling ``[0, upper)``.
- A landing file is recorded at most once: if any of ``ingested_files`` is already
  recorded, nothing is appended (the result names the duplicates). A file's data and
  its error rows are committed in the same transition as its name, so "recorded" means
  "applied", exactly once.
- A mismatch is an outcome, not an exception: the result says ``committed=False`` and
  gives the actual upper. The CALLER then owns the batch's parts and deletes them
  (:func:`~upsert_core.persist.write.parts.delete_parts`, :func:`delete_uncommitted`).
- An append that already committed (e.g. the caller retries after an indeterminate
  failure) is recognised and reported as committed, never applied twice and never
  reported as a mismatch, so its parts are never deleted by mistake.
- The writer must be registered (``persist.write.writers``) in the state the append commits
  on, checked in the same transition; otherwise :class:`~upsert_core.errors.WriterFenced`
  is raised and nothing is committed; so is every blob the append starts to reference
  (parts, error parts, ``blobref.`` config) whose key names a writer id the state does
  not register, whoever commits it. GC deletes the blobs of writers it removed, so this
  is what keeps a stalled writer's parts, which may be gone, out of every state. The
  transition also refreshes the writer's heartbeat.
- The transition records the batch's commit time (``now_ms``, never below the last
  recorded one) and drops the commit times wholly below ``since``
  (``persist.state.commit_times``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from upsert_core.errors import InvalidUsage
from upsert_core.persist.location import Blob
from upsert_core.persist.state.commit_times import record_commit
from upsert_core.persist.state.machine import Machine
from upsert_core.persist.state.state import ErrorBatch, HollowBatch, ShardState
from upsert_core.persist.write.parts import delete_parts
from upsert_core.persist.write.writers import refresh_in, require_new_references_registered
from upsert_core.read_times import require_ts


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """What one :func:`compare_and_append` commits: ``batch`` iff the shard's upper is
    ``expected_upper``, together with the landing files it ingested (name -> ts), their
    error rows and config updates. The mappings and errors are copied on construction,
    so the request cannot change after it was built."""

    batch: HollowBatch
    expected_upper: int
    ingested_files: Mapping[str, int] = field(default_factory=dict)
    errors: Sequence[ErrorBatch] = ()
    config_updates: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ingested_files", dict(self.ingested_files))
        object.__setattr__(self, "errors", tuple(self.errors))
        object.__setattr__(self, "config_updates", dict(self.config_updates))


@dataclass(frozen=True, slots=True)
class AppendResult:
    """The outcome of :func:`compare_and_append`.

    ``committed``: the batch is part of ``state``. Otherwise ``actual_upper`` is the
    shard's upper that did not match, or ``duplicate_files`` names landing files that
    were already ingested (then nothing was appended). ``state`` is the current state.
    """

    committed: bool
    actual_upper: int
    state: ShardState
    duplicate_files: tuple[str, ...] = ()

    @property
    def upper_mismatch(self) -> bool:
        return not self.committed and not self.duplicate_files


@dataclass(slots=True)
class _Verdict:
    committed: bool = False
    duplicates: tuple[str, ...] = ()


def _check_request(request: AppendRequest) -> None:
    batch, expected_upper = request.batch, request.expected_upper
    for name, value in (("expected_upper", expected_upper), ("batch lower", batch.lower),
                        ("batch upper", batch.upper), ("batch since", batch.since)):
        require_ts(value, name)  # a float or bool would be committed, then unreadable
    if batch.lower != expected_upper or batch.upper <= batch.lower:
        raise InvalidUsage(
            f"cannot append batch [{batch.lower}, {batch.upper}) at expected upper"
            f" {expected_upper}: a batch must start at the expected upper and be non-empty"
        )
    if batch.since != 0:
        raise InvalidUsage(f"a freshly written batch has since 0, got {batch.since}")
    for name, ts in request.ingested_files.items():
        if not batch.lower <= ts < batch.upper:
            raise InvalidUsage(
                f"ingested file {name!r} at ts {ts} outside the batch"
                f" [{batch.lower}, {batch.upper})"
            )
    for err in request.errors:
        if not batch.lower <= err.ts < batch.upper:
            raise InvalidUsage(
                f"error batch at ts {err.ts} outside the batch [{batch.lower}, {batch.upper})"
            )


def _already_applied(state: ShardState, request: AppendRequest) -> bool:
    """Whether ``state`` already holds exactly this append (our batch, files, errors)."""
    return (
        request.batch in state.batches
        and all(state.ingested_files.get(n) == ts for n, ts in request.ingested_files.items())
        and all(e in state.errors for e in request.errors)
    )


def compare_and_append(
    machine: Machine,
    request: AppendRequest,
    *,
    max_retries: int | None = None,
    writer_id: str,
    now_ms: int = 0,
) -> AppendResult:
    """Append ``request.batch`` (and record its files, errors, config) iff the shard's
    upper is ``request.expected_upper``.

    Raises :class:`InvalidUsage` for a malformed request (a batch that does not start
    at ``expected_upper``, files or errors outside the batch), and
    :class:`~upsert_core.errors.WriterFenced` when ``writer_id`` is not registered.
    Races with other writers are retried by the machine; a real mismatch is returned,
    not raised. ``now_ms`` refreshes the writer's heartbeat (never moves it back) and is
    the batch's commit time (``persist.state.commit_times``; never below the last one).
    """
    _check_request(request)
    batch, files = request.batch, request.ingested_files
    # SUBTLE: the transition may run several times (once per lost race, or again on a
    # fresh state); ``verdict`` is overwritten each time, so after ``apply`` returns it
    # holds the verdict on the state that ended up current.
    verdict = _Verdict()

    def append(state: ShardState) -> ShardState | None:
        verdict.committed, verdict.duplicates = False, ()
        if _already_applied(state, request):
            verdict.committed = True
            return None
        if state.upper != request.expected_upper:
            return None
        verdict.duplicates = tuple(sorted(n for n in files if n in state.ingested_files))
        if verdict.duplicates:
            return None
        # SUBTLE: checked after "already applied" (a commit of ours that landed before
        # the registration went is ours) and before any change: a writer that is not
        # registered may have had its blobs deleted by GC, so it must never commit.
        refreshed = refresh_in(state, writer_id, now_ms)
        appended = refreshed.evolve(
            upper=batch.upper,
            batches=(*state.batches, batch),
            ingested_files={**state.ingested_files, **files},
            errors=(*state.errors, *request.errors),
            config=record_commit(
                state, {**state.config, **request.config_updates}, batch.lower, now_ms
            ),
        )
        require_new_references_registered(state, appended)
        verdict.committed = True
        return appended

    state = machine.apply(append, max_retries=max_retries)
    return AppendResult(
        committed=verdict.committed,
        actual_upper=state.upper,
        state=state,
        duplicate_files=verdict.duplicates,
    )


def delete_uncommitted(blob: Blob, batch: HollowBatch, errors: Sequence[ErrorBatch] = ()) -> int:
    """Delete the blob parts of a batch and its error batches after a failed append.

    Only call this when :func:`compare_and_append` returned ``committed=False``.
    """
    return delete_parts(blob, batch.parts) + delete_parts(blob, (e.part for e in errors))
