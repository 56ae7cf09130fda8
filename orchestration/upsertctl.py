"""The ``upsertctl`` console script (``python -m orchestration.upsertctl`` is the same).

It imports nothing heavy before it knows where the command runs: in a fork of the warm
process (:mod:`orchestration.warm.client`) where one serves, else here
(:func:`orchestration.cli.main.entry`, which imports the command line).
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def entry() -> NoReturn:
    from orchestration.warm import client

    if client.enabled():
        status = client.run_warm(sys.argv[1:])
        if status is not None:
            os._exit(status)
    from orchestration.cli.main import entry as run_here

    run_here()


if __name__ == "__main__":
    entry()
