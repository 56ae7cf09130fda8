"""Fuzz bookkeeping: every fuzz test counts the inputs it tried, summed per session.

The total is printed in the terminal summary (``fuzz inputs tried: ...``) so the README's
reliability section can quote it.
"""

from __future__ import annotations

from collections import Counter

import pytest

TRIED: Counter[str] = Counter()


@pytest.fixture(scope="session")
def fuzz_counter() -> Counter[str]:
    return TRIED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not TRIED:
        return
    total = sum(TRIED.values())
    parts = ", ".join(f"{name}={count}" for name, count in sorted(TRIED.items()))
    terminalreporter.write_line(f"fuzz inputs tried: {total} ({parts})")
