"""The fenced blocks of the README and ``docs/*.md``, and what each one asks of the test.

A block is run, or it says in the markdown why not:

- ```` ```bash ```` / ```` ```sh ```` (a shell session) and ```` ```python ```` are run on the
  embedded defaults, in document order; the attribute ``spark`` (```` ```python spark ````)
  marks one that starts a local Spark, ``cluster`` one that needs PostgreSQL, S3 and Spark
  Connect: it runs in the cluster half, on ``deploy/cluster.sh``.
- ```` ```yaml source ```` is a fragment of a source entry of ``sources.yaml``: the test adds
  it to the ``demo`` source and loads the file.
- ```` ```text ```` (or ``console``, ``output``) is shown, never run: output, a layout.
- A runnable block that must not run says so on the line before its fence:
  ``<!-- not run: REASON -->`` (a placeholder to fill in, the whole test suite, ...).

Anything else (no info string, another language, an unknown attribute, a ``not run``
comment without a reason) is a problem :func:`problems` reports, so a new block cannot
be skipped silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHELL, PYTHON, SOURCE_YAML, SHOWN = "shell", "python", "source-yaml", "shown"
RUN_LANGUAGES = {"bash": SHELL, "sh": SHELL, "python": PYTHON, "yaml": SOURCE_YAML}
SHOWN_LANGUAGES = {"text", "console", "output"}
ATTRIBUTES = {SHELL: {"cluster", "spark"}, PYTHON: {"cluster", "spark"},
              SOURCE_YAML: {"source"}}
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)(?P<info>.*)$")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:(?P<reason>.*?)-->\s*$")


@dataclass(frozen=True)
class Block:
    doc: str  # path from the repository root
    line: int  # of the opening fence, from 1
    language: str
    attributes: tuple[str, ...]
    text: str
    not_run: str | None = None  # the reason a "<!-- not run: ... -->" comment gives

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def kind(self) -> str | None:
        """SHELL, PYTHON, SOURCE_YAML, SHOWN, or None (unmarked)."""
        if self.language in SHOWN_LANGUAGES or self.not_run:
            return SHOWN
        kind = RUN_LANGUAGES.get(self.language)
        if kind == SOURCE_YAML and "source" not in self.attributes:
            return None
        return kind

    @property
    def runs(self) -> bool:
        return self.kind in (SHELL, PYTHON, SOURCE_YAML)

    @property
    def cluster(self) -> bool:
        return "cluster" in self.attributes

    @property
    def spark(self) -> bool:
        return "spark" in self.attributes or self.cluster

    def problem(self) -> str | None:
        """Why this block is neither run nor marked as not run (None: it is fine)."""
        if self.not_run is not None and not self.not_run.strip():
            return f"{self.id}: a 'not run' comment must give its reason"
        if self.kind is None:
            shown = self.language or "no info string"
            return (f"{self.id}: ```{shown} is neither run nor marked: use bash, python or"
                    f" yaml source to run it, text to show it, or <!-- not run: REASON -->")
        unknown = set(self.attributes) - ATTRIBUTES.get(self.kind, set())
        if unknown and self.kind != SHOWN:
            return f"{self.id}: unknown attribute(s) {sorted(unknown)} of ```{self.language}"
        return None


def documents() -> list[str]:
    """The README and every markdown file under docs/, from the repository root."""
    docs = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))
    return ["README.md", *docs]


def blocks(doc: str) -> list[Block]:
    """The fenced blocks of ``doc``, in order."""
    lines = (REPO / doc).read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        info = opening["info"].split()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence)
                                      and not lines[j].strip()[len(fence):].strip()):
            body.append(lines[j][indent:] if lines[j][:indent].isspace() else lines[j])
            j += 1
        previous = lines[i - 1] if i > 0 else ""
        comment = NOT_RUN.match(previous)
        out.append(Block(doc, i + 1, info[0] if info else "", tuple(info[1:]),
                         "\n".join(body) + "\n", comment["reason"].strip() if comment else None))
        i = j + 1
    return out


def problems() -> list[str]:
    return [p for doc in documents() for b in blocks(doc) if (p := b.problem()) is not None]
