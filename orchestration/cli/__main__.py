"""``python -m orchestration.cli``: the same as the ``upsertctl`` console script."""

from orchestration.cli import entry

entry()
