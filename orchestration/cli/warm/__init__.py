"""A warm ``upsertctl``: commands run in forks of a process that imported pyarrow, numpy
and the platform once (:mod:`~orchestration.cli.warm.client`, the command's side, imports
nothing heavy; :mod:`~orchestration.cli.warm.server`, the warm process)."""
