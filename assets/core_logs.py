"""Warnings the core logs, shown in the Dagster run that caused them.

``upsert_core`` reports trouble it recovers from (a failed rollup, a writer heartbeat
that failed, an unreadable GC record) through the standard ``logging`` module under the
``upsert_core`` logger. Dagster captures only the loggers an instance names
(``python_logs.managed_python_loggers`` in ``dagster.yaml``, set in ``deploy/``); this
module forwards them from inside an asset's body whatever the instance says, so a run's
event log always shows them.

Invariants:

- Only records at WARNING or above are forwarded, each once, with the logger's name.
- The handler is attached for the ``with`` block only and removed afterwards, even on
  failure; records from other threads of the same process during the block are
  forwarded too (the ingest's bucket threads).
- When the instance already captures ``upsert_core`` (:func:`instance_captures_core`),
  nothing is forwarded, so a record never appears twice.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

CORE_LOGGER = "upsert_core"


class RunLog(Protocol):
    """The part of Dagster's ``context.log`` used here."""

    def warning(self, msg: str) -> None: ...

    def error(self, msg: str) -> None: ...


class _ToRunLog(logging.Handler):
    def __init__(self, log: RunLog) -> None:
        super().__init__(level=logging.WARNING)
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = f"{record.name}: {record.getMessage()}"
            if record.levelno >= logging.ERROR:
                self.log.error(message)
            else:
                self.log.warning(message)
        except Exception:  # noqa: BLE001 - logging must never break the run
            self.handleError(record)


def instance_captures_core(instance: Any) -> bool:
    """Whether the Dagster instance's ``python_logs`` already captures ``upsert_core``."""
    try:
        settings = instance.get_settings("python_logs") or {}
    except Exception:  # noqa: BLE001 - an instance without settings captures nothing
        return False
    managed = settings.get("managed_python_loggers") or []
    return CORE_LOGGER in managed


@contextmanager
def forward_core_logs(log: RunLog, instance: Any = None) -> Iterator[None]:
    """Forward ``upsert_core`` warnings and errors to ``log`` inside the block (unless
    ``instance`` captures them already)."""
    if instance is not None and instance_captures_core(instance):
        yield
        return
    logger = logging.getLogger(CORE_LOGGER)
    handler = _ToRunLog(log)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
