"""The Python package's layers (README, Layout), as tests/python/test_source_layers.py holds csrc/'s: every module of
python/speedtorch imports only from its own layer and the layers below it, never above (an import inside a function
counts too), and no modules import each other at import time (a circle). The package's own __init__.py is the top:
it gathers every layer's public names."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "speedtorch"

# Lowest first. A name stands for the module or the package of that name and everything in it.
LAYERS = [
    ["speedtorch._library"],  # loads the compiled library; PinnedEmbedding
    ["speedtorch._fake", "speedtorch._interrupt", "speedtorch._phases", "speedtorch._prefetch_thread", "speedtorch.ops",
     "speedtorch.counters", "speedtorch.ngram", "speedtorch.sparse_features", "speedtorch.contiguous",
     "speedtorch.jit_save", "speedtorch.pinned_embedding_api"],
    ["speedtorch.data"],
    ["speedtorch.serving"],
    ["speedtorch.nn"],
    ["speedtorch.optim"],
    ["speedtorch.pipeline", "speedtorch.compat"],
    ["speedtorch.models"],
    ["speedtorch.distributed"],
    ["speedtorch.cli", "speedtorch.__main__"],
    ["speedtorch", "speedtorch._moved"],
]


def layer_of(module: str, layers=LAYERS) -> int | None:
    """The layer of a module: that of the longest name in ``layers`` that is it or a package holding it."""
    best, rank = "", None
    for i, names in enumerate(layers):
        for name in names:
            holds = module == name or (name != "speedtorch" and module.startswith(name + "."))
            if holds and len(name) > len(best):
                best, rank = name, i
    return rank


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("speedtorch",) + path.relative_to(PACKAGE).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(module: str, source: str, known: set[str]) -> list[tuple[str, int, bool]]:
    """(imported module of the package, line, at import time) for each import in ``source``, the text of
    ``module``; ``from p import x`` imports p.x where that is a module in ``known``, else p."""
    package = module if f"{module}.__init__" in known else module.rpartition(".")[0]
    found = []

    def visit(node, lazy):
        for child in ast.iter_child_nodes(node):
            names = []
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                parts = package.split(".")
                base = ".".join(parts[:len(parts) + 1 - child.level] if child.level else [])
                base = ".".join(filter(None, (base, child.module)))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in child.names]
            found.extend((name, child.lineno, not lazy) for name in names if name.split(".")[0] == "speedtorch")
            visit(child, lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(source), False)
    return found


def _graph():
    modules = _modules()
    known = set(modules) | {f"{m}.__init__" for m, p in modules.items() if p.name == "__init__.py"}
    return modules, {m: imports(m, p.read_text(), known) for m, p in modules.items()}


def upward(graph: dict, layers=LAYERS) -> list[str]:
    """The imports that run up: from a module to one of a higher layer."""
    return [f"{source} (layer {layer_of(source, layers)}) imports {target} (layer {layer_of(target, layers)}) at line "
            f"{line}" for source, edges in graph.items() for target, line, _ in edges
            if layer_of(target, layers) > layer_of(source, layers)]


def circle(graph: dict) -> list[str]:
    """A circle of imports run at import time (each module imports the next), or [] where there is none."""
    edges = {m: sorted({t for t, _, eager in e if eager and t != m}) for m, e in graph.items()}
    state, path = {}, []

    def walk(m):
        state[m] = "open"
        path.append(m)
        for t in edges.get(m, ()):
            if state.get(t) == "open":
                return path[path.index(t):] + [t]
            if t not in state and (found := walk(t)):
                return found
        state[m] = "done"
        path.pop()
        return []

    for m in sorted(edges):
        if m not in state and (found := walk(m)):
            return found
    return []


def test_every_module_has_a_layer():
    missing = [m for m in _modules() if layer_of(m) is None]
    assert not missing, f"a new module needs its place in LAYERS (and the README's Layout): {missing}"


def test_no_import_runs_up():
    wrong = upward(_graph()[1])
    assert not wrong, "imports that run up:\n" + "\n".join(wrong)


def test_no_import_circle():
    found = circle(_graph()[1])
    assert not found, "modules that import each other at import time: " + " -> ".join(found)


def test_the_graph_sees_relative_and_lazy_imports():
    graph = _graph()[1]
    assert any(t == "speedtorch.nn.embedding" and eager for t, _, eager in graph["speedtorch.nn.collection"])
    lazy = [t for t, _, eager in graph["speedtorch.nn.ngram_embedding"] if not eager]
    assert "speedtorch.serving.quantized" in lazy
    assert any(t == "speedtorch._library" for t, _, _ in graph["speedtorch.distributed.sharded_table"])


def test_the_checks_catch_an_upward_import_and_a_circle():
    """On a made-up package: the old speedtorch.nn (HostEmbedding, importing the collection that imports it back) and
    an op that imports the nn layer."""
    known = {"speedtorch.nn", "speedtorch.nn.__init__", "speedtorch.nn.embedding", "speedtorch.nn.collection",
             "speedtorch.ops"}
    graph = {
        "speedtorch.ops": imports("speedtorch.ops", "def f():\n    from .nn import HostEmbedding\n", known),
        "speedtorch.nn.embedding": imports("speedtorch.nn.embedding",
                                           "from ..ops import gather\nfrom .collection import Collection\n", known),
        "speedtorch.nn.collection": imports("speedtorch.nn.collection", "from . import embedding\n", known),
    }
    assert upward(graph) == ["speedtorch.ops (layer 1) imports speedtorch.nn (layer 4) at line 2"]
    assert circle(graph) == ["speedtorch.nn.collection", "speedtorch.nn.embedding", "speedtorch.nn.collection"]
    graph["speedtorch.nn.collection"] = imports("speedtorch.nn.collection", "def g():\n    from . import embedding\n",
                                                known)
    assert circle(graph) == []  # an import inside a function runs later: no circle
