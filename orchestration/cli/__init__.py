"""``upsertctl``, the command line (see CONTRACT.md, "Command line"), one program beside
the Dagster code location (``orchestration.definitions``), which never imports it.

- :mod:`~orchestration.cli.main`: arguments, dispatch, exit statuses (``main``, ``entry``);
- :mod:`~orchestration.cli.commands`: what each command does;
- :mod:`~orchestration.cli.ingest`: ``upsertctl ingest`` (engine, progress, report);
- :mod:`~orchestration.cli.config`: where the stores are (``upsert_core.stores``) and
  the shard a command opens;
- :mod:`~orchestration.cli.output` / :mod:`~orchestration.cli.progress`: data on stdout,
  progress and summaries on stderr;
- :mod:`~orchestration.cli.demo` / :mod:`~orchestration.cli.demo_landing`: ``upsertctl
  demo`` and its sample landing files.
"""

from orchestration.cli.main import entry, main

__all__ = ["entry", "main"]
