"""The arrows point one way: upsert_core never imports dagster or pyspark, and the
project's own modules import each other without cycles, down the layers.

The import graph is read from the source with ``ast`` (nothing is imported), over the
modules of :data:`PACKAGES`. An edge ``a -> b`` is an import of project module ``b`` by
module ``a``: ``import b``, ``from b import x``, or ``from p import b`` when ``p.b`` is a
module (relative imports resolved). Importing ``p.q.b`` also runs the packages ``p`` and
``p.q``, so it adds edges to them too (not to ``a``'s own enclosing packages, which are
already running when ``a`` is). Each import is one of:

- *top*: at module level (including under ``try``/``if``);
- *type-only*: under ``if TYPE_CHECKING:``;
- *deferred*: inside a function.

Rules:

1. No cycles in the graph of ALL edges, deferred and type-only ones included: a
   deferred import never hides a cycle, and a type-only one is no excuse for one (a
   narrow ``Protocol`` in the lower module is; see ``persist.maintenance.check.CheckedShard``).
2. Layers: ``upsert_core`` imports nothing from ``resources``, ``assets`` or
   ``orchestration``; ``resources`` nothing from ``assets`` or ``orchestration``;
   ``assets`` nothing from ``orchestration``; only ``orchestration.cli`` itself imports
   ``orchestration.cli`` (Dagster code never imports the CLI).
3. The storage locations (``upsert_core.persist.location``) know nothing of shards: they
   import no other ``upsert_core.persist`` module.
4. A deferred import exists only to keep something heavy off a start-up path (the CLI's
   ``--help``, a light module). It must either import only third-party packages in
   :data:`HEAVY`, or carry a ``# heavy: <what it defers>`` comment: on the statement's
   own lines, or in the comment directly above the run of deferred import statements
   it belongs to (consecutive statements, blank lines allowed). Anything else (a project
   module, the stdlib, a light package) is imported at the top of the module.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import upsert_core

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("upsert_core", "resources", "assets", "orchestration")
HEAVY = frozenset({
    "boto3", "botocore", "dagster", "numpy", "pandas", "pandera", "polars", "pyarrow",
    "pyspark", "sqlalchemy",
})
"""Third-party packages a function may import without a ``# heavy:`` marker."""
MARKER = "# heavy:"
LOCATION = "upsert_core.persist.location"


def _all_core_modules() -> list[str]:
    return sorted(
        m.name
        for m in pkgutil.walk_packages(upsert_core.__path__, prefix="upsert_core.")
    )


def test_core_has_modules() -> None:
    assert "upsert_core.errors" in _all_core_modules()


