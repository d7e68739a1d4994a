"""Every import inside iclab points down the layers of docs/architecture.md (DESIGN.md):

    core | plotting  <  tasks  <  models | algorithms  <  constructions  <  theory  <  training
      <  experiments  <  reporting  <  cli

A module may import its own layer and any layer below; siblings (models and algorithms, core and plotting)
never import each other. Read from the source with ``ast``, so lazy imports inside functions count too.

Within a layer no two modules import each other, directly or round a longer loop, not even under
``TYPE_CHECKING`` or inside a function: a loop hides which module is the lower one and only works by import order.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import iclab

ROOT = Path(iclab.__file__).parent

#: layer -> rank; siblings share a rank and may not import each other.
RANK = {
    "core": 0,
    "plotting": 0,
    "tasks": 1,
    "models": 2,
    "algorithms": 2,
    "constructions": 3,
    "theory": 4,
    "training": 5,
    "experiments": 6,
    "reporting": 7,
    "cli": 8,
    "__main__": 9,  # `python -m iclab`: runs the cli
    "bench": 7,  # the `iclab bench` verb: runs experiments, is run by the cli
    "roofline": 7.5,  # `iclab bench --roofline`: uses bench, is run by the cli
}


def layer_of(module: str) -> str | None:
    """'iclab.models.bilinear' -> 'models'; 'iclab' (the package façade) -> None."""
    parts = module.split(".")
    if parts[0] != "iclab" or len(parts) == 1:
        return None
    return parts[1]


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every iclab import in ``path``, relative imports resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = _module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("iclab")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("iclab"):
                continue
            if mod == "iclab":  # `from iclab import models`: the names are sub-packages
                found += [(node.lineno, f"iclab.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, mod))
    return found


def violations() -> list[str]:
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        src = layer_of(_module_name(path))
        if src is None:
            continue
        assert src in RANK, f"{path}: layer {src!r} is not in the layer map; add it to RANK and docs/architecture.md"
        for line, mod in imports(path):
            dst = layer_of(mod)
            if dst is None or dst == src:
                continue
            if dst not in RANK:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {mod} (unknown layer {dst!r})")
            elif RANK[dst] >= RANK[src]:
                kind = "sideways" if RANK[dst] == RANK[src] else "up"
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {mod}: {src} -> {dst} points {kind}")
    return bad


def test_every_import_points_down() -> None:
    assert violations() == []


def test_the_checker_catches_an_upward_and_a_sideways_import(tmp_path, monkeypatch) -> None:
    pkg = tmp_path / "iclab"
    (pkg / "models").mkdir(parents=True)
    (pkg / "core").mkdir()
    (pkg / "models" / "m.py").write_text("from iclab.algorithms.x import y\n")
    (pkg / "core" / "c.py").write_text("def f():\n    from ..training import train\n")
    (pkg / "core" / "ok.py").write_text("from iclab.core.errors import ConfigError\nimport torch\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", pkg)
    found = violations()
    assert len(found) == 2
    assert any("models -> algorithms points sideways" in v for v in found)
    assert any("core -> training points up" in v for v in found)


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {module it imports: first line}, over every module of the tree and every import in it (module level,
    under ``TYPE_CHECKING``, inside functions). ``from pkg import sub`` points at the submodule ``pkg.sub``; a name
    from a module outside the tree is dropped. ``import pkg`` of the importer's own parent package is not an edge:
    Python imports a module's parent packages before the module, so it binds what is already there; ``from pkg import
    name`` of a parent reads what the parent's ``__init__`` must already have run, and counts."""
    paths = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}
    graph: dict[str, dict[str, int]] = {}
    for module, path in paths.items():
        edges = graph.setdefault(module, {})
        here = module.split(".")
        package = here if path.name == "__init__.py" else here[:-1]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names if not module.startswith(a.name + ".")]
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                mod = ".".join(base + ([node.module] if node.module else []))
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in paths else mod for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in paths:  # `import iclab.a.b.name` -> iclab.a.b
                    target = target.rpartition(".")[0]
                if target and target != module:
                    edges.setdefault(target, node.lineno)
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = [stack.pop()]
            while component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    """'a:12 -> b, b:40 -> a': the imports that close the loop, with the importer's line."""
    return ", ".join(f"{a}:{graph[a][b]} -> {b}" for a in cycle for b in cycle if b in graph[a])


def test_no_import_cycles() -> None:
    graph = import_graph()
    assert [describe(c, graph) for c in import_cycles(graph)] == []


def test_the_cycle_checker_sees_lazy_and_type_checking_imports(tmp_path, monkeypatch) -> None:
    pkg = tmp_path / "iclab"
    (pkg / "training").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "training" / "__init__.py").write_text("from iclab.training.a import A\n")
    (pkg / "training" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from iclab.training.b import B\nclass A: ...\n"
    )
    (pkg / "training" / "b.py").write_text("def f():\n    from .c import g\n")
    (pkg / "training" / "c.py").write_text("def g():\n    from iclab.training import a\n\nimport iclab.training\n")
    (pkg / "training" / "d.py").write_text("from iclab.training import A\n")  # reads the package's name: an edge
    monkeypatch.setattr(__import__(__name__), "ROOT", pkg)
    graph = import_graph()
    assert "iclab.training" not in graph["iclab.training.c"]  # `import` of its own package: no edge
    assert graph["iclab.training.d"] == {"iclab.training": 1}
    assert import_cycles(graph) == [["iclab.training.a", "iclab.training.b", "iclab.training.c"]]
    assert describe(import_cycles(graph)[0], graph) == (
        "iclab.training.a:3 -> iclab.training.b, iclab.training.b:2 -> iclab.training.c, "
        "iclab.training.c:2 -> iclab.training.a"
    )
    (pkg / "training" / "a.py").write_text("from iclab.training import d\n")  # d -> package -> a -> d
    assert import_cycles(import_graph()) == [["iclab.training", "iclab.training.a", "iclab.training.d"]]


@pytest.mark.parametrize("module", ["iclab.models.bilinear", "iclab.cli", "iclab"])
def test_layer_names(module: str) -> None:
    assert layer_of(module) == {"iclab.models.bilinear": "models", "iclab.cli": "cli", "iclab": None}[module]
