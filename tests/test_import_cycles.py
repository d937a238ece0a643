"""No import cycles among foretell's modules, function-local imports included.

The check reads the source (ast), so it sees every import statement wherever it sits: at module level, inside a
function, inside try/except. Only imports under `if TYPE_CHECKING:` are left out: they never run, they name
types for annotations. An edge goes from a module to the module it names: `import a.b`, `from a.b import c`
(to a.b.c when that is a module, as in `from pkg import submodule`, else to a.b), relative imports resolved
against the importing module's package. Importing a.b also runs a/__init__.py, but that implicit edge is left
out: a package's __init__ re-exporting its modules would otherwise put every module in one circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Every module of `package` under `root` (the folder holding the package), by dotted name."""
    names = {}
    for path in sorted((root / package.replace(".", "/")).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST):
    """Import and ImportFrom nodes anywhere in the tree, but not under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _nearest_module(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """module -> the package's modules it imports (edges to itself left out)."""
    modules = module_names(root, package)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        targets = set()
        for node in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            if node.level:
                base = name.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[:len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            for alias in node.names:
                full = f"{stem}.{alias.name}"
                targets.add(full if full in modules else stem)
        edges = {_nearest_module(t, modules) for t in targets if t == package or t.startswith(package + ".")}
        graph[name] = {t for t in edges if t is not None and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
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
            visit(v)
    return sorted(found)


def _describe(component: list[str], graph: dict[str, set[str]]) -> str:
    inside = set(component)
    lines = [f"  {m} -> {', '.join(sorted(graph[m] & inside))}" for m in component]
    return "cycle among " + ", ".join(component) + ":\n" + "\n".join(lines)


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_planted_cycle_is_caught(tmp_path):
    # pkg.a -> pkg.sub.b (relative, function-local) -> pkg.c (`from pkg import c`) -> pkg.a (absolute).
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "def f():\n    from .sub.b import g\n    return g\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/b.py": "from pkg import c\n",
        "pkg/c.py": "try:\n    import pkg.a\nexcept ImportError:\n    pass\n",
        "pkg/d.py": "from pkg.a import f\nimport os\n",  # imports into the cycle, not part of it
    })
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.sub.b"] == {"pkg.c"}
    assert cycles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]


def test_relative_imports_from_a_package_init_and_type_checking(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/sub/__init__.py": "from . import x\nfrom ..y import z\n",
        "pkg/sub/x.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub import w\n",
        "pkg/sub/w.py": "",
        "pkg/y.py": "import pkg.sub.x\n",
    })
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.sub"] == {"pkg.sub.x", "pkg.y"}
    assert graph["pkg.sub.x"] == set()  # type-only imports never run
    assert cycles(graph) == []
    _write(tmp_path, {"pkg/sub/x.py": "import pkg.sub\n"})
    assert cycles(import_graph(tmp_path, "pkg")) == [["pkg.sub", "pkg.sub.x", "pkg.y"]]


def test_foretell_has_no_import_cycles():
    graph = import_graph(SRC, "foretell")
    assert "foretell.engine" in graph and "foretell.models.transformer" in graph
    found = cycles(graph)
    assert not found, "\n".join(_describe(c, graph) for c in found)
