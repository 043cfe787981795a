"""The project's layout rules, read from the source alone (pure AST, well under a second): no import circle between
the project's modules, and no module over 450 lines (split by concept, not by count)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("algos", "benchmarks", "cluster", "envs", "experiments", "tests")
MAX_LINES = 450
# Files (or folders, ending in "/") another helper is splitting right now (issue 49); this list is emptied when that
# work lands. Each is named, so nothing else can slip past either rule.
BEING_SPLIT: tuple[str, ...] = ()  # files another change is splitting right now: empty when none is


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under the project's packages (a package is its ``__init__``)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in its file (top level, in functions, under TYPE_CHECKING):
    each counts, since a circle deferred into a function is still two modules that need each other."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # ``from pkg import name``: the submodule pkg.name where there is one, else pkg itself
            candidates = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in modules:  # a name outside the project resolves to nothing
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                found.add(candidate)
    return found


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative): each is one import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        circles.append(sorted(component))
    return circles


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _being_split(path: Path) -> bool:
    rel = _relative(path)
    return any(rel == entry or (entry.endswith("/") and rel.startswith(entry)) for entry in BEING_SPLIT)


def test_the_circle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_circles(graph) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []


def test_relative_imports_resolve_to_project_modules(tmp_path):
    (tmp_path / "algos" / "pkg").mkdir(parents=True)
    (tmp_path / "algos" / "__init__.py").write_text("")
    (tmp_path / "algos" / "pkg" / "__init__.py").write_text("from .one import x\n")
    (tmp_path / "algos" / "pkg" / "one.py").write_text("def f():\n    from . import two\n")
    (tmp_path / "algos" / "pkg" / "two.py").write_text("from algos.pkg.one import f\n")
    modules = project_modules(tmp_path)
    graph = {name: imported_modules(name, path, modules) for name, path in modules.items()}
    assert graph["algos.pkg"] == {"algos.pkg.one"} and "algos.pkg.two" in graph["algos.pkg.one"]
    assert import_circles(graph) == [["algos.pkg.one", "algos.pkg.two"]]


def test_the_project_has_no_import_circle():
    modules = project_modules()
    exempt = {name for name, path in modules.items() if _being_split(path)}
    graph = {name: imported_modules(name, path, modules) - exempt
             for name, path in modules.items() if name not in exempt}
    circles = import_circles(graph)
    assert not circles, "import circles (each: the modules that import one another): " + "; ".join(
        " <-> ".join(circle) for circle in circles)


def test_no_module_is_over_450_lines():
    too_long = {}
    for path in project_modules().values():
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES and not _being_split(path):
            too_long[_relative(path)] = lines
    assert not too_long, f"modules over {MAX_LINES} lines (split them by concept): {too_long}"