def test_core_imports_neither_dagster_nor_pyspark() -> None:
    modules = _all_core_modules()
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('dagster', 'pyspark'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "", f"upsert_core pulled in: {out.stdout.strip()}"


def test_core_errors_share_one_root() -> None:
    from upsert_core import errors

    roots = [
        obj
        for obj in vars(errors).values()
        if isinstance(obj, type) and issubclass(obj, Exception)
    ]
    assert roots, "no errors defined"
    assert all(issubclass(e, errors.UpsertPlatformError) for e in roots)


@dataclass(frozen=True)
class Imp:
    """One imported name: ``importer`` imports ``target`` (a dotted module name)."""

    importer: str
    target: str
    line: int
    kind: str  # "top", "type-only" or "deferred"
    marked: bool

    def where(self) -> str:
        return f"{self.importer}:{self.line} imports {self.target} ({self.kind})"


def _project_modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


MODULES = _project_modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join([*parts, *([node.module] if node.module else [])])
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


def _imports_of(module: str, path: Path) -> Iterator[Imp]:
    source = path.read_text()
    lines = source.splitlines()
    is_package = path.name == "__init__.py"

    def marked(node: ast.stmt, run_start: ast.stmt) -> bool:
        end = node.end_lineno or node.lineno
        own = lines[node.lineno - 1 : end]
        comment = []  # the comment lines directly above the run
        i = run_start.lineno - 2
        while i >= 0 and lines[i].strip().startswith("#"):
            comment.append(lines[i])
            i -= 1
        return any(MARKER in text for text in own + comment)

    def visit(body: Sequence[ast.stmt], kind: str) -> Iterator[Imp]:
        run_start: ast.stmt | None = None
        for stmt in body:
            if isinstance(stmt, ast.Import | ast.ImportFrom):
                run_start = run_start or stmt
                for target in _targets(stmt, module, is_package):
                    yield Imp(module, target, stmt.lineno, kind, marked(stmt, run_start))
                continue
            run_start = None
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                yield from visit(stmt.body, "deferred")
            elif isinstance(stmt, ast.If) and _is_type_checking(stmt.test) and kind == "top":
                yield from visit(stmt.body, "type-only")
                yield from visit(stmt.orelse, kind)
            else:
                for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                    for child in getattr(stmt, field, []):
                        if isinstance(child, ast.stmt):
                            yield from visit([child], kind)
                        else:  # an except handler or a match case
                            yield from visit(child.body, kind)

    yield from visit(ast.parse(source, str(path)).body, "top")


IMPORTS = [imp for module, path in MODULES.items() for imp in _imports_of(module, path)]


def _project_module(target: str) -> str | None:
    """The project module ``target`` names (``pkg.mod.attr`` -> ``pkg.mod``), or None."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {module: set() for module in MODULES}
    for imp in IMPORTS:
        target = _project_module(imp.target)
        while target:
            if target != imp.importer and not _in(imp.importer, target):
                graph[imp.importer].add(target)
            target = target.rpartition(".")[0]
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def _cycle_path(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One shortest cycle through ``component[0]``, as ``[a, b, ..., a]``."""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if w not in previous:
                    previous[w] = v
                    following.append(w)
        frontier = following
    return component


def test_graph_sees_the_project() -> None:
    assert "upsert_core.persist.location.urls" in MODULES
    assert "orchestration.cli.main" in MODULES
    graph = _graph()
    assert "upsert_core.persist.maintenance.check" in graph["upsert_core.persist.shard"]
    assert any(imp.kind == "type-only" for imp in IMPORTS)
    assert any(imp.kind == "deferred" and imp.marked for imp in IMPORTS)


def test_cycle_finder_reports_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycle_path(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def test_no_import_cycles() -> None:
    graph = _graph()
    cycles = [" -> ".join(_cycle_path(graph, c)) for c in _cycles(graph)]
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def _violations(importers: str, forbidden: Sequence[str]) -> list[str]:
    return [
        imp.where()
        for imp in IMPORTS
        if _in(imp.importer, importers)
        and (target := _project_module(imp.target)) is not None
        and any(_in(target, f) for f in forbidden)
    ]


def test_layers_point_down() -> None:
    bad = (
        _violations("upsert_core", ["resources", "assets", "orchestration"])
        + _violations("resources", ["assets", "orchestration"])
        + _violations("assets", ["orchestration"])
    )
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_dagster_code_never_imports_the_cli() -> None:
    bad = [
        imp.where()
        for imp in IMPORTS
        if not _in(imp.importer, "orchestration.cli")
        and _in(imp.target, "orchestration.cli")
    ]
    assert not bad, "\n".join(bad)


def test_locations_know_nothing_of_shards() -> None:
    bad = [
        imp.where()
        for imp in IMPORTS
        if _in(imp.importer, LOCATION)
        and _in(imp.target, "upsert_core.persist")
        and not _in(imp.target, LOCATION)
    ]
    assert not bad, "\n".join(bad)


def test_deferred_imports_only_defer_something_heavy() -> None:
    bad = [
        f"{imp.importer}:{imp.line} imports {imp.target}"
        for imp in IMPORTS
        if imp.kind == "deferred"
        and not imp.marked
        and (imp.target.split(".")[0] in PACKAGES or imp.target.split(".")[0] not in HEAVY)
    ]
    assert not bad, (
        f"in-function imports without a '{MARKER} ...' comment that are not of "
        f"{sorted(HEAVY)}; import them at the top of the module:\n" + "\n".join(dict.fromkeys(bad))
    )
