"""Docs cannot drift (issue 23): every fenced block of the README and ``docs/*.md`` is run,
in document order, or says in the markdown why not (``tests/docs/blocks.py``).

One test per runnable block, on one session per document (``tests/docs/session.py``): a
block's test first runs the document's earlier blocks that have not run yet, so a
block can be run alone (``-k``) and still find what the document set up before it.
Embedded blocks come first, on the embedded defaults; then the cluster half (marked
``cluster``, as ``tests/e2e``'s), on ``deploy/cluster.sh``: ``-m "not cluster"`` runs the
first half alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs.blocks import Block, blocks, documents, problems
from tests.docs.session import DocSession, venv_is_installed

CLUSTER_MARKS = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.postgres, pytest.mark.s3,
                 pytest.mark.slow]


def _param(block: Block) -> object:
    marks = CLUSTER_MARKS if block.cluster else [pytest.mark.spark] if block.spark else []
    return pytest.param(block, id=block.id, marks=marks)


RUNNABLE = [b for doc in documents() for b in blocks(doc) if b.runs]
PARAMS = ([_param(b) for b in RUNNABLE if not b.cluster]
          + [_param(b) for b in RUNNABLE if b.cluster])


class Sessions:
    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self.factory = factory
        self.open: dict[str, DocSession] = {}

    def get(self, doc: str) -> DocSession:
        if doc not in self.open:
            self.open[doc] = DocSession(doc, Path(self.factory.mktemp("doc")))
        return self.open[doc]


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sessions]:
    why = venv_is_installed()
    if why:
        pytest.fail(why)
    opened = Sessions(tmp_path_factory)
    yield opened
    left = {doc: session.close() for doc, session in opened.open.items()}
    left = {doc: procs for doc, procs in left.items() if procs}
    assert not left, f"processes the documents' commands started were left running: {left}"


def test_every_block_is_run_or_marked_as_not_run() -> None:
    assert problems() == []


@pytest.mark.parametrize(("language", "attributes", "not_run", "fine"), [
    ("bash", (), None, True),
    ("python", ("spark",), None, True),
    ("bash", ("cluster",), None, True),
    ("text", (), None, True),
    ("bash", (), "a placeholder to fill in", True),
    ("yaml", ("source",), None, True),
    ("", (), None, False),  # no info string
    ("yaml", (), None, False),  # what would it be run as?
    ("json", (), None, False),
    ("bash", ("cluser",), None, False),  # a typo is not a mark
    ("bash", (), "", False),  # "not run" needs its reason
])
def test_a_block_is_run_or_says_why_not(
    language: str, attributes: tuple[str, ...], not_run: str | None, fine: bool
) -> None:
    block = Block("x.md", 1, language, attributes, "true\n", not_run)
    assert (block.problem() is None) is fine, block.problem()


def test_the_runner_finds_every_document() -> None:
    assert {"README.md", "docs/dagster.md", "docs/deploy.md"} <= set(documents())
    assert RUNNABLE, "no block to run"


@pytest.mark.parametrize("block", PARAMS)
def test_block(block: Block, sessions: Sessions) -> None:
    sessions.get(block.doc).run_through(block)
