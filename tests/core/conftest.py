"""Fixtures for the core tests: every upsert state backend, fresh per test or example.

``backend`` is parametrised over all backends, so a test that takes it runs once per
backend (the shared conformance suite). Hypothesis tests cannot use function-scoped
fixtures, so they take ``make_backend`` (session-scoped) and create a fresh backend per
example with ``make_backend(kind)``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.oracle.backends import InMemoryBackend, SqliteBackend
from tests.oracle.state import StateBackend

BACKEND_KINDS = ("memory", "sqlite")

MakeBackend = Callable[[str], StateBackend]


@pytest.fixture(scope="session")
def make_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MakeBackend]:
    root: Path = tmp_path_factory.mktemp("state-backends")
    counter = itertools.count()
    opened: list[StateBackend] = []

    def make(kind: str) -> StateBackend:
        backend: StateBackend
        if kind == "memory":
            backend = InMemoryBackend()
        elif kind == "sqlite":
            backend = SqliteBackend(root / f"state-{next(counter)}.sqlite")
        else:
            raise ValueError(f"unknown backend kind {kind!r}")
        opened.append(backend)
        return backend

    yield make
    for backend in opened:
        backend.close()


@pytest.fixture(params=BACKEND_KINDS)
def backend_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def backend(backend_kind: str, make_backend: MakeBackend) -> StateBackend:
    return make_backend(backend_kind)
