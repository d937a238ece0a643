"""foretell's rooms import one way: models, then runtime, then drafters, then sizing, then decoding and the engine,
then the composition root (build.py), then the api and the tools above it (bench, train, serve, cli).

A room is a folder of src/foretell (models/, runtime/, ...) or a module at its top (engine.py, ...). Every import
statement counts, those inside functions too (test_import_cycles.import_graph reads them all; only imports under
`if TYPE_CHECKING:` are left out: they never run). An import may reach its own layer or one below; two rooms never
import each other.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from test_import_cycles import SRC, _write, import_graph

# Lowest first. The first layer is what everything may use: errors, the shared types and configuration, the
# verification rule, the token tree, the caches' data structures, the kernels' loader.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("base", frozenset({
        "errors", "paths", "files", "types", "tree", "config", "text", "corpus", "conversations", "kv_cache",
        "sampling", "coupled", "verify", "lossy", "logits_process", "grammar", "kernels", "prefix_cache",
        "hot_vocab", "layer_rows",
    })),
    ("models", frozenset({"models"})),
    ("runtime", frozenset({"runtime"})),
    ("drafters", frozenset({"drafters"})),
    ("sizing", frozenset({"sizing"})),
    ("decoding", frozenset({"decoding", "engine", "batching", "result_cache"})),
    ("build", frozenset({"build"})),
    ("api", frozenset({"api", "spec_args", "export"})),
    ("bench", frozenset({"bench"})),
    ("train", frozenset({"train"})),
    ("serve", frozenset({"serve"})),
    ("cli", frozenset({"cli"})),
    ("package", frozenset({""})),  # foretell/__init__.py: the public names
)


def room_of(module: str, package: str) -> str:
    """foretell.models.config -> models; foretell.engine -> engine; foretell -> ''."""
    return module.removeprefix(package).lstrip(".").split(".")[0]


def layer_index(layers) -> dict[str, int]:
    return {room: i for i, (_, rooms) in enumerate(layers) for room in rooms}


def violations(graph: dict[str, set[str]], package: str, layers) -> tuple[list[str], list[str], set[str]]:
    """(imports that reach up a layer, pairs of rooms that import each other, rooms no layer names)."""
    index = layer_index(layers)
    upward, between = [], defaultdict(set)
    unplaced = set()
    for module, targets in sorted(graph.items()):
        source = room_of(module, package)
        for target in sorted(targets):
            room = room_of(target, package)
            if room == source:
                continue
            if source not in index or room not in index:
                unplaced |= {r for r in (source, room) if r not in index}
                continue
            between[source].add(room)
            if index[room] > index[source]:
                upward.append(f"{module} ({layers[index[source]][0]}) -> {target} ({layers[index[room]][0]})")
    both_ways = sorted(f"{a} <-> {b}" for a in between for b in between[a] if a < b and a in between.get(b, ()))
    return upward, both_ways, unplaced


def test_a_planted_upward_import_and_a_two_way_pair_are_caught(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low/__init__.py": "",
        "pkg/low/a.py": "def f():\n    from pkg.high import b\n",  # inside a function: still counted
        "pkg/high/__init__.py": "",
        "pkg/high/b.py": "from pkg.low import a\n",
        "pkg/mid.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.high import b\n",
    })
    layers = (("low", frozenset({"low"})), ("mid", frozenset({"mid"})), ("high", frozenset({"high"})),
              ("package", frozenset({""})))
    upward, both_ways, unplaced = violations(import_graph(tmp_path, "pkg"), "pkg", layers)
    assert upward == ["pkg.low.a (low) -> pkg.high.b (high)"]  # the type-only import of mid is no edge
    assert both_ways == ["high <-> low"] and not unplaced


def test_foretells_rooms_import_one_way():
    graph = import_graph(SRC, "foretell")
    assert "foretell.build" in graph and "foretell.sizing.chooser" in graph
    rooms = {room_of(m, "foretell") for m in graph}
    upward, both_ways, unplaced = violations(graph, "foretell", LAYERS)
    assert not unplaced and rooms <= set(layer_index(LAYERS)), f"rooms no layer names: {unplaced or rooms}"
    assert not upward, "imports that reach up a layer:\n" + "\n".join(upward)
    assert not both_ways, "rooms that import each other: " + ", ".join(both_ways)


def _function_imports(tree: ast.AST):
    """(import node, inside a try that handles ImportError) for every import inside a function."""
    def handles_import_error(node: ast.Try) -> bool:
        names = set()
        for handler in node.handlers:
            types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
            names |= {t.id for t in types if isinstance(t, ast.Name)}
        return bool(names & {"ImportError", "ModuleNotFoundError"})

    def visit(node, in_function: bool, guarded: bool):
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, guarded
            yield from visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)),
                             guarded or (isinstance(child, ast.Try) and handles_import_error(child)))

    yield from visit(tree, False, False)


def unexplained_function_imports(path: Path) -> list[str]:
    """Imports inside functions that neither sit in a try handling ImportError (an optional dependency) nor follow a
    comment naming their reason ("# optional: ..." or "# start-up: ...") above their group of imports."""
    lines = path.read_text().split("\n")
    found = []
    for node, guarded in _function_imports(ast.parse("\n".join(lines))):
        if guarded:
            continue
        above = node.lineno - 2
        group = ("import ", "from ", "matplotlib.use(")
        while above >= 0 and (not lines[above].strip() or lines[above].strip().startswith(group)):
            above -= 1
        reason = lines[above].strip() if above >= 0 else ""
        if not reason.startswith(("# optional", "# start-up")):
            found.append(f"{path}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return found


def test_a_function_import_without_its_reason_is_caught(tmp_path):
    _write(tmp_path, {"m.py": (
        "def a():\n    # start-up: heavy\n    import json\n    import os\n"
        "def b():\n    try:\n        import yaml\n    except ImportError:\n        yaml = None\n"
        "def c():\n    x = 1\n    from pkg import d\n")})
    assert unexplained_function_imports(tmp_path / "m.py") == [f"{tmp_path / 'm.py'}:12: from pkg import d"]


def test_imports_inside_functions_are_for_optional_dependencies_or_start_up_only():
    found = [line for path in sorted((SRC / "foretell").rglob("*.py")) for line in unexplained_function_imports(path)]
    assert not found, "imports inside functions without a reason (# optional: / # start-up:):\n" + "\n".join(found)
