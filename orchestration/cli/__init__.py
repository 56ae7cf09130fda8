"""``upsertctl``, the command line (see CONTRACT.md, "Command line"), one program beside
the Dagster code location (``orchestration.definitions``), which never imports it.

- :func:`entry` (this module): the console script; it imports nothing heavy before it
  knows where the command runs: in a fork of the warm ``upsertctl`` process
  (:mod:`~orchestration.cli.warm`) where one serves, else in this process;
- :mod:`~orchestration.cli.main`: arguments, dispatch, exit statuses (``main``, ``entry``);
- :mod:`~orchestration.cli.commands`: what each command does;
- :mod:`~orchestration.cli.ingest`: ``upsertctl ingest`` (engine, progress, report);
- :mod:`~orchestration.cli.config`: where the stores are (``upsert_core.stores``) and
  the shard a command opens;
- :mod:`~orchestration.cli.output` / :mod:`~orchestration.cli.progress`: data on stdout,
  progress and summaries on stderr;
- :mod:`~orchestration.cli.warm`: the warm process commands run in (its client and
  server);
- :mod:`~orchestration.cli.demo` / :mod:`~orchestration.cli.demo_landing`: ``upsertctl
  demo`` and its sample landing files.

This package's ``__init__`` imports nothing of the command line itself, so the console
script starts in milliseconds; ``main`` lives in :mod:`orchestration.cli.main`.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from orchestration.cli.warm import client


def entry() -> NoReturn:
    """The ``upsertctl`` console script (``python -m orchestration.cli`` is the same)."""
    if client.enabled():
        status = client.run_warm(sys.argv[1:])
        if status is not None:
            os._exit(status)
    # heavy: the command line, only where no warm process runs the command
    from orchestration.cli.main import entry as run_here

    run_here()
